"""A training run's life, start to end: decide where it starts (resume), fit, map failures to
clear errors, prune checkpoints and write ``<run-dir>/train_summary.json``.

``train_run`` takes typed arguments and returns the summary (rank 0; None on other ranks). The
CLI (``cli/train.py``) only parses, opens tracking and calls it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from transformer_nmt.data.vocab import VocabInfo
from transformer_nmt.errors import UserFacingError
from transformer_nmt.io_utils import read_json_object, remove_stale_temps, write_json
from transformer_nmt.model.config import ModelConfig
from transformer_nmt.runs.checkpoints import list_checkpoints
from transformer_nmt.runs.layout import CHECKPOINT_DIR, SUMMARY_FILE, TRAIN_LOCK_FILE
from transformer_nmt.training.callbacks import (
    StageRunLogger,
    Throughput,
    TrainingStopped,
    read_last_validation,
    write_last_validation,
)
from transformer_nmt.training.cluster import local_rank
from transformer_nmt.training.config import TrainConfig
from transformer_nmt.training.hardware import GIB
from transformer_nmt.training.module import NonFiniteLossError, TranslationModule
from transformer_nmt.training.preflight import check_fits
from transformer_nmt.training.resolution import Resolved
from transformer_nmt.training.resume import (
    ResumableTranslationDataModule,
    ResumePoint,
    mark_finished,
    prune_checkpoints,
    start_point,
)
from transformer_nmt.training.trainer import build_trainer, build_validation_trainer

if TYPE_CHECKING:
    from transformer_nmt.tracking import StageRun

log = logging.getLogger(__name__)


class TrainingInterrupted(UserFacingError):
    """Training ended before max_steps without an error (interrupted): no summary is written."""


class RunDirectoryBusy(UserFacingError):
    """Another trainer holds the run directory's lock."""


@contextlib.contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """One trainer per run directory: an exclusive ``fcntl`` lock on ``<run_dir>/.train.lock``
    for the whole job. A second trainer (say an orphan of a killed Snakemake, then a re-run)
    fails at once naming the holder, instead of training the same steps into the same files.
    The kernel releases the lock when its process dies, however it dies."""
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(run_dir / TRAIN_LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 (held until exit)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "a process"
        handle.close()
        raise RunDirectoryBusy(
            f"{run_dir}: another trainer is running in this run directory ({holder}); wait for "
            "it to end or stop it, then run again"
        ) from None
    handle.seek(0)
    handle.truncate()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {stamp}\n")
    handle.flush()
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


@dataclass(frozen=True)
class RunData:
    """What a run trains on: the pair's token arrays, its SentencePiece model, the splits."""

    bin_dir: Path
    spm_model: Path
    src: str
    tgt: str
    train_split: str = "train"
    valid_split: str = "valid"


def sized_for(train_cfg: TrainConfig, precision: str) -> TrainConfig:
    """``train_cfg`` sized for the ``precision`` it trains in (``train.by_precision``), the
    values it takes logged."""
    sized = train_cfg.for_precision(precision)
    before = train_cfg.to_dict()
    changed = {k: v for k, v in sized.to_dict().items() if v != before[k]}
    if changed:
        values = ", ".join(f"{key} {value}" for key, value in changed.items())
        log.info("train.by_precision for %s: %s", precision, values)
    return sized


def plan_start(
    run_dir: Path,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    vocab: VocabInfo,
    resolved: Resolved,
) -> ResumePoint:
    """Where the run in ``run_dir`` starts (``resume.start_point``); on rank 0 the checkpoints
    of a run with other settings move aside and a killed writer's temporary files are removed
    (rank 0 holds ``run_dir_lock``). Decide this before opening tracking: a run that starts
    over gets a fresh MLflow run.

    A run with steps to go first passes the pre-flight check of ``plan``
    (``preflight.check_fits``): its worst-case batch at the ``resolved`` micro-batch
    (``resolution.resolve_run``) must fit the device (measured on a GPU, estimated against the
    available RAM on a CPU), else a one-line ConfigError naming ``train.max_tokens``, before any
    step and any MLflow run."""
    train_cfg = resolved.applied_to(train_cfg)
    if rank_zero_only.rank == 0:
        for directory in (run_dir, run_dir / CHECKPOINT_DIR):
            for stale in remove_stale_temps(directory):
                log.warning("removed %s, left by a writer that was killed", stale)
    point = start_point(
        run_dir / CHECKPOINT_DIR,
        model_config=model_cfg.to_dict(),
        vocab_sha256=vocab.sha256,
        train_cfg=train_cfg,
        move_aside=rank_zero_only.rank == 0,
    )
    if point.step < train_cfg.max_steps:
        fit = check_fits(
            model_cfg, train_cfg, vocab.size, resolved.accelerator, resolved.precision,
            processes=resolved.devices, device_index=local_rank(),
        )  # fmt: skip
        log.info(
            "pre-flight: the worst-case batch %d x %d needs %.2f GiB (%s) of %.1f GiB usable",
            fit.batch, fit.width, fit.peak_bytes / GIB, fit.peak_source,
            (fit.usable_bytes or 0) / GIB,
        )  # fmt: skip
    return point


def train_run(
    data: RunData,
    run_dir: Path,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    vocab: VocabInfo,
    *,
    resolved: Resolved,
    start: ResumePoint | None = None,
    tracker: StageRun | None = None,
    callbacks: Sequence[Callback] = (),
    progress_bar: bool = False,
) -> dict[str, Any] | None:
    """Fit (or resume) the run in ``run_dir`` up to ``max_steps`` and write its summary.

    ``resolved``: from ``resolution.resolve_run``, once per run. ``start``: from ``plan_start``
    (computed here when not given). Returns the summary on rank 0, None on the other ranks.
    Raises ``NonFiniteLossError`` (naming the last good checkpoint) or ``TrainingInterrupted``
    instead of writing a summary.
    """
    started = time.monotonic()
    ckpt_dir = run_dir / CHECKPOINT_DIR
    train_cfg = resolved.applied_to(train_cfg)  # max_tokens: auto, sized
    if start is None:
        start = plan_start(run_dir, model_cfg, train_cfg, vocab, resolved)
    resume = start
    datamodule = ResumableTranslationDataModule(
        data.bin_dir,
        data.src,
        data.tgt,
        max_tokens=train_cfg.max_tokens,
        seed=train_cfg.seed,
        train_split=data.train_split,
        valid_split=data.valid_split,
        num_workers=train_cfg.num_workers,
        max_positions=min(train_cfg.max_positions, model_cfg.max_positions),
        pad_multiple=resolved.pad_multiple,
    )
    src_per_batch, tgt_per_batch = datamodule.real_tokens_per_batch()
    resolved = resolved.with_accumulation(train_cfg.tokens_per_update, tgt_per_batch)
    datamodule.accumulation = resolved.accumulation  # whole updates at epoch ends
    log.info(
        "§5.1 batch: %d micro-batch(es) x %d process(es) of ~%.0f source / %.0f target real "
        "tokens = ~%.0f / %.0f per update (tokens_per_update=%d)",
        resolved.accumulation, resolved.world_size, src_per_batch, tgt_per_batch,
        src_per_batch * resolved.accumulation * resolved.world_size,
        tgt_per_batch * resolved.accumulation * resolved.world_size,
        train_cfg.tokens_per_update,
    )  # fmt: skip
    summary: dict[str, Any] = {
        "model_config": model_cfg.to_dict(),
        "train_config": train_cfg.to_dict(),
        "vocab": vocab.to_dict(),
        "accumulate_grad_batches": resolved.accumulation,
        "real_tokens_per_batch": {"src": src_per_batch, "tgt": tgt_per_batch},
        "world_size": resolved.world_size,
        "precision": resolved.precision,
        "resolved": asdict(resolved),  # every "auto" value as this job chose it, with reasons
        "resumed_from": resume.path.name if resume.path else None,
        "superseded": str(resume.superseded) if resume.superseded else None,
        # metric points that a failing MLflow store did not take (None: not tracked)
        "mlflow_points_lost": 0 if tracker is not None else None,
    }
    summary_path = run_dir / SUMMARY_FILE

    def new_module() -> TranslationModule:
        return TranslationModule(
            model_cfg.to_dict(),
            vocab.to_dict(),
            train_cfg.to_dict(),
            spm_model=str(data.spm_model),
            valid_split=data.valid_split,
        )

    if resume.step >= train_cfg.max_steps:
        log.info("%s is at max_steps=%d: only writing the summary", resume.path, resume.step)
        metrics = dict(read_json_object(summary_path).get("metrics", {}))
        validates_last = resume.step % train_cfg.val_every_steps == 0  # as the fit loop did
        last = _validation_metrics(ckpt_dir).get("val/step")
        if not metrics and validates_last and last != resume.step:
            # Killed after the last step's checkpoint, before that step's validation (Lightning
            # saves first): validate its weights now, so the summary reports the final model.
            trainer = build_validation_trainer(train_cfg, resolved=resolved)
            (measured,) = trainer.validate(
                new_module(), datamodule=datamodule, ckpt_path=resume.path, weights_only=True,
                verbose=False,
            )  # fmt: skip
            if rank_zero_only.rank == 0:
                val = {k: float(v) for k, v in measured.items() if k.startswith("val/")}
                write_last_validation(ckpt_dir, resume.step, val)
                if tracker is not None:
                    tracker.log_metrics(val, step=resume.step)
                log.info("validated %s: %s", resume.path.name, _format_metrics(val))
        if rank_zero_only.rank != 0:
            return None
        summary.update(
            final_step=resume.step,
            checkpoints=[p.name for p in resume.checkpoints],
            trained_this_job=False,
            wall_seconds=time.monotonic() - started,
            metrics=metrics or _validation_metrics(ckpt_dir),
        )
        write_json(summary_path, summary)
        return summary
    if resume.path is not None:
        log.info("resuming from %s at step %d", resume.path, resume.step)
    else:
        log.info("no checkpoint in %s: starting at step 0", ckpt_dir)

    L.seed_everything(train_cfg.seed, workers=True, verbose=False)
    module = new_module()
    mlflow_logger = StageRunLogger(tracker) if tracker is not None else None
    trainer = build_trainer(
        train_cfg,
        run_dir,
        resolved=resolved,
        logger=mlflow_logger if mlflow_logger is not None else False,
        callbacks=callbacks,
        enable_progress_bar=progress_bar,
    )
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume.path, weights_only=True)
    except NonFiniteLossError as err:
        raise NonFiniteLossError(f"{err}; last good checkpoint: {_newest(ckpt_dir)}") from err
    except TrainingStopped as err:
        raise TrainingInterrupted(
            f"{err} (newest checkpoint: {_newest(ckpt_dir)}); run the same command again to resume"
        ) from err
    except SIGTERMException as err:  # Lightning's own stop (DDP, or mid-accumulation)
        raise TrainingInterrupted(
            f"stopped by SIGTERM at step {trainer.global_step} (newest checkpoint: "
            f"{_newest(ckpt_dir)}); run the same command again to resume"
        ) from err
    if trainer.global_step < train_cfg.max_steps:  # e.g. Ctrl-C: Lightning returns from fit
        raise TrainingInterrupted(
            f"training stopped at step {trainer.global_step} before max_steps="
            f"{train_cfg.max_steps} (interrupted); newest checkpoint: {_newest(ckpt_dir)}; "
            "run the same command again to resume"
        )
    if not trainer.is_global_zero:
        return None
    kept = prune_checkpoints(ckpt_dir, train_cfg.keep_checkpoints)
    mark_finished(ckpt_dir, train_cfg, int(trainer.global_step))
    # The last logged value of every train/ and val/ metric (no per-step host copies needed).
    metrics = {
        key: float(value)
        for key, value in trainer.callback_metrics.items()
        if key.startswith(("train/", "val/"))
    }
    # A job resumed after the last validation still reports it (LastValidation's file).
    for key, value in _validation_metrics(ckpt_dir).items():
        metrics.setdefault(key, value)
    (throughput,) = [cb for cb in trainer.callbacks if isinstance(cb, Throughput)]
    metrics["train/tgt_tokens_per_s"] = throughput.last_rate
    metrics["train/tgt_tokens_per_s_mean"] = throughput.mean_tgt_tokens_per_s()
    if trainer.precision == "16-mixed":  # updates the loss scaler skipped in this job
        metrics["train/overflow_steps"] = float(module.overflow_steps)
    if mlflow_logger is not None:
        summary["mlflow_points_lost"] = mlflow_logger.points_lost
        if mlflow_logger.points_lost:
            log.warning(
                "MLflow: %d metric point(s) were not logged (first error: %s)",
                mlflow_logger.points_lost, mlflow_logger.first_error,
            )  # fmt: skip
    summary.update(
        final_step=int(trainer.global_step),
        checkpoints=[p.name for p in kept],
        trained_this_job=True,
        train_tokens_this_job=dict(throughput.total_tokens),
        wall_seconds=time.monotonic() - started,
        metrics=metrics,
    )
    write_json(summary_path, summary)
    log.info("wrote %s (final step %d)", summary_path, trainer.global_step)
    return summary


def _newest(ckpt_dir: Path) -> str:
    kept = list_checkpoints(ckpt_dir)
    return kept[-1].name if kept else "none (no checkpoint was written yet)"


def _validation_metrics(ckpt_dir: Path) -> dict[str, float]:
    """The newest validation's metrics, with the step it ran at as ``val/step``."""
    last = read_last_validation(ckpt_dir)
    metrics = dict(last.get("metrics", {}))
    if "step" in last:
        metrics["val/step"] = last["step"]
    return metrics


def _format_metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{key} {value:.4g}" for key, value in sorted(metrics.items()))
