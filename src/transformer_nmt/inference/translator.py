"""The PyTorch engine: a trained model file and its SentencePiece model, §6.1 beam search.

``Translator`` is a ``engine.TranslationEngine``: sentences are batched by tokens
(``engine.token_batches``), searched with ``search.beam_search`` and returned in input order;
empty input lines give empty output lines without running the model.

``Translator.translate_with_attention`` also returns, per sentence, the encoder-decoder attention
of the best hypothesis, recomputed by teacher forcing (the model fed BOS + the hypothesis):
one row per target subword (EOS included), one column per source subword (EOS included), one
matrix per head of the chosen decoder layer. ``SentenceAttention.alignment`` turns the head
average into hard word alignments in Pharaoh ``i-j`` format (docs/interfaces.md).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer_nmt import fast_paths
from transformer_nmt.data.batch import flatten, pad_flat, source_batch
from transformer_nmt.data.vocab import BOS_ID, EOS_ID, PAD_ID, load_vocab_info
from transformer_nmt.errors import CheckpointError, ConfigError
from transformer_nmt.inference.engine import TranslationEngine, token_batches
from transformer_nmt.inference.output import EOS_PIECE, SentenceAttention
from transformer_nmt.io_utils import sha256_file
from transformer_nmt.runs.checkpoints import experiment_mismatch, load_model_file
from transformer_nmt.runs.layout import AVERAGED_MODEL, SUMMARY_FILE
from transformer_nmt.search import (
    Hypothesis,
    SearchSettings,
    beam_search,
    beam_search_per_alpha,
)

log = logging.getLogger(__name__)


class Translator(TranslationEngine):
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

    @torch.inference_mode()
    def search_per_alpha(
        self, sources: Sequence[np.ndarray], alphas: Sequence[float]
    ) -> list[dict[float, list[Hypothesis]]]:
        """Beam search one batch once for every α of ``alphas``
        (``search.beam_search_per_alpha``): per sentence, α -> its n-best under that α."""
        src = source_batch(sources).to(self.device)  # [B, S] = x EOS, padded
        s = self.settings
        per_alpha = beam_search_per_alpha(
            self.model, src, alphas, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID,
            beam_size=s.beam, max_len_b=s.max_len_b, nbest=s.nbest, early_stop=s.early_stop,
        )  # fmt: skip
        return [{alpha: per_alpha[alpha][i] for alpha in per_alpha} for i in range(len(sources))]

    def translate_per_alpha(
        self, lines: Sequence[str], alphas: Sequence[float]
    ) -> dict[float, list[str]]:
        """One search for all ``alphas`` (``search_per_alpha``): the translations of one
        ``translate`` per α, for the search time of the α that searches longest."""
        alphas = tuple(dict.fromkeys(float(a) for a in alphas))
        translations = {alpha: [""] * len(lines) for alpha in alphas}
        search = functools.partial(self.search_per_alpha, alphas=alphas)
        for i, per_alpha in self._searched(lines, lambda b: self.search_batches(b, search)):
            for alpha in alphas:
                translations[alpha][i] = self.decode(per_alpha[alpha][0].tokens)
        return translations

    def search_batches(
        self,
        batches: Sequence[Sequence[np.ndarray]],
        search: Callable[[Sequence[np.ndarray]], list[Any]] | None = None,
    ) -> Iterator[list[Any]]:
        """``search`` (default ``self.search``) of each batch, results in order. On a CPU with
        T > 1 torch threads (fast path ``parallel_batches``): T batches at once, each searched on
        one thread. A decoder step of a small model is too small to split well across threads:
        on 2 threads the demo model's beam-4 decoding ran 1.13-1.20x faster, with the same
        translations (benchmarks/archive/bench_parallel_batches.py,
        benchmarks/records/parallel_batches_epyc.json). Elsewhere one batch at a time."""
        search = search or self.search
        threads = torch.get_num_threads()
        parallel = (
            self.device.type == "cpu" and threads > 1 and len(batches) > 1
            and fast_paths.enabled("parallel_batches")
        )  # fmt: skip
        if not parallel:
            yield from map(search, batches)
            return

        def on_one_thread(sources: Sequence[np.ndarray]) -> list[Any]:
            torch.set_num_threads(1)  # this worker's intra-op threads
            return search(sources)

        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(min(threads, len(batches))) as workers:
                yield from workers.map(on_one_thread, batches)
        finally:
            torch.set_num_threads(threads)

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
