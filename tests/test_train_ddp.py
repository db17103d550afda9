"""Two-process DDP training: disjoint batches, one set of checkpoints, reduced validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import checkout_pythonpath
from tests.training_helpers import _dev_bleu, _dev_loss, read_trace, train_argv
from transformer_nmt.runs.checkpoints import list_checkpoints
from transformer_nmt.training.config import STRATEGIES


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_process_ddp_disjoint_batches_and_single_checkpoints(
    corpus: dict[str, Path], tmp_path: Path, strategy: str
) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "TRANSFORMER_NMT_TRACE_BATCHES": str(run / "trace")}
    env["PYTHONPATH"] = checkout_pythonpath()
    argv = train_argv(
        corpus,
        run,
        max_steps=6,
        devices=2,
        strategy=strategy,
        checkpoint_every_steps=3,
        val_every_steps=3,
        val_bleu_sentences=4,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "transformer_nmt", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0 = read_trace(run / "trace" / "rank0.jsonl")
    rank1 = read_trace(run / "trace" / "rank1.jsonl")
    assert len(rank0) == len(rank1) == 6
    seen0 = {i for r in rank0 for i in r["index"]}
    seen1 = {i for r in rank1 for i in r["index"]}
    # 6 of each rank's ~9 batches of epoch 0: no padding repeats, so fully disjoint.
    assert seen0 and seen1 and not seen0 & seen1
    # Checkpoints written once (rank 0), no per-rank duplicates such as step=...-v1.ckpt.
    files = sorted(p.name for p in (run / "checkpoints").iterdir() if p.suffix == ".ckpt")
    assert files == ["step=00000003.ckpt", "step=00000006.ckpt"]
    assert list_checkpoints(run / "checkpoints") == [run / "checkpoints" / f for f in files]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["final_step"] == 6
    # Validation sums are reduced over both ranks: the loss is the whole dev set's, each
    # sentence once, as one process computes it from step 6's weights; BLEU is computed on
    # rank 0 and broadcast.
    step_6 = run / "checkpoints" / "step=00000006.ckpt"
    metrics = summary["metrics"]
    assert metrics["val/loss"] == pytest.approx(_dev_loss(step_6, corpus), rel=1e-5)
    assert metrics["val/bleu"] == pytest.approx(_dev_bleu(step_6, corpus, 4, beam=False), abs=1e-9)
