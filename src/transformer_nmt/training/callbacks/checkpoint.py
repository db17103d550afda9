"""Checkpoints of a run and stopping at one: step-named checkpoints every T minutes or N steps
(§6.1), a stop on SIGTERM/SIGUSR1/SIGINT at an update's end with one checkpoint saved by every
rank together, and the record of the newest validation kept beside the checkpoints."""

from __future__ import annotations

import logging
import signal
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from transformer_nmt.io_utils import read_json_object, write_json
from transformer_nmt.runs.checkpoints import (
    LIGHTNING_FILENAME,
    checkpoint_name,
    demote_to_weights_only,
    list_checkpoints,
)
from transformer_nmt.runs.layout import LAST_VALIDATION_FILE
from transformer_nmt.training.config import TrainConfig

log = logging.getLogger(__name__)


class StepCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` keeping the newest ``keep`` files ``step=00001000.ckpt`` (monitor =
    step, mode max), every N steps or T minutes, plus one at ``max_steps``; never on exception
    (a NaN loss must not leave a checkpoint with NaN weights behind). Only the newest holds the
    training state a resume needs: once a new one is written, rank 0 makes the older ones
    weights-only (§6.1 averages weights; a ``big`` run's 20 full checkpoints with Adam's
    moments would take 3x the disk)."""

    def __init__(self, dirpath: Path, cfg: TrainConfig) -> None:
        every_steps = cfg.checkpoint_every_steps
        super().__init__(
            dirpath=dirpath,
            filename=LIGHTNING_FILENAME,  # checkpoints.checkpoint_name
            auto_insert_metric_name=False,
            monitor="step",
            mode="max",
            save_top_k=cfg.keep_checkpoints,
            every_n_train_steps=every_steps,
            train_time_interval=(
                None if every_steps else timedelta(minutes=cfg.checkpoint_every_minutes)
            ),
            save_on_train_epoch_end=True,  # no epoch-end saves (every_n_epochs is 0) nor deferrals
            save_on_exception=False,
            enable_version_counter=False,
        )

    def _update_best_and_save(self, current, trainer, monitor_candidates) -> None:
        # saves the new checkpoint, then deletes the one beyond the newest ``keep``
        super()._update_best_and_save(current, trainer, monitor_candidates)
        if trainer.is_global_zero:
            for older in list_checkpoints(self.dirpath)[:-1]:
                if demote_to_weights_only(older):
                    log.info("kept %s for averaging, weights only", older.name)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if trainer.global_step >= trainer.max_steps and not self._should_skip_saving_checkpoint(
            trainer
        ):
            self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))


class TrainingStopped(Exception):
    """Raised by ``StopOnSignal`` to end ``fit`` after a SIGINT/SIGTERM (mapped to a clear
    error by ``training.run``)."""

    def __init__(self, signal_name: str, step: int, saved: bool) -> None:
        super().__init__(f"stopped by {signal_name} at step {step}")
        self.signal_name, self.step, self.saved = signal_name, step, saved


class StopOnSignal(Callback):
    """SIGTERM (what SLURM and Snakemake send), SIGUSR1 (what SLURM sends before a time limit
    with ``--signal=USR1@<s>``, profiles/slurm) and SIGINT (Ctrl-C) stop training at the end of
    the current update, where the state is whole: the run saves one checkpoint there, then
    ``fit`` ends with ``TrainingStopped`` (the job exits non-zero, Snakemake's retry resubmits
    it and it resumes from that checkpoint).

    Every rank takes the signals over (Lightning's own SIGTERM handler, which kills the other
    ranks, is replaced). In DDP the ranks agree at each update's end whether any of them got a
    signal (one all-reduce of a flag per update), so all of them stop at the same update and
    save one checkpoint together. A second signal to a rank stops it at once.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self, checkpoint: StepCheckpoint) -> None:
        self.checkpoint = checkpoint
        self._received: str | None = None
        self._previous_handlers: dict[int, Any] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        self._previous_step = trainer.global_step
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.SIGNALS:
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self._received is not None:  # a second signal: stop now
            raise KeyboardInterrupt(f"second {name}")
        self._received = name
        log.warning("%s: stopping at the end of this update (send it again to stop now)", name)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        stepped, self._previous_step = step != self._previous_step, step
        if not stepped or step >= trainer.max_steps:
            return  # mid-accumulation (wait for the update's end), or done anyway
        name = self._received or ("SIGTERM" if trainer.received_sigterm else None)
        if trainer.world_size > 1:  # every rank stops if any rank got a signal
            if not trainer.strategy.reduce_boolean_decision(name is not None, all=False):
                return
            name = name or "a signal to another rank"
        elif name is None:
            return
        # the periodic checkpoint of this step may already be written (rank 0 decides for all)
        saved = (Path(self.checkpoint.dirpath) / checkpoint_name(step)).is_file()
        saved = trainer.strategy.broadcast(saved, src=0)
        if not saved:  # every rank calls the save; rank 0 writes the file
            candidates = self.checkpoint._monitor_candidates(trainer)
            self.checkpoint._save_topk_checkpoint(trainer, candidates)
            saved = True
        raise TrainingStopped(name, step, saved)

    def _restore(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore()


class LastValidation(Callback):
    """Keeps the newest validation's metrics in ``<checkpoints>/last_validation.json``: Lightning
    saves a step's checkpoint before that step's validation, so a job resumed after it (a kill,
    a raised ``max_steps``) would otherwise report no validation at all."""

    def __init__(self, checkpoint_dir: Path) -> None:
        self.path = Path(checkpoint_dir) / LAST_VALIDATION_FILE

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        write_last_validation(self.path.parent, trainer.global_step, metrics)


def write_last_validation(checkpoint_dir: Path, step: int, metrics: dict[str, float]) -> None:
    """Keep ``metrics``, measured on the weights of ``step``, as the newest validation."""
    write_json(Path(checkpoint_dir) / LAST_VALIDATION_FILE, {"step": step, "metrics": metrics})


def read_last_validation(checkpoint_dir: Path) -> dict[str, Any]:
    """What ``LastValidation`` kept ({} when nothing was validated yet)."""
    return read_json_object(Path(checkpoint_dir) / LAST_VALIDATION_FILE)
