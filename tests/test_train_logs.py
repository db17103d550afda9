"""A training run's log lines, and its metrics.csv history across a resume."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from tests.training_helpers import train_argv
from transformer_nmt.cli import main
from transformer_nmt.training.optimizer import paper_lr


def test_log_lines_show_progress_eta_window_loss_and_validation_once(
    corpus: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from transformer_nmt.training.callbacks import _clock

    caplog.set_level(logging.INFO, logger="transformer_nmt.training.callbacks")
    assert main(train_argv(corpus, tmp_path / "run", max_steps=10, val_every_steps=10)) == 0
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("transformer_nmt.training.callbacks")
    ]
    progress = [line for line in lines if line.startswith("step ")]
    assert [line.split("  ")[0] for line in progress] == ["step 5/10 (50%)", "step 10/10 (100%)"]
    for line in progress:
        fields = dict(part.split(" ", 1) for part in line.split("  ")[1:])
        assert {"elapsed", "eta", "loss", "lr", "grad_norm", "tgt"} <= fields.keys()
        assert math.isfinite(float(fields["loss"]))
    assert progress[-1].split("  ")[2] == "eta 0m00s"
    validations = [line for line in lines if line.startswith("validation")]
    assert len(validations) == 1 and validations[0].startswith("validation at step 10: loss ")
    assert not any("val" in line for line in progress)  # validation values only where measured
    assert (_clock(3723.4), _clock(59.6), _clock(float("nan"))) == ("1h02m03s", "1m00s", "?")


def test_metrics_history_survives_a_resume_without_duplicate_steps(
    corpus: dict[str, Path], tmp_path: Path
) -> None:
    """metrics.csv of a run killed after its step-10 rows but before the step-10 checkpoint,
    then resumed from step 5, equals that of an uninterrupted run: the rows beyond step 5 are
    dropped and re-done once; the clock continues from the last row kept."""
    from transformer_nmt.runs.layout import METRICS_FILE
    from transformer_nmt.runs.metrics_history import read_metrics

    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main(train_argv(corpus, whole, max_steps=20)) == 0
    assert main(train_argv(corpus, split, max_steps=10)) == 0
    first = read_metrics(split / METRICS_FILE)
    # as if killed before saving step 10: step 5 still the newest, with its training state
    assert main(train_argv(corpus, tmp_path / "to5", max_steps=5)) == 0
    step_5 = tmp_path / "to5" / "checkpoints" / "step=00000005.ckpt"
    step_5.replace(split / "checkpoints" / step_5.name)
    (split / "checkpoints" / "step=00000010.ckpt").unlink()
    (split / "checkpoints" / "finished.json").unlink()
    with open(split / METRICS_FILE, "a") as handle:
        handle.write("11,3.5,2.")  # a row cut short by the kill
    assert main(train_argv(corpus, split, max_steps=20)) == 0

    expected, rows = read_metrics(whole / METRICS_FILE), read_metrics(split / METRICS_FILE)
    kinds = [(r.step, sorted(r.values)) for r in rows]
    train = ["lr", "train_loss"]
    assert kinds == [(5, train), (10, train), (10, ["val_loss", "val_ppl"]), (15, train),
                     (20, train), (20, ["val_loss", "val_ppl"])]  # fmt: skip
    assert kinds == [(r.step, sorted(r.values)) for r in expected]
    for got, want in zip(rows, expected, strict=True):  # resume-exact training: same values
        assert got.values == pytest.approx(want.values, rel=1e-5)
    assert rows[0] == first[0]  # the row of step 5 kept as it was
    elapsed = [r.elapsed_s for r in rows]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0
    # §5.3: the row's lr is the one its update used; the loss is the window's mean
    for r in rows[::3]:
        assert r.values["lr"] == pytest.approx(paper_lr(r.step, 32, warmup=10))
    assert rows[2].values["val_ppl"] > 1.0
