"""The Lightning Trainer of a run (``build_trainer``): resolved devices and precision, §5.1
gradient accumulation, step-named checkpoints every T minutes or N steps (§6.1), per-step
reseeding, throughput, log lines and the metrics history (``metrics.csv``). Settings live in
``training/config.py``, resume in ``training/resume.py``, a run's life in ``training/run.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO

from transformer_nmt.cpu_memory import RELEASE_EVERY_STEPS
from transformer_nmt.io_utils import atomic_path
from transformer_nmt.runs.layout import CHECKPOINT_DIR, METRICS_FILE
from transformer_nmt.training.callbacks import (
    LastValidation,
    LogLines,
    MetricsHistory,
    ReleaseFreedMemory,
    StepCheckpoint,
    StepSeed,
    StopOnSignal,
    Throughput,
)
from transformer_nmt.training.cluster import cluster_environment
from transformer_nmt.training.config import TrainConfig
from transformer_nmt.training.resolution import Resolved, strategy_for


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written through ``io_utils.atomic_path``: to a temporary file in the
    checkpoint directory itself, fsynced, then renamed. Lightning's own writer stages the file
    in ``$TMPDIR``, which on clusters is another filesystem: there the final move is a copy,
    and a job killed during it leaves a truncated ``step=N.ckpt`` that every re-run trips on."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        with atomic_path(path) as tmp:
            torch.save(checkpoint, tmp)


def build_validation_trainer(cfg: TrainConfig, *, resolved: Resolved) -> L.Trainer:
    """A ``lightning.Trainer`` that only validates a checkpoint, on the devices and in the
    precision of the run (``resolved``): no callbacks and no logger, since under
    ``trainer.validate`` the step counter is not the run's (Lightning restores the loops only
    when fitting), so the caller records the metrics at the checkpoint's step itself."""
    return L.Trainer(
        accelerator=resolved.accelerator,
        devices=resolved.devices,
        num_nodes=cfg.num_nodes,
        strategy=strategy_for(resolved),
        plugins=[cluster_environment()],
        precision=resolved.precision,
        logger=False,
        callbacks=[],
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,  # the data module shards batches per rank
    )


def build_trainer(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    resolved: Resolved,
    logger: Any = False,
    callbacks: Sequence[Callback] = (),
    enable_progress_bar: bool = False,
) -> L.Trainer:
    """A ``lightning.Trainer`` from ``cfg`` and the run's ``resolved`` values (with their
    accumulation): checkpoints in ``<run_dir>/checkpoints``."""
    if resolved.accumulation is None:
        raise ValueError("the trainer needs the accumulation (Resolved.with_accumulation)")
    # The cluster environment (cluster.py): the same one the pre-flight took its device from.
    plugins: list[Any] = [AtomicCheckpointIO(), cluster_environment()]
    checkpoint = StepCheckpoint(run_dir / CHECKPOINT_DIR, cfg)
    all_callbacks: list[Callback] = [
        checkpoint,
        StopOnSignal(checkpoint),
        LastValidation(run_dir / CHECKPOINT_DIR),
        StepSeed(cfg.seed),
        Throughput(cfg.log_every_steps),
        LogLines(cfg.log_every_steps, cfg.max_steps),
        MetricsHistory(run_dir / METRICS_FILE, cfg.log_every_steps, cfg.max_steps),
        ReleaseFreedMemory(RELEASE_EVERY_STEPS),
        *callbacks,
    ]
    return L.Trainer(
        accelerator=resolved.accelerator,
        devices=resolved.devices,
        num_nodes=cfg.num_nodes,
        strategy=strategy_for(resolved),
        plugins=plugins,
        precision=resolved.precision,
        max_steps=cfg.max_steps,
        max_epochs=-1,
        accumulate_grad_batches=resolved.accumulation,
        gradient_clip_val=cfg.clip_grad_norm,
        gradient_clip_algorithm="norm",
        val_check_interval=cfg.val_every_steps * resolved.accumulation,  # in micro-batches
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=cfg.log_every_steps,
        logger=logger,
        callbacks=all_callbacks,
        enable_progress_bar=enable_progress_bar,
        enable_model_summary=False,
        use_distributed_sampler=False,  # the data module shards batches per rank
        default_root_dir=str(run_dir),
        deterministic=False,
    )
