"""Reproducibility: per-step reseeding (resume-exact dropout) and the batch trace that tests
use to compare two runs' data order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback


class StepSeed(Callback):
    """Reseeds the RNGs before every micro-batch from (seed, rank, step, batch index).

    Dropout masks are then a function of the training position alone, so a resumed run draws
    the same masks as an uninterrupted one, and ranks draw different ones.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        key = [self.seed, trainer.global_rank, trainer.global_step, batch_idx]
        torch.manual_seed(int(np.random.SeedSequence(key).generate_state(1)[0]))


class BatchTrace(Callback):
    """Debug/test aid: appends each training batch's example indices and shapes, with rank,
    epoch and step, to ``<directory>/rank<R>.jsonl`` (enabled by the train CLI's trace
    variable)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:

        self.directory.mkdir(parents=True, exist_ok=True)
        record = {
            "rank": trainer.global_rank,
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "batch_idx": batch_idx,
            "index": batch["index"].tolist(),
            "shape": {"src": list(batch["src"].shape), "tgt": list(batch["tgt_in"].shape)},
        }
        with open(self.directory / f"rank{trainer.global_rank}.jsonl", "a") as handle:
            handle.write(json.dumps(record) + "\n")
