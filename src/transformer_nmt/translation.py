"""Translating text with a trained model: SentencePiece in, §6.1 beam search, SentencePiece out.

Sentences are batched by tokens (sorted by length so that a batch holds similar lengths and
little padding, each batch at most ``max_tokens`` source tokens counting padding), searched with
``search.beam_search`` and returned in input order. Empty input lines give empty output lines
without running the model.

``Translator.translate_with_attention`` also returns, per sentence, the encoder-decoder attention
of the best hypothesis, recomputed by teacher forcing (the model fed BOS + the hypothesis):
one row per target subword (EOS included), one column per source subword (EOS included), one
matrix per head of the chosen decoder layer. ``SentenceAttention.alignment`` turns the head
average into hard word alignments in Pharaoh ``i-j`` format (docs/interfaces.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from transformer_nmt.checkpoints import experiment_mismatch, load_model_file
from transformer_nmt.data.batch import flatten, pad_flat, source_batch
from transformer_nmt.data.vocab import BOS_ID, EOS_ID, PAD_ID, load_vocab_info
from transformer_nmt.errors import CheckpointError, ConfigError
from transformer_nmt.io_utils import sha256_file
from transformer_nmt.search import Hypothesis, SearchSettings, beam_search

log = logging.getLogger(__name__)

# The files of a pipeline experiment's run directory (results/runs/<experiment>/) that
# ``Translator.from_run`` reads. SUMMARY_FILE is training.run.SUMMARY_FILE, not imported from
# there because that module pulls in Lightning (tests/test_translation.py checks they agree).
AVERAGED_MODEL = "averaged.pt"
SUMMARY_FILE = "train_summary.json"

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


def token_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group sentence indices into batches of similar length with at most ``max_tokens`` tokens.

    A batch of n sentences whose longest has L tokens costs n * (L + 1) (the encoder input is
    ``x EOS``, padded to the longest). Sorting by length (longest first, stable) keeps padding
    small. A sentence longer than ``max_tokens`` gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        width = max(longest, lengths[i] + 1)
        if current and (len(current) + 1) * width > max_tokens:
            batches.append(current)
            current, width = [], lengths[i] + 1
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches


class Translator:
    """A model file and its SentencePiece model, ready to translate lines of text."""

    def __init__(
        self,
        model_path: str | Path,
        spm_model_path: str | Path,
        settings: SearchSettings,
        device: str = "auto",
        quantize: str | None = None,
    ) -> None:
        import sentencepiece as spm

        self.settings = settings
        if quantize is not None and device == "auto":
            device = "cpu"  # int8 dynamic quantisation is a CPU path
        self.device = torch.device(_resolve_device(device))
        self.model, self.meta = load_model_file(model_path)
        self.quantize = quantize
        if quantize is not None:
            self.model = quantize_model(self.model, quantize, self.device)
        vocab = load_vocab_info(spm_model_path)
        mismatch = experiment_mismatch(self.meta, model_config=None, vocab_sha256=vocab.sha256)
        if mismatch:
            # A model decoded with another vocabulary produces fluent-looking garbage.
            raise CheckpointError(f"{model_path}: trained with {mismatch} ({spm_model_path})")
        self.model.to(self.device)
        self.sp = spm.SentencePieceProcessor(model_file=str(spm_model_path))
        self.model_path, self.spm_model_path = Path(model_path), Path(spm_model_path)
        config = self.meta["model_config"]
        # Learned positions (Table 3 row E) cover max_positions; sinusoids cover any length.
        self.max_src_tokens: int | None = None
        if config.get("positional") == "learned":
            self.max_src_tokens = int(config["max_positions"]) - settings.max_len_b - 2
            if self.max_src_tokens < 1:
                raise ConfigError(
                    f"--max-len-b {settings.max_len_b} leaves no room for the source within "
                    f"the model's max_positions={config['max_positions']}"
                )
        self.truncated = 0

    @classmethod
    def from_run(
        cls,
        run_dir: str | Path,
        settings: SearchSettings | None = None,
        device: str = "auto",
        spm_model: str | Path | None = None,
    ) -> Translator:
        """The translator of a trained pipeline experiment ``results/runs/<experiment>``.

        Reads ``<run_dir>/averaged.pt`` and the pair's SentencePiece model: ``spm_model`` when
        given, else the ``results/spm/<dataset>/<pair>/spm.model`` beside the run directory
        whose sha256 is the vocabulary recorded in ``<run_dir>/train_summary.json``. Search
        settings default to the paper's (``SearchSettings()``: beam 4, α 0.6, +50).
        """
        run_dir = Path(run_dir)
        model = run_dir / AVERAGED_MODEL
        if not model.is_file():
            raise CheckpointError(
                f"{model}: not found (train and average the experiment first, e.g. "
                f"snakemake {model})"
            )
        spm_path = Path(spm_model) if spm_model is not None else find_spm_model(run_dir)
        return cls(model, spm_path, settings if settings is not None else SearchSettings(), device)

    def encode(self, line: str) -> np.ndarray:
        ids = self.sp.encode(line, out_type=int)
        if self.max_src_tokens is not None and len(ids) > self.max_src_tokens:
            self.truncated += 1
            ids = ids[: self.max_src_tokens]
        return np.asarray(ids, dtype=np.int64)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.sp.decode(list(tokens))

    @torch.inference_mode()
    def search(self, sources: Sequence[np.ndarray]) -> list[list[Hypothesis]]:
        """Beam search one batch of encoded sentences (in the given order)."""
        src = source_batch(sources).to(self.device)  # [B, S] = x EOS, padded
        s = self.settings
        return beam_search(
            self.model, src, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID, beam_size=s.beam,
            alpha=s.alpha, max_len_b=s.max_len_b, nbest=s.nbest, early_stop=s.early_stop,
        )  # fmt: skip

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """SentencePiece pieces of ``ids`` followed by ``</s>`` (the EOS the model sees)."""
        return [self.sp.id_to_piece(int(i)) for i in ids] + [EOS_PIECE]

    @torch.inference_mode()
    def cross_attention(
        self,
        sources: Sequence[np.ndarray],
        targets: Sequence[Sequence[int]],
        layer: int = -1,
    ) -> list[np.ndarray]:
        """Teacher-forced encoder-decoder attention of decoder ``layer`` (default the last) for
        (source, target) token sequences (no BOS/EOS): per pair [h, len(target) + 1,
        len(source) + 1] float32 (rows: target tokens then EOS; columns: source tokens then
        EOS)."""
        src = source_batch(sources).to(self.device)  # [B, S] = x EOS, padded
        tgt = [np.asarray(t, dtype=np.int64) for t in targets]
        tgt_in = torch.from_numpy(pad_flat(*flatten(tgt), prefix=BOS_ID)).to(self.device)
        _, weights = self.model.decode(
            tgt_in, self.model.encode(src), return_attention=True, attention_layer=layer,
            average_heads=False,
        )  # fmt: skip
        weights = weights.float().cpu().numpy()  # [B, h, T, S]
        return [
            weights[b, :, : len(t) + 1, : len(s) + 1]
            for b, (s, t) in enumerate(zip(sources, tgt, strict=True))
        ]

    def translate_with_attention(
        self,
        lines: Sequence[str],
        layer: int = -1,
        progress: Callable[[int], None] | None = None,
    ) -> list[SentenceAttention]:
        """Translate ``lines`` (best hypothesis) and return each with the cross-attention of
        decoder ``layer`` per head (``SentenceAttention``), in input order."""
        encoded = [self.encode(line) if line.strip() else None for line in lines]
        empty = np.zeros((self.model.cfg.h, 0, 0), dtype=np.float32)
        results = [SentenceAttention(line, "", [], [], empty) for line in lines]
        todo = [i for i, ids in enumerate(encoded) if ids is not None]
        lengths = [len(encoded[i]) for i in todo]
        for batch in token_batches(lengths, self.settings.max_tokens):
            indices = [todo[j] for j in batch]
            sources = [encoded[i] for i in indices]
            best = [nbest[0] for nbest in self.search(sources)]
            weights = self.cross_attention(sources, [h.tokens for h in best], layer)
            for i, hyp, w in zip(indices, best, weights, strict=True):
                results[i] = SentenceAttention(
                    source=lines[i],
                    translation=self.decode(hyp.tokens),
                    src_tokens=self.pieces(encoded[i]),
                    tgt_tokens=self.pieces(hyp.tokens),
                    weights=w,
                )
            if progress is not None:
                progress(len(indices))
        if progress is not None and len(todo) < len(lines):
            progress(len(lines) - len(todo))
        return results

    def translate(self, lines: Sequence[str]) -> list[str]:
        """Translate ``lines``: one translation per line (the best hypothesis), in order."""
        return [nbest[0][0] for nbest in self.translate_nbest(lines)]

    def translate_nbest(
        self, lines: Sequence[str], progress: Callable[[int], None] | None = None
    ) -> list[list[tuple[str, float]]]:
        """Translate ``lines``; returns per line its n-best (text, score), best first.

        ``progress(n)`` is called after each batch with the number of sentences it held.
        """
        encoded = [self.encode(line) if line.strip() else None for line in lines]
        results: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in lines]
        todo = [i for i, ids in enumerate(encoded) if ids is not None]
        lengths = [len(encoded[i]) for i in todo]
        for batch in token_batches(lengths, self.settings.max_tokens):
            indices = [todo[j] for j in batch]
            hyps = self.search([encoded[i] for i in indices])
            for i, nbest in zip(indices, hyps, strict=True):
                results[i] = [(self.decode(h.tokens), float(h.score)) for h in nbest]
            if progress is not None:
                progress(len(indices))
        if progress is not None and len(todo) < len(lines):
            progress(len(lines) - len(todo))
        return results


def find_spm_model(run_dir: str | Path) -> Path:
    """The SentencePiece model a run in ``<results>/runs/<experiment>`` was trained with: the
    ``<results>/spm/*/*/spm.model`` whose sha256 is the run summary's vocabulary sha256 (the
    only one there when the run has no summary yet)."""
    run_dir = Path(run_dir)
    results = run_dir.resolve().parent.parent
    pattern = f"{results}/spm/*/*/spm.model"
    candidates = sorted(results.glob("spm/*/*/spm.model"))
    summary_path = run_dir / SUMMARY_FILE
    expected: str | None = None
    if summary_path.is_file():
        try:
            expected = str(json.loads(summary_path.read_text(encoding="utf-8"))["vocab"]["sha256"])
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{summary_path}: no vocab.sha256 ({err!r})") from err
    elif len(candidates) == 1:
        return candidates[0]
    else:
        raise CheckpointError(
            f"{summary_path}: not found, and {len(candidates)} SentencePiece models match "
            f"{pattern}: pass the run's spm_model explicitly"
        )
    for candidate in candidates:
        if sha256_file(candidate) == expected:
            return candidate
    raise CheckpointError(
        f"{summary_path}: no SentencePiece model matching {pattern} has the run's vocabulary "
        f"(sha256 {expected[:12]}…): pass spm_model explicitly"
    )


QUANTIZE = ("int8",)


def quantize_model(model: torch.nn.Module, quantize: str, device: torch.device) -> torch.nn.Module:
    """CPU decoding speed flag (``translate --quantize int8``): int8 dynamic quantisation of
    every ``nn.Linear`` (weights int8 per tensor, activations quantised on the fly; PyTorch's
    ``quantize_dynamic``). The tied embedding / pre-softmax matrix stays fp32. Not the paper:
    translations change slightly (benchmarks/bench_quantize.py measures the BLEU change)."""
    if quantize not in QUANTIZE:
        raise ConfigError(f"--quantize must be one of {list(QUANTIZE)}, got {quantize!r}")
    if device.type != "cpu":
        raise ConfigError(f"--quantize {quantize} is for CPU decoding, got --device {device}")
    import warnings

    with warnings.catch_warnings():
        # torch.ao.quantization announces its move to torchao; it is still PyTorch's built-in
        # CPU int8 path (no extra dependency).
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            model, {torch.nn.Linear}, dtype=torch.qint8
        ).eval()


def _resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


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


ENGINES = ("torch", "ctranslate2")


def open_translator(
    engine: str,
    model_path: str | Path,
    spm_model_path: str | Path,
    settings: SearchSettings,
    device: str = "auto",
    quantize: str | None = None,
):
    """A ``Translator`` (engine ``torch``, a model file) or a ``ct2.Ct2Translator`` (engine
    ``ctranslate2``, a directory written by ``export-ct2``): the same ``translate`` interface.
    ``quantize`` (torch engine only): ``quantize_model``."""
    if engine == "ctranslate2" and quantize is not None:
        raise ConfigError(
            "--quantize is for --engine torch; CTranslate2 models are quantised when exported "
            "(export-ct2 --quantization)"
        )
    if engine == "ctranslate2":
        from transformer_nmt.ct2 import Ct2Translator

        return Ct2Translator(model_path, spm_model_path, settings, device)
    if engine != "torch":
        raise ConfigError(f"--engine must be one of {list(ENGINES)}, got {engine!r}")
    if Path(model_path).is_dir():
        raise CheckpointError(
            f"{model_path}: a directory, not a model file (--engine ctranslate2?)"
        )
    return Translator(model_path, spm_model_path, settings, device, quantize)
