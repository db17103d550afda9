"""What a translation looks like on the way out: the text lines of ``translate`` (plain or Moses
n-best) and the attention records of ``translate --attention`` (``SentenceAttention``: one
sentence's teacher-forced encoder-decoder attention and its word alignments, JSON or Marian's
``--alignment`` layout). Engine-independent: numpy only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from transformer_nmt.errors import ConfigError

EOS_PIECE = "</s>"  # the row/column of the EOS symbol in attention matrices
WORD_START = "\u2581"  # SentencePiece's "▁": the piece begins a whitespace-separated word


def word_index(pieces: Sequence[str]) -> list[int]:
    """The word each SentencePiece piece belongs to (0-based): a piece starting with "▁"
    begins a new word, any other piece continues the current one (the first piece is word 0
    whatever it starts with). These are the whitespace-separated words of the detokenised
    text (of the source after SentencePiece's normalisation, which collapses whitespace)."""
    words, current = [], -1
    for piece in pieces:
        if piece.startswith(WORD_START) or current < 0:
            current += 1
        words.append(current)
    return words


@dataclass(frozen=True)
class SentenceAttention:
    """One sentence's translation and its encoder-decoder attention (teacher forced).

    ``src_tokens``/``tgt_tokens``: SentencePiece pieces, each ending with ``</s>`` (empty for an
    empty input line); ``weights`` [h, T, S] float32: per head of the chosen decoder layer, row
    t = target token t, column s = source token s; each row sums to 1.
    """

    source: str
    translation: str
    src_tokens: list[str]
    tgt_tokens: list[str]
    weights: np.ndarray  # [h, T, S]

    @property
    def averaged(self) -> np.ndarray:
        """The head average [T, S] (what ``Transformer.decode`` returns by default)."""
        return self.weights.mean(axis=0) if self.weights.size else np.zeros((0, 0), np.float32)

    def alignment(self) -> list[tuple[int, int]]:
        """Hard word alignments (source word i, target word j), sorted: each target subword is
        aligned to the source subword it attends to most (head average, argmax; the EOS row and
        column left out), and two words are aligned when any of their subwords are (as
        awesome-align turns subword alignments into word alignments)."""
        n_tgt, n_src = len(self.tgt_tokens) - 1, len(self.src_tokens) - 1  # without EOS
        if n_tgt < 1 or n_src < 1:
            return []
        best = self.averaged[:n_tgt, :n_src].argmax(axis=1)  # [T-1] source subword per target
        src_words = word_index(self.src_tokens[:n_src])
        tgt_words = word_index(self.tgt_tokens[:n_tgt])
        return sorted({(src_words[s], tgt_words[t]) for t, s in enumerate(best.tolist())})

    def pharaoh(self) -> str:
        """``alignment()`` in Pharaoh format: ``i-j`` pairs separated by spaces (0-based,
        source first), as fast_align and awesome-align write them."""
        return " ".join(f"{i}-{j}" for i, j in self.alignment())

    def to_json(self, decimals: int = 4) -> str:
        """One JSON line: source, translation, the tokens, the head-averaged ``attention``
        matrix (rounded, rows = ``tgt_tokens``) and the Pharaoh ``alignment``."""
        record = {
            "source": self.source,
            "translation": self.translation,
            "src_tokens": self.src_tokens,
            "tgt_tokens": self.tgt_tokens,
            "attention": np.round(self.averaged.astype(np.float64), decimals).tolist(),
            "alignment": self.pharaoh(),
        }
        return json.dumps(record, ensure_ascii=False)


def format_output(
    results: Iterable[list[tuple[str, float]]], nbest: int, start: int = 0
) -> Iterator[str]:
    """One line per sentence; with n-best, Moses format ``i ||| text ||| score`` (``i`` counts
    from ``start``). A newline the model decoded (a byte-fallback piece) becomes a space, so
    output line i is always the translation of input line i."""
    for i, hyps in enumerate(results, start=start):
        if nbest == 1:
            yield hyps[0][0].replace("\n", " ")
        else:
            for text, score in hyps:
                yield f"{i} ||| {text.replace(chr(10), ' ')} ||| {score:.6f}"


ATTENTION_FORMATS = ("json", "alignment")


def format_attention(results: Iterable[SentenceAttention], kind: str) -> Iterator[str]:
    """One line per sentence: ``json``: ``SentenceAttention.to_json()``; ``alignment``:
    ``translation ||| i-j ...`` (Marian's ``--alignment`` layout: the translation, then the
    Pharaoh word alignments)."""
    if kind not in ATTENTION_FORMATS:
        raise ConfigError(f"attention format must be one of {list(ATTENTION_FORMATS)}: {kind!r}")
    for record in results:
        if kind == "json":
            yield record.to_json()
        else:
            yield f"{record.translation.replace(chr(10), ' ')} ||| {record.pharaoh()}"
