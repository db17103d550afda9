"""Choosing how many checkpoints to average, and the length penalty α (§6.1), on the
development set.

The paper averages a fixed number: the last 5 checkpoints (base) or 20 (big), written every 10
minutes of 8-GPU training. On other data and budgets the best number differs, so
``average_last_k: auto`` averages the last K checkpoints for each K of ``CANDIDATES`` (bounded
by the checkpoints kept), translates the dev set with the run's beam search (§6.1: beam 4,
α = 0.6) and keeps the K with the best detokenised sacreBLEU. The table K -> dev BLEU is kept
beside the model (``average_selection.json``), in MLflow and in the report.

The paper chose α = 0.6 (with the beam size) "after experimentation on the development set"
(§6.1). ``translate.alpha: auto`` repeats that experiment for the run at hand: the averaged model
translates the dev set under each α of ``ALPHA_CANDIDATES`` and the α with the best detokenised
sacreBLEU decodes the test sets (``alpha_selection.json``, written by ``select-alpha``). The
PyTorch engine does it in one beam search for all of them (``search.beam_search_per_alpha``),
in 0.37-0.45x the time on the demo's dev set (fp32 or int8), with the translations of one search
per α to the last digit where a row's result does not depend on the other rows of its batch, as
in fp32. int8 dynamic quantisation scales each batch's activations by the batch's range, and a
sentence leaves the batch when its search ends, so there α's scores move by rounding: on the
demo model two of six α moved by +0.02 dev BLEU, the chosen α the same
(benchmarks/log/2026-11-30.md).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_nmt.data.vocab import folds_case
from transformer_nmt.errors import DataError
from transformer_nmt.evaluation.score import score_lines
from transformer_nmt.inference.engine import TranslationEngine
from transformer_nmt.inference.translator import Translator
from transformer_nmt.io_utils import read_json, read_lines
from transformer_nmt.runs.checkpoints import (
    average_checkpoints,
    checkpoint_meta,
    load_checkpoint,
    save_model_file,
)
from transformer_nmt.search import SearchSettings

log = logging.getLogger(__name__)

CANDIDATES = (1, 5, 10, 20)
# α of the GNMT length penalty ((5 + |Y|) / 6)^α tried by ``translate.alpha: auto``: from the
# paper's 0.6 up; short-sentence models trained briefly tend to end too early (a higher α). It
# stops at 1.6 on dev evidence alone: a grid to 4.0 chose α that did worse on held-out halves
# of the dev set (benchmarks/archive/bench_alpha_grid.py, benchmarks/records/alpha_grid_epyc.json).
ALPHA_CANDIDATES = (0.6, 0.8, 1.0, 1.2, 1.4, 1.6)


@dataclass(frozen=True)
class Selection:
    """The chosen K and the dev BLEU of every K tried."""

    best_k: int
    dev_bleu: dict[int, float]  # K -> detokenised sacreBLEU on the dev set

    def to_dict(self) -> dict[str, Any]:
        return {"best_k": self.best_k, "dev_bleu": {str(k): v for k, v in self.dev_bleu.items()}}


def candidate_ks(available: int, candidates: Sequence[int] = CANDIDATES) -> list[int]:
    """The K of ``candidates`` that ``available`` checkpoints allow (at least K = available
    when fewer than the smallest candidate beyond 1 are kept)."""
    ks = [k for k in candidates if k <= available]
    if available not in ks and available < max(candidates):
        ks.append(available)  # e.g. 7 kept: also try all 7
    return sorted(set(ks))


def select_average(
    checkpoints: Sequence[Path],
    out: Path,
    *,
    spm_model: Path,
    dev_src: Path,
    dev_ref: Path,
    tgt_lang: str,
    settings: SearchSettings,
    device: str = "auto",
    candidates: Sequence[int] = CANDIDATES,
) -> Selection:
    """Average the last K of ``checkpoints`` (oldest first) for each candidate K, score each on
    the dev set, and write the best average to ``out`` (a model file)."""
    sources, references = read_lines(dev_src), read_lines(dev_ref)
    lowercase = folds_case(spm_model)  # a lowercasing vocabulary: case-insensitive BLEU
    first_meta = checkpoint_meta(load_checkpoint(checkpoints[-1], mmap=True), checkpoints[-1])
    dev_bleu: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix=".average-", dir=out.parent) as tmp:
        for k in candidate_ks(len(checkpoints), candidates):
            chosen = list(checkpoints[-k:])
            candidate = Path(tmp) / f"last{k}.pt"
            save_model_file(
                candidate,
                model_config=first_meta["model_config"],
                state_dict=average_checkpoints(chosen),
                vocab=first_meta["vocab"],
                step=int(first_meta["step"] or 0),
                source_checkpoints=[p.name for p in chosen],
            )
            translator = Translator(candidate, spm_model, settings, device)
            hyps = translator.translate(sources)
            scores = score_lines(hyps, references, tgt_lang, lowercase=lowercase)
            dev_bleu[k] = float(scores.bleu["score"])
            log.info("average of the last %d checkpoint(s): dev BLEU %.2f", k, dev_bleu[k])
        # ties go to the smaller K (fewer checkpoints, the same quality)
        best_k = max(dev_bleu, key=lambda k: (dev_bleu[k], -k))
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(Path(tmp) / f"last{best_k}.pt"), out)  # same filesystem: a rename
    return Selection(best_k, dev_bleu)


@dataclass(frozen=True)
class AlphaSelection:
    """The chosen length penalty α and the dev BLEU of every α tried."""

    best_alpha: float
    dev_bleu: dict[float, float]  # α -> detokenised sacreBLEU on the dev set

    def to_dict(self) -> dict[str, Any]:
        return {
            "best_alpha": self.best_alpha,
            "dev_bleu": {f"{a:g}": b for a, b in self.dev_bleu.items()},
        }


def select_alpha(
    translator: TranslationEngine,
    sources: Sequence[str],
    references: Sequence[str],
    tgt_lang: str,
    candidates: Sequence[float] = ALPHA_CANDIDATES,
    *,
    lowercase: bool = False,
) -> AlphaSelection:
    """Translate ``sources`` under every α of ``candidates`` (the translator's other search
    settings unchanged; the PyTorch engine searches once for all of them) and keep the α with
    the best sacreBLEU against ``references`` (case-insensitive with ``lowercase``); ties go to
    the α nearest the paper's 0.6."""
    if not candidates:
        raise DataError("select_alpha: no candidate α to try")
    alphas = sorted(set(float(a) for a in candidates))
    translations = translator.translate_per_alpha(sources, alphas)
    dev_bleu: dict[float, float] = {}
    for alpha in alphas:
        scores = score_lines(translations[alpha], references, tgt_lang, lowercase=lowercase)
        dev_bleu[alpha] = float(scores.bleu["score"])
        log.info("length penalty alpha %g: dev BLEU %.2f", alpha, dev_bleu[alpha])
    paper = SearchSettings().alpha  # §6.1's 0.6
    best = max(dev_bleu, key=lambda a: (dev_bleu[a], -abs(a - paper)))
    return AlphaSelection(best, dev_bleu)


def read_chosen_alpha(path: str | Path) -> float:
    """The α that ``select-alpha`` wrote to ``path`` (``alpha_selection.json``)."""
    table = read_json(path, missing="run the select-alpha stage first, or give --alpha")
    alpha = table.get("best_alpha") if isinstance(table, dict) else None
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha < 0:
        raise DataError(
            f"{path}: no valid 'best_alpha' (a number >= 0): re-run the select-alpha stage"
        )
    return float(alpha)
