"""A run's checkpoints: weights-only older ones, hparams, saved by time, a corrupt one."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from tests.training_helpers import VOCAB, _dev_bleu, train_argv
from transformer_nmt.cli import main
from transformer_nmt.runs.checkpoints import is_weights_only, list_checkpoints, load_checkpoint


def test_only_the_newest_checkpoint_keeps_the_training_state(
    corpus: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The older checkpoints kept for §6.1 averaging hold the weights only; a run whose newest
    checkpoint is one of them (its full successor deleted by hand) is a clear error, not a
    resume with a fresh optimizer."""
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=20)) == 0
    found = list_checkpoints(run / "checkpoints")
    assert [p.name for p in found] == [f"step={s:08d}.ckpt" for s in (10, 15, 20)]
    payloads = [load_checkpoint(p) for p in found]
    assert [is_weights_only(p) for p in payloads] == [True, True, False]
    assert [("optimizer_states" in p) for p in payloads] == [False, False, True]
    found[-1].unlink()
    (run / "checkpoints" / "finished.json").unlink()
    capsys.readouterr()
    assert main(train_argv(corpus, run, max_steps=30)) == 2
    err = capsys.readouterr().err
    assert "step=00000015.ckpt: the newest checkpoint holds weights only" in err
    assert len(err.strip().splitlines()) == 1
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == [p.name for p in found[:2]]


def test_checkpoints_load_weights_only_with_plain_hparams(
    corpus: dict[str, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=5, tokens_per_update=128)) == 0
    (only,) = list_checkpoints(run / "checkpoints")
    ckpt = torch.load(only, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 5
    hp = ckpt["hyper_parameters"]
    assert hp["model_config"]["d_model"] == 32 and hp["vocab"]["size"] == VOCAB
    assert hp["train_config"]["tokens_per_update"] == 128
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["accumulate_grad_batches"] == 2  # 128 / 64 tokens per micro-batch
    assert all(k.startswith("model.") for k in ckpt["state_dict"])


def test_time_based_checkpoints_keep_the_newest_and_validation_bleu(
    corpus: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    argv = train_argv(
        corpus,
        run,
        max_steps=4,
        checkpoint_every_steps=None,
        checkpoint_every_minutes=1e-9,  # due at every step
        keep_checkpoints=2,
        val_every_steps=2,
        val_bleu_sentences=8,
        val_beam_bleu_every_steps=4,
    )
    caplog.set_level(logging.INFO, logger="transformer_nmt.training.callbacks")
    assert main(argv) == 0
    validations = [r.getMessage() for r in caplog.records if "validation at step" in r.getMessage()]
    assert "beam bleu" not in validations[0] and "greedy bleu" in validations[0]  # step 2
    assert "beam bleu" in validations[1]  # step 4: measured there
    names = [p.name for p in list_checkpoints(run / "checkpoints")]
    assert names == ["step=00000003.ckpt", "step=00000004.ckpt"]
    metrics = json.loads((run / "train_summary.json").read_text())["metrics"]
    # the BLEUs of step 4 are those of the weights saved at step 4: greedy on the first 8 dev
    # sentences, the §6.1 beam search on all 16, recomputed here from the checkpoint
    step_4 = run / "checkpoints" / "step=00000004.ckpt"
    assert metrics["val/bleu"] == pytest.approx(_dev_bleu(step_4, corpus, 8, beam=False), abs=1e-9)
    assert metrics["val/bleu_beam"] == pytest.approx(
        _dev_bleu(step_4, corpus, 16, beam=True), abs=1e-9
    )
    assert metrics["val/ppl"] == pytest.approx(math.exp(metrics["val/nll"]))
    # metrics.csv: the BLEUs only in the rows of the validations that measured them
    from transformer_nmt.runs.layout import METRICS_FILE
    from transformer_nmt.runs.metrics_history import read_metrics

    rows = [(r.step, sorted(r.values)) for r in read_metrics(run / METRICS_FILE)]
    val = ["val_bleu", "val_loss", "val_ppl"]
    assert [r for r in rows if "val_loss" in r[1]] == [
        (2, val),
        (4, sorted([*val, "val_bleu_beam"])),
    ]


def test_corrupt_newest_checkpoint_is_named_and_not_skipped(
    corpus: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=5)) == 0
    bad = run / "checkpoints" / "step=00000010.ckpt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    capsys.readouterr()
    assert main(train_argv(corpus, run, max_steps=15)) == 2
    err = capsys.readouterr().err
    assert "step=00000010.ckpt" in err and "cannot be read" in err
    assert "delete it (or move it away) to resume from the previous one" in err
    assert err.rstrip().endswith("step=00000005.ckpt")
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == [
        "step=00000005.ckpt",
        "step=00000010.ckpt",
    ]
    # where the previous one was kept for averaging (weights only) it cannot resume either
    other = tmp_path / "other"
    assert main(train_argv(corpus, other, max_steps=10)) == 0
    (other / "checkpoints" / "step=00000010.ckpt").write_bytes(b"PK\x03\x04 broken later")
    capsys.readouterr()
    assert main(train_argv(corpus, other, max_steps=20)) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith(
        f"move {other / 'checkpoints'} aside to train this run from scratch"
    )
