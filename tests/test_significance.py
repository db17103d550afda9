"""Paired bootstrap (sacreBLEU) against a baseline and mean ± std over seeds, on hand-made
hypotheses."""

from __future__ import annotations

import math
import random

import pytest
import sacrebleu

from transformer_nmt.errors import DataError
from transformer_nmt.evaluation.significance import (
    SeedSummary,
    concatenate_runs,
    paired_bootstrap,
    render_seeds,
    render_significance,
    seed_summaries,
)

WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "with", "red", "blue", "house", "tree",
         "man", "woman", "runs", "walks"]  # fmt: skip


def _corpus(n: int = 120, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(n)]


def _garble(lines: list[str], every: int, seed: int) -> list[str]:
    """Every ``every``-th line replaced by random words (a worse system)."""
    noise = _corpus(len(lines), seed)
    return [noise[i] if i % every == 0 else line for i, line in enumerate(lines)]


REFS = _corpus()
GOOD = _garble(REFS, 6, seed=1)
BAD = _garble(REFS, 2, seed=2)


def test_identical_systems_are_not_significantly_different() -> None:
    base, system, signature = paired_bootstrap([GOOD], [GOOD], REFS, resamples=200)
    assert system.p_value == 1.0 and base.p_value is None
    assert system.bleu == base.bleu == pytest.approx(sacrebleu.corpus_bleu(GOOD, [REFS]).score)
    assert "bs:200" in signature and "seed:12345" in signature


def test_lowercase_compares_as_the_score_stage_did_for_a_lowercasing_vocabulary() -> None:
    refs = [line.capitalize() for line in REFS]  # cased references, lowercase hypotheses
    base, system, signature = paired_bootstrap([BAD], [GOOD], refs, resamples=100, lowercase=True)
    assert system.bleu == pytest.approx(sacrebleu.corpus_bleu(GOOD, [REFS]).score)
    assert base.bleu == pytest.approx(sacrebleu.corpus_bleu(BAD, [REFS]).score)
    assert "case:lc" in signature
    _, cased, _ = paired_bootstrap([BAD], [GOOD], refs, resamples=100)
    assert cased.bleu < system.bleu


def test_the_difference_interval_is_the_paired_one_and_agrees_with_the_p_value() -> None:
    """Four sentences made right: a small, consistent gain. Its paired interval excludes 0 (as
    the p-value says), where the system's own interval less the baseline's BLEU (the unpaired
    view) spans 0; identical systems give the interval [0, 0]."""
    better = list(GOOD)
    for i in (6, 12, 18, 24):  # garbled lines of GOOD, now the references
        better[i] = REFS[i]
    base, system, _ = paired_bootstrap([GOOD], [better], REFS, resamples=300)
    assert base.difference_interval is None and system.difference_interval is not None
    low, high = system.difference_interval
    delta = system.bleu - base.bleu
    assert system.p_value < 0.05 and 0 < low < delta < high
    unpaired_low, unpaired_high = (bound - base.bleu for bound in system.interval)
    assert unpaired_low < 0 and high - low < unpaired_high - unpaired_low
    _, same, _ = paired_bootstrap([GOOD], [GOOD], REFS, resamples=100)
    assert same.difference_interval == (0.0, 0.0)


def test_one_changed_sentence_is_not_significant() -> None:
    nearly = list(GOOD)
    nearly[5] = "the cat"
    _, system, _ = paired_bootstrap([GOOD], [nearly], REFS, resamples=200)
    assert system.p_value > 0.05


def test_a_clearly_better_system_has_a_small_p_value_and_its_bleu_in_the_ci() -> None:
    base, system, _ = paired_bootstrap([BAD], [GOOD], REFS, resamples=300)
    assert system.bleu > base.bleu + 20
    assert system.p_value < 0.01
    for result in (base, system):
        low, high = result.interval
        assert low <= result.bleu <= high and high - low > 0
    # the intervals of two clearly different systems do not overlap
    assert base.interval[1] < system.interval[0]


def test_seed_runs_are_concatenated_seed_by_seed() -> None:
    base, system, _ = paired_bootstrap([BAD, BAD], [GOOD, BAD], REFS, resamples=200)
    assert base.sentences == system.sentences == 2 * len(REFS)
    assert (base.runs, system.runs) == (2, 2)
    both = sacrebleu.corpus_bleu(GOOD + BAD, [REFS + REFS]).score
    assert system.bleu == pytest.approx(both)
    # a baseline without seeds is repeated: its BLEU is unchanged
    base1, _, _ = paired_bootstrap([BAD], [GOOD, BAD], REFS, resamples=50)
    assert base1.bleu == pytest.approx(sacrebleu.corpus_bleu(BAD, [REFS]).score)
    assert base1.runs == 1 and base1.sentences == 2 * len(REFS)


def test_mismatched_runs_are_a_data_error() -> None:
    assert concatenate_runs([["a"], ["b"]], 2, "x") == ["a", "b"]
    assert concatenate_runs([["a"]], 3, "x") == ["a", "a", "a"]
    with pytest.raises(DataError, match="x: 2 seed runs cannot pair with 3"):
        concatenate_runs([["a"], ["b"]], 3, "x")
    with pytest.raises(DataError, match="system: 3 hypotheses for 120 references"):
        paired_bootstrap([GOOD], [GOOD[:3]], REFS)
    with pytest.raises(DataError, match="seed runs cannot pair"):
        paired_bootstrap([GOOD, GOOD], [GOOD, GOOD, GOOD], REFS)


def test_seed_summary_is_mean_and_sample_std() -> None:
    scores = {("e.seed1", "t"): 30.0, ("e.seed2", "t"): 32.0, ("e.seed3", "t"): 34.0}
    scores[("e.seed1", "u")] = 10.0  # not every run scored u: no summary for it
    summaries = seed_summaries({"e": ["e.seed1", "e.seed2", "e.seed3"]}, scores)
    assert set(summaries) == {("e", "t")}
    summary = summaries[("e", "t")]
    assert summary.mean == 32.0 and summary.std == pytest.approx(2.0)  # n - 1
    assert math.isnan(SeedSummary((1.0,)).std)
    text = render_seeds({"e": ["e.seed1", "e.seed2", "e.seed3"]}, summaries)
    assert "| e | t | 3 | 30.00, 32.00, 34.00 | 32.00 ± 2.00 |" in text


def test_significance_table_lists_the_baseline_first_with_deltas() -> None:
    base, system, signature = paired_bootstrap([BAD], [GOOD], REFS, resamples=100)
    text = render_significance("b", {("b", "t"): base, ("s", "t"): system}, [signature], 100)
    rows = [ln for ln in text.splitlines() if ln.startswith("| t |")]
    assert rows[0].startswith("| t | b (baseline) | 1 |") and rows[0].endswith("| — | — |")
    assert f"| {system.bleu - base.bleu:+.2f} | {system.p_value:.4f} |" in rows[1]
    assert f"`{signature}`" in text
