"""The report's Table 3 section: each row's parameters, dev perplexity and dev BLEU beside the
paper's (Vaswani et al. 2017, Table 3; the rows and the paper's numbers are
``transformer_nmt.model.config.TABLE3``), and the differences from the base row.

Ours come from each run's ``train_summary.json``: the last validation's ``val/ppl``
(per SentencePiece piece, as the paper's is per word-piece) and ``val/bleu_beam`` (§6.1 beam
search on the whole dev set with the trained weights, no checkpoint averaging: what §6.2 says
Table 3 reports). The parameter count is computed from the run's model config and vocabulary by
the caller (``cli/report.py``), so that this module needs no model. A row trained once per seed
shows the mean over its runs (± the sample standard deviation).

With a significance study against the base row, each row also gets its test BLEU with sacreBLEU's
95% interval and the paired bootstrap's p-value against the base (``RowTest``), and a verdict on
the paper's finding (``verdict``): its direction holds, reverses, or there is no significant
difference at this scale. ``seed_candidates``: the rows whose dev BLEU lies within twice the
base's seed spread, where one run cannot decide (the config key ``table3.seeds`` gives them
more). ``evaluation.figures.table3_delta_figure`` draws each row's Δ BLEU against the base
beside the paper's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_nmt.errors import DataError
from transformer_nmt.io_utils import read_json
from transformer_nmt.model.config import TABLE3
from transformer_nmt.runs.layout import SUMMARY_FILE

SIGNIFICANCE_LEVEL = 0.05


@dataclass(frozen=True)
class RowTest:
    """A row's paired bootstrap against the base row on one test set (``evaluation.
    significance.BootstrapResult`` of the row and of the base)."""

    test_set: str
    row: Any
    base: Any

    @property
    def delta(self) -> float:
        return self.row.bleu - self.base.bleu


def verdict(test: RowTest, paper_delta: float) -> str:
    """The paper's finding for a row at this scale: its direction holds, reverses, or no
    significant difference (p >= 0.05); a paper difference of 0 holds when ours is not
    significant either."""
    significant = test.row.p_value is not None and test.row.p_value < SIGNIFICANCE_LEVEL
    if not significant:
        return "holds (no difference)" if paper_delta == 0 else "no significant difference"
    if paper_delta == 0:
        return "differs (paper: none)"
    return "holds" if (test.delta > 0) == (paper_delta > 0) else "reverses"


@dataclass(frozen=True)
class RunDev:
    """What one run's train summary says for Table 3."""

    model_config: dict[str, Any]
    vocab_size: int
    dev_ppl: float | None
    dev_bleu: float | None
    step: int | None


def read_run_dev(run_dir: str | Path) -> RunDev:
    """``<run_dir>/train_summary.json`` -> RunDev; DataError naming the file and key."""
    path = Path(run_dir) / SUMMARY_FILE
    data = read_json(path, missing="the run has not finished training")
    for key in ("model_config", "vocab", "metrics"):
        if not isinstance(data.get(key), dict):
            raise DataError(f"{path}: missing key '{key}' (not a summary written by 'train')")
    metrics = data["metrics"]

    def metric(key: str) -> float | None:
        value = metrics.get(key)
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else None

    step = metrics.get("val/step", data.get("final_step"))
    return RunDev(
        model_config=data["model_config"],
        vocab_size=int(data["vocab"].get("size", 0)),
        dev_ppl=metric("val/ppl"),
        dev_bleu=metric("val/bleu_beam"),
        step=int(step) if isinstance(step, int | float) else None,
    )


@dataclass(frozen=True)
class Table3Entry:
    """One row of our Table 3: the row's runs (one per seed) and their values."""

    row: str
    experiment: str
    params: int
    dev_ppl: tuple[float, ...]
    dev_bleu: tuple[float, ...]
    steps: tuple[int, ...]
    changes: tuple[str, ...] = ()  # our model's differences from the base row's ("key=value")

    @staticmethod
    def mean(values: Sequence[float]) -> float | None:
        return statistics.fmean(values) if values else None


def table3_entries(
    rows: Mapping[str, str],
    groups: Mapping[str, Sequence[str]],
    runs: Mapping[str, RunDev],
    params: Mapping[str, int],
) -> list[Table3Entry]:
    """The entries of ``rows`` (Table 3 row -> experiment) in the paper's order; ``groups``
    maps an experiment to its runs (absent: the experiment is one run); ``params``: run ->
    parameter count."""
    entries = []
    base_members = list(groups.get(rows["base"], [rows["base"]])) if "base" in rows else []
    base_cfg = runs[base_members[0]].model_config if base_members else {}
    for row in TABLE3:
        if row not in rows:
            continue
        experiment = rows[row]
        members = list(groups.get(experiment, [experiment]))
        devs = [runs[m] for m in members]
        cfg = devs[0].model_config
        entries.append(
            Table3Entry(
                row=row,
                experiment=experiment,
                params=params[members[0]],
                dev_ppl=tuple(d.dev_ppl for d in devs if d.dev_ppl is not None),
                dev_bleu=tuple(d.dev_bleu for d in devs if d.dev_bleu is not None),
                steps=tuple(d.step for d in devs if d.step is not None),
                changes=tuple(
                    f"{k}={v}" for k, v in cfg.items() if base_cfg and base_cfg.get(k) != v
                ),
            )
        )
    return entries


def _value(values: Sequence[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"


def _delta(value: float | None, base: float | None) -> str:
    return "—" if value is None or base is None else f"{value - base:+.2f}"


def seed_candidates(entries: Sequence[Table3Entry]) -> tuple[float | None, list[str]]:
    """(the base row's dev BLEU sample std, the rows trained once whose dev BLEU differs from
    the base's mean by at most twice it); (None, []) without a base of two or more seeds."""
    base = next((e for e in entries if e.row == "base"), None)
    if base is None or len(base.dev_bleu) < 2:
        return None, []
    spread = statistics.stdev(base.dev_bleu)
    mean = statistics.fmean(base.dev_bleu)
    return spread, [
        e.row for e in entries
        if e.row != "base" and len(e.dev_bleu) == 1 and abs(e.dev_bleu[0] - mean) <= 2 * spread
    ]  # fmt: skip


def render_table3(
    entries: Sequence[Table3Entry], dev_set: str, tests: Mapping[str, RowTest] | None = None
) -> str:
    """Markdown: per row, what it changes, parameters (ours, paper's), dev perplexity and dev
    BLEU (ours, paper's) and the differences from the base row (ours, paper's); with ``tests``
    (row -> its paired bootstrap against the base), its test BLEU [95% CI], p-value and the
    verdict on the paper's finding, and the count of findings that hold."""
    if not entries:
        raise DataError("Table 3: no rows to report")
    base = next((e for e in entries if e.row == "base"), None)
    base_ppl = Table3Entry.mean(base.dev_ppl) if base else None
    base_bleu = Table3Entry.mean(base.dev_bleu) if base else None
    paper_base = TABLE3["base"]
    lines = [
        "## Table 3: variations on the base model",
        "",
        f"Every row is trained like the base row (same data, budget and search); ours are on the "
        f"dev set ({dev_set}), the paper's on newstest2013 (EN-DE, 100k steps; big 300k). Dev "
        "PPL: per SentencePiece piece at the last validation; dev BLEU: sacreBLEU of §6.1 beam "
        "search on the whole dev set with the last weights (no averaging, §6.2). Parameters "
        "depend on the vocabulary (the paper: ~37k). Δ: difference from the base row. Rows with "
        "seeds: mean ± sample std over the runs.",
        "",
        "| row | experiment | changes | params ×10⁶ | paper | dev PPL | paper | Δ PPL | paper Δ "
        "| dev BLEU | paper | Δ BLEU | paper Δ | step |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in entries:
        paper = TABLE3[e.row]
        ppl, bleu = Table3Entry.mean(e.dev_ppl), Table3Entry.mean(e.dev_bleu)
        changes = ", ".join(paper.overrides) if paper.overrides else "—"
        if e.changes and set(e.changes) != set(paper.overrides):  # a study at another scale
            changes += f" → ours: {', '.join(e.changes)}"
        steps = ", ".join(str(s) for s in sorted(set(e.steps))) or "—"
        lines.append(
            f"| {e.row} | {e.experiment} | {changes} | {e.params / 1e6:.2f} "
            f"| {paper.paper_params_m:g} | {_value(e.dev_ppl)} | {paper.paper_dev_ppl:.2f} "
            f"| {_delta(ppl, base_ppl)} | {paper.paper_dev_ppl - paper_base.paper_dev_ppl:+.2f} "
            f"| {_value(e.dev_bleu)} | {paper.paper_dev_bleu:.1f} | {_delta(bleu, base_bleu)} "
            f"| {paper.paper_dev_bleu - paper_base.paper_dev_bleu:+.1f} | {steps} |"
        )
    if tests:
        lines += _render_verdicts(entries, tests)
    spread, candidates = seed_candidates(entries)
    if candidates:
        seeds = ", ".join(f"{row}: [1, 2, 3]" for row in candidates)
        lines += [
            "",
            f"Rows within twice the base's seed spread (dev BLEU sd {spread:.2f}), where one run "
            f"cannot decide: {', '.join(candidates)}. More seeds for them: "
            f"`table3: {{seeds: {{{seeds}}}}}`.",
        ]
    return "\n".join(lines) + "\n"


def _render_verdicts(entries: Sequence[Table3Entry], tests: Mapping[str, RowTest]) -> list[str]:
    """The verdict table: each tested row's test BLEU against the base's, and the finding."""
    paper_base = TABLE3["base"].paper_dev_bleu
    test_set = next(iter(tests.values())).test_set
    lines = [
        "",
        f"Against the base row on {test_set} (sacreBLEU's paired bootstrap; rows with seeds: "
        f"their runs concatenated): BLEU [95% CI], Δ, p-value, and the verdict on the paper's "
        f"finding (its Δ dev BLEU): *holds* (same direction, p < {SIGNIFICANCE_LEVEL}), "
        "*reverses* (opposite, p < 0.05), *no significant difference* (p ≥ 0.05).",
        "",
        "| row | BLEU [95% CI] | base | Δ BLEU | paper Δ | p-value | verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    counts: dict[str, int] = {}
    for e in entries:
        test = tests.get(e.row)
        if test is None:
            continue
        paper_delta = round(TABLE3[e.row].paper_dev_bleu - paper_base, 1)
        found = verdict(test, paper_delta)
        counts[found] = counts.get(found, 0) + 1
        low, high = test.row.interval
        lines.append(
            f"| {e.row} | {test.row.bleu:.2f} [{low:.2f}, {high:.2f}] | {test.base.bleu:.2f} "
            f"| {test.delta:+.2f} | {paper_delta:+.1f} | {test.row.p_value:.4f} | {found} |"
        )
    holding = counts.get("holds", 0) + counts.get("holds (no difference)", 0)
    lines += [
        "",
        f"The paper's finding holds for {holding} of {sum(counts.values())} rows "
        f"({'; '.join(f'{k}: {v}' for k, v in sorted(counts.items()))}).",
    ]
    return lines
