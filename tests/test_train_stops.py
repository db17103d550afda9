"""Training runs that stop before max_steps: a NaN loss, a NaN gradient, an early stop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.training_helpers import train_argv
from transformer_nmt.cli import main
from transformer_nmt.runs.checkpoints import list_checkpoints, load_checkpoint


def test_nan_loss_stops_and_keeps_last_good_checkpoint(
    corpus: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from transformer_nmt.training.module import TranslationModule

    original = TranslationModule._loss

    def poisoned(self, batch, **options):
        out = original(self, batch, **options)
        if self.global_step >= 12:  # the 13th update sees a NaN loss
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(TranslationModule, "_loss", poisoned)
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=20)) == 2
    err = capsys.readouterr().err
    assert "non-finite training loss" in err and "at step 13" in err
    assert "last good checkpoint: step=00000010.ckpt" in err
    kept = list_checkpoints(run / "checkpoints")
    assert [p.name for p in kept] == ["step=00000005.ckpt", "step=00000010.ckpt"]
    for value in load_checkpoint(kept[-1])["state_dict"].values():
        assert torch.isfinite(value).all()
    assert not (run / "train_summary.json").exists()


def test_nan_gradient_stops_before_the_optimizer_step(
    corpus: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from transformer_nmt.training.module import TranslationModule

    original = TranslationModule._loss

    def poisoned(self, batch, **options):
        out = original(self, batch, **options)
        if self.global_step >= 7:  # finite loss, NaN gradient: 0 * d/dx sqrt(x) at x = 0
            w = self.model.src_embed.weight[4, 0]
            out.loss = out.loss + 0.0 * torch.sqrt(w * 0.0)
        return out

    monkeypatch.setattr(TranslationModule, "_loss", poisoned)
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=20)) == 2
    err = capsys.readouterr().err
    assert "non-finite gradient norm" in err and "at step 8" in err
    kept = list_checkpoints(run / "checkpoints")
    assert [p.name for p in kept] == ["step=00000005.ckpt"]
    for value in load_checkpoint(kept[-1])["state_dict"].values():
        assert torch.isfinite(value).all()


def test_a_run_stopped_early_writes_no_summary_and_says_how_to_resume(
    corpus: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from transformer_nmt.training.module import TranslationModule

    original = TranslationModule.training_step

    def stopping(self, batch, batch_idx):
        if self.global_step == 7:
            self.trainer.should_stop = True  # as an early-stopping callback or a signal would
        return original(self, batch, batch_idx)

    monkeypatch.setattr(TranslationModule, "training_step", stopping)
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=20)) == 2
    err = capsys.readouterr().err
    assert "before max_steps=20" in err and "newest checkpoint: step=00000005.ckpt" in err
    assert not (run / "train_summary.json").exists()
    monkeypatch.setattr(TranslationModule, "training_step", original)
    assert main(train_argv(corpus, run, max_steps=20)) == 0
    assert json.loads((run / "train_summary.json").read_text())["final_step"] == 20
