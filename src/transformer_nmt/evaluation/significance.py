"""Significance and seeds: sacreBLEU's paired bootstrap against a baseline, mean ± std over seeds.

**Paired bootstrap resampling** (Koehn 2004; sacreBLEU's ``PairedTest(test_type="bs")``, the
Moses ``bootstrap-hypothesis-difference-significance.pl``): test sets of the same size are drawn
with replacement from the sentences, the same draws for the baseline and the system. The
p-value is sacreBLEU's: (1 + the number of draws whose absolute BLEU difference, centred by
subtracting its mean over the draws (the null hypothesis), exceeds the observed difference) /
(1 + draws); a system with no observed difference gets p = 1. The 95% confidence interval of a
system's BLEU is the 2.5th to 97.5th percentile of its BLEU on the draws (reported as the
bootstrap mean ± half its width). The 95% interval of the *difference* (system − baseline) is
the 2.5th to 97.5th percentile of the difference on the same draws (``difference_interval``):
the interval the paired test's p-value goes with, narrower than the system's own interval
wherever the two systems err on the same sentences. sacreBLEU computes these differences but
returns only the p-value, so they are recomputed here from its own sufficient statistics.
The draws are seeded (``$SACREBLEU_SEED``, default 12345: the seed is in the signature).

**With seeds** (an experiment trained once per seed), the per-seed hypotheses are
*concatenated*: the system's "test set" is its k seed runs one after another against the
references repeated k times, and the baseline's likewise, seed i beside seed i (a baseline
without seeds is repeated k times). The bootstrap then draws from k x n sentence pairs, so the
seeds' spread enters the interval and the p-value, but each source sentence counts k times:
read the interval as that of the seed-averaged system on this test set, not of one run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformer_nmt.errors import DataError

DEFAULT_RESAMPLES = 1000  # sacreBLEU's default for the bootstrap


@dataclass(frozen=True)
class BootstrapResult:
    """One system on one test set: BLEU of its (concatenated) hypotheses, the bootstrap mean
    and the half-width of the 95% CI around it, the p-value against the baseline (None for the
    baseline itself)."""

    bleu: float
    mean: float
    ci: float
    p_value: float | None
    sentences: int
    runs: int
    # the 95% interval of BLEU(system) - BLEU(baseline) on the paired draws (None: baseline)
    difference_interval: tuple[float, float] | None = None

    @property
    def interval(self) -> tuple[float, float]:
        return (self.mean - self.ci, self.mean + self.ci)


def concatenate_runs(runs: Sequence[Sequence[str]], copies: int, name: str) -> list[str]:
    """The hypotheses of ``runs`` (one list per seed) laid out as ``copies`` runs, seed by seed:
    a single run is repeated; otherwise the count must already be ``copies``."""
    if len(runs) == copies:
        return [line for run in runs for line in run]
    if len(runs) == 1:
        return list(runs[0]) * copies
    raise DataError(f"{name}: {len(runs)} seed runs cannot pair with {copies}")


def paired_bootstrap(
    baseline: Sequence[Sequence[str]],
    system: Sequence[Sequence[str]],
    references: Sequence[str],
    resamples: int = DEFAULT_RESAMPLES,
    tokenize: str = "13a",
    lowercase: bool = False,
) -> tuple[BootstrapResult, BootstrapResult, str]:
    """sacreBLEU's paired bootstrap of ``system`` against ``baseline`` (each a list of runs,
    one hypothesis list per seed) on ``references``, BLEU with tokenizer ``tokenize`` (the
    target language's, ``evaluation.score.bleu_tokenizer``), case-insensitive with ``lowercase``
    (as the score stage was); returns (baseline result, system result, the test's signature).
    Runs are concatenated as the module docstring says."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    for runs, name in ((baseline, "baseline"), (system, "system")):
        if not runs:
            raise DataError(f"{name}: no hypotheses")
        for run in runs:
            if len(run) != len(references):
                raise DataError(f"{name}: {len(run)} hypotheses for {len(references)} references")
    copies = max(len(baseline), len(system))
    base_lines = concatenate_runs(baseline, copies, "baseline")
    sys_lines = concatenate_runs(system, copies, "system")
    test = PairedTest(
        [("baseline", base_lines), ("system", sys_lines)],
        {"BLEU": BLEU(tokenize=tokenize, lowercase=lowercase)},
        references=[list(references) * copies],
        test_type="bs",
        n_samples=resamples,
    )
    signatures, scores = test()
    (metric,) = signatures
    base, sys_ = scores[metric]
    # No observed difference (identical hypotheses, or two BLEU of 0): every resample differs
    # at least that much, p = 1. (sacreBLEU counts resamples whose centred difference is
    # strictly larger: with identical systems none is, and it would give its smallest p-value,
    # 1 / (resamples + 1).)
    p_value = 1.0 if sys_.score == base.score else float(sys_.p_value)
    n = len(base_lines)
    difference = difference_interval(
        BLEU(tokenize=tokenize, lowercase=lowercase),
        base_lines,
        sys_lines,
        [list(references) * copies],
        resamples,
    )
    return (
        BootstrapResult(
            float(base.score), float(base.mean), float(base.ci), None, n, len(baseline)
        ),
        BootstrapResult(
            float(sys_.score),
            float(sys_.mean),
            float(sys_.ci),
            p_value,
            n,
            len(system),
            difference,
        ),
        str(signatures[metric]),
    )


def difference_interval(
    metric: Any,
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[Sequence[str]],
    resamples: int,
) -> tuple[float, float]:
    """The 95% interval of ``metric(system) - metric(baseline)`` over ``resamples`` paired
    draws of the sentences: the draws of sacreBLEU's paired bootstrap (the same generator,
    seed ``$SACREBLEU_SEED`` and order), scored from its per-sentence sufficient statistics
    as its test does."""
    import os

    import numpy as np

    seed = os.environ.get("SACREBLEU_SEED", "12345")  # sacreBLEU's own default
    rng = np.random.default_rng(None if seed.lower() == "none" else int(seed))
    draws = rng.choice(len(system), size=(resamples, len(system)), replace=True)
    stats = [
        np.array(metric._extract_corpus_statistics(lines, references), dtype="float32")
        for lines in (baseline, system)
    ]  # [sentences, statistics] each

    def score(table: np.ndarray, rows: np.ndarray) -> float:
        return metric._compute_score_from_stats(table[rows].sum(0)).score

    differences = [score(stats[1], rows) - score(stats[0], rows) for rows in draws]
    low, high = np.percentile(differences, [2.5, 97.5])
    return float(low), float(high)


@dataclass(frozen=True)
class SeedSummary:
    """A metric over the seed runs of one experiment: mean and sample standard deviation."""

    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float:
        """Sample standard deviation (n - 1); NaN for a single run."""
        return statistics.stdev(self.values) if len(self.values) > 1 else math.nan


def seed_summaries(
    groups: Mapping[str, Sequence[str]], scores: Mapping[tuple[str, str], float]
) -> dict[tuple[str, str], SeedSummary]:
    """``(experiment, test_set) -> SeedSummary`` for every experiment with seed runs
    (``groups``: experiment -> runs) on every test set that all its runs scored
    (``scores``: (run, test set) -> BLEU)."""
    test_sets = sorted({t for _, t in scores})
    out: dict[tuple[str, str], SeedSummary] = {}
    for name, runs in sorted(groups.items()):
        for test_set in test_sets:
            values = [scores.get((run, test_set)) for run in runs]
            if values and all(v is not None for v in values):
                out[(name, test_set)] = SeedSummary(tuple(values))  # type: ignore[arg-type]
    return out


def _pm(mean: float, std: float) -> str:
    return f"{mean:.2f}" if math.isnan(std) else f"{mean:.2f} ± {std:.2f}"


def render_seeds(
    groups: Mapping[str, Sequence[str]], summaries: Mapping[tuple[str, str], SeedSummary]
) -> str:
    """Markdown: one row per experiment with seeds × test set, BLEU mean ± sample std."""
    lines = [
        "## Seeds",
        "",
        "Experiments trained once per seed (`seeds:`): sacreBLEU BLEU of each run, their mean "
        "± sample standard deviation (n − 1).",
        "",
        "| experiment | test set | runs | BLEU per run | BLEU mean ± std |",
        "|---|---|---:|---|---:|",
    ]
    for (name, test_set), summary in sorted(summaries.items()):
        per_run = ", ".join(f"{v:.2f}" for v in summary.values)
        lines.append(
            f"| {name} | {test_set} | {len(groups[name])} | {per_run} "
            f"| {_pm(summary.mean, summary.std)} |"
        )
    return "\n".join(lines) + "\n"


def render_significance(
    baseline: str,
    results: Mapping[tuple[str, str], BootstrapResult],
    signatures: Sequence[str],
    resamples: int,
) -> str:
    """Markdown: per test set, the baseline and every compared experiment: BLEU, the bootstrap's
    95% CI, the difference to the baseline and the p-value."""
    lines = [
        "## Significance (paired bootstrap)",
        "",
        f"sacreBLEU's paired bootstrap resampling ({resamples} resamples) of every experiment "
        f"against the baseline **{baseline}** on each test set. *95% CI*: the bootstrap mean ± "
        "half the 2.5–97.5 percentile range; *p*: sacreBLEU's p-value (the share of resamples "
        "whose centred difference exceeds the observed one). Seed runs are concatenated "
        "(seed i beside the baseline's seed i; `evaluation/significance.py`).",
        "",
        "| test set | experiment | runs | BLEU | 95% CI | Δ BLEU | p |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    by_test: dict[str, dict[str, BootstrapResult]] = {}
    for (name, test_set), result in results.items():
        by_test.setdefault(test_set, {})[name] = result
    for test_set, systems in sorted(by_test.items()):
        base = systems.get(baseline)
        order = [baseline] if base else []
        order += sorted(n for n in systems if n != baseline)
        for name in order:
            r = systems[name]
            low, high = r.interval
            delta = "—" if base is None or name == baseline else f"{r.bleu - base.bleu:+.2f}"
            p = "—" if r.p_value is None else f"{r.p_value:.4f}"
            label = f"{name} (baseline)" if name == baseline else name
            lines.append(
                f"| {test_set} | {label} | {r.runs} | {r.bleu:.2f} | [{low:.2f}, {high:.2f}] "
                f"| {delta} | {p} |"
            )
    lines += ["", *[f"- BLEU: `{s}`" for s in sorted(set(signatures))]]
    return "\n".join(lines) + "\n"
