"""The Lightning Trainer of a run: ``TrainConfig``, device/precision/strategy resolution,
gradient accumulation (§5.1), checkpointing every T minutes or N steps (§6.1) and resume.

Resume rules (docs/interfaces.md, DESIGN.md):

* A run directory's checkpoints live in ``<run-dir>/checkpoints/step=00001000.ckpt``. A job
  that finds checkpoints there resumes from the **newest by step**, restoring weights,
  optimizer, LR schedule, loop counters and the data position (epoch and batches consumed in
  it, see ``ResumableDataLoader``); it logs ``resuming from <file> at step N``.
* A corrupt newest checkpoint is a ``CheckpointError`` naming the file. It does **not** fall
  back to an older one: silently training again over steps already done would hide data loss.
  Delete the corrupt file to resume from the previous checkpoint.
* Checkpoints from another model config or vocabulary in the same directory are a
  ``CheckpointError`` (a run directory belongs to one experiment).
* A newest checkpoint already at ``max_steps`` means training is done; one beyond
  ``max_steps`` is a ``ConfigError`` (the run would otherwise have to overwrite newer
  checkpoints with older ones).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from transformer_nmt import checkpoints as ckpt_lib
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.errors import CheckpointError, ConfigError
from transformer_nmt.training.callbacks import LogLines, StepCheckpoint, StepSeed, Throughput

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
PRECISIONS = ("auto", "32-true", "32", "bf16-mixed", "16-mixed", "bf16-true", "64-true")


@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters (keys as in docs/interfaces.md). Defaults = the paper's base."""

    max_steps: int = 100_000  # §5.2: base 100k steps, big 300k
    max_tokens: int = 4096  # tokens (with padding) per device per batch
    # §5.1: ~25k source + ~25k target tokens per optimizer step. Gradient accumulation =
    # ceil(tokens_per_update / (max_tokens * devices * num_nodes)).
    tokens_per_update: int = 25_000
    warmup: int = 4000  # §5.3 warmup_steps
    # Flag (paper: 1.0): multiplies the §5.3 learning-rate schedule.
    lr_scale: float = 1.0
    adam_betas: tuple[float, float] = (0.9, 0.98)  # §5.3
    adam_eps: float = 1e-9  # §5.3
    # Flag (paper: none): clip the gradient norm to this value; null = off.
    clip_grad_norm: float | None = None
    seed: int = 1
    # "auto" = bf16-mixed on GPUs with bf16 (a speed departure from the paper's fp32 P100
    # training, numerically benign), else 32-true; or any Lightning precision string.
    precision: str = "auto"
    accelerator: str = "auto"
    devices: int | str = 1  # int, or "auto" (all visible GPUs / 1 CPU process)
    num_nodes: int = 1
    strategy: str = "auto"  # "auto" = DDP when devices x num_nodes > 1
    checkpoint_every_minutes: float = 10.0  # §6.1: checkpoints at 10-minute intervals
    checkpoint_every_steps: int | None = None  # overrides minutes when set (reproducible)
    keep_checkpoints: int = 5  # must be >= the number averaged (§6.1: 5 base, 20 big)
    val_every_steps: int = 1000
    val_bleu_sentences: int = 0  # greedy validation BLEU on this many sentences; 0 = off
    log_every_steps: int = 100
    num_workers: int = 0
    max_positions: int = 1024

    def __post_init__(self) -> None:
        _validate(self)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build from a JSON mapping; an unknown key is a ConfigError naming it."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"train config must be a mapping, got {type(data).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ConfigError(f"unknown train config key(s) {unknown}; known keys: {sorted(names)}")
        values = dict(data)
        if "adam_betas" in values:
            betas = values["adam_betas"]
            if not isinstance(betas, (list, tuple)) or len(betas) != 2:
                raise ConfigError(f"train config key 'adam_betas' must be [b1, b2], got {betas!r}")
            values["adam_betas"] = tuple(betas)
        return cls(**values)


def _validate(cfg: TrainConfig) -> None:
    def positive_int(key: str, allow_none: bool = False) -> None:
        value = getattr(cfg, key)
        if allow_none and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"train config key {key!r} must be a positive integer, got {value!r}")

    def number(key: str, low: float, high: float, allow_none: bool = False) -> None:
        value = getattr(cfg, key)
        if allow_none and value is None:
            return
        ok = not isinstance(value, bool) and isinstance(value, int | float)
        if not ok or not (low < value < high):
            raise ConfigError(
                f"train config key {key!r} must be a number in ({low}, {high}), got {value!r}"
            )

    for key in ("max_steps", "max_tokens", "tokens_per_update", "warmup", "num_nodes"):
        positive_int(key)
    for key in ("keep_checkpoints", "val_every_steps", "log_every_steps", "max_positions"):
        positive_int(key)
    positive_int("checkpoint_every_steps", allow_none=True)
    for key in ("seed", "val_bleu_sentences", "num_workers"):
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"train config key {key!r} must be an integer >= 0, got {value!r}")
    number("lr_scale", 0.0, math.inf)
    number("adam_eps", 0.0, 1.0)
    number("clip_grad_norm", 0.0, math.inf, allow_none=True)
    number("checkpoint_every_minutes", 0.0, math.inf)
    for i, beta in enumerate(cfg.adam_betas):
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not 0.0 <= beta < 1.0:
            raise ConfigError(f"train config key 'adam_betas'[{i}] must be in [0, 1), got {beta!r}")
    if cfg.devices != "auto" and (
        isinstance(cfg.devices, bool) or not isinstance(cfg.devices, int) or cfg.devices <= 0
    ):
        raise ConfigError(
            f"train config key 'devices' must be a positive integer or 'auto', got {cfg.devices!r}"
        )
    if cfg.precision not in PRECISIONS:
        raise ConfigError(
            f"train config key 'precision' must be one of {list(PRECISIONS)}, got {cfg.precision!r}"
        )
    for key in ("accelerator", "strategy"):
        if not isinstance(getattr(cfg, key), str):
            raise ConfigError(f"train config key {key!r} must be a string")


# --- resolution of the "auto" settings ---------------------------------------------------------


def resolve_accelerator(cfg: TrainConfig) -> str:
    if cfg.accelerator != "auto":
        return cfg.accelerator
    return "gpu" if torch.cuda.is_available() else "cpu"


def resolve_devices(cfg: TrainConfig) -> int:
    """Processes per node: ``devices``, or for "auto" every visible GPU (one CPU process)."""
    if cfg.devices != "auto":
        return int(cfg.devices)
    if resolve_accelerator(cfg) in ("gpu", "cuda"):
        return max(torch.cuda.device_count(), 1)
    return 1


def resolve_precision(cfg: TrainConfig) -> str:
    """ "auto": bf16-mixed on a CUDA device that supports bf16, else 32-true."""
    if cfg.precision != "auto":
        return cfg.precision
    on_gpu = resolve_accelerator(cfg) in ("gpu", "cuda") and torch.cuda.is_available()
    return "bf16-mixed" if on_gpu and torch.cuda.is_bf16_supported() else "32-true"


def world_size(cfg: TrainConfig) -> int:
    return resolve_devices(cfg) * cfg.num_nodes


def accumulation(cfg: TrainConfig) -> int:
    """§5.1 batches of ~tokens_per_update target tokens: micro-batches per optimizer step."""
    return max(1, math.ceil(cfg.tokens_per_update / (cfg.max_tokens * world_size(cfg))))


def resolve_strategy(cfg: TrainConfig) -> Any:
    """ "auto": DDP (gloo on CPU, NCCL on GPU) when several processes train, else Lightning's."""
    if cfg.strategy != "auto":
        return cfg.strategy
    if world_size(cfg) > 1:
        from lightning.pytorch.strategies import DDPStrategy

        backend = "gloo" if resolve_accelerator(cfg) == "cpu" else None
        return DDPStrategy(process_group_backend=backend)
    return "auto"


# --- resumable training data -------------------------------------------------------------------


class _SkipFirst:
    """Sampler wrapper: skips the first ``skip`` batches of the next epoch (once), for resume."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return int(self.sampler.epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        skip, self.skip = self.skip, 0
        for i, batch in enumerate(self.sampler):
            if i >= skip:
                yield batch


class ResumableDataLoader(DataLoader):
    """A DataLoader that Lightning saves and restores (it implements ``state_dict``).

    The state is the sampler's epoch and the number of batches handed to the training loop in
    that epoch; on restore the next epoch iteration starts after those batches, with the same
    per-epoch shuffle. Without it Lightning would replay the interrupted epoch from its start.
    """

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(
            loader.dataset,
            sampler=_SkipFirst(loader.sampler),
            batch_size=None,
            num_workers=loader.num_workers,
            persistent_workers=loader.persistent_workers,
            pin_memory=loader.pin_memory,
        )
        self.consumed = 0

    def __iter__(self):
        self.consumed = self.sampler.skip
        for batch in super().__iter__():
            self.consumed += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch, "consumed": int(self.consumed)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        if consumed >= len(self.sampler):  # saved at the end of an epoch: start the next one
            epoch, consumed = epoch + 1, 0
        self.sampler.set_epoch(epoch)
        self.sampler.skip = consumed
        self.consumed = consumed


class ResumableTranslationDataModule(TranslationDataModule):
    """``TranslationDataModule`` whose training loader resumes mid-epoch."""

    def train_dataloader(self) -> DataLoader:
        return ResumableDataLoader(super().train_dataloader())


# --- the trainer -------------------------------------------------------------------------------


@dataclass
class ResumePoint:
    """Where a run starts: ``path`` None = from scratch."""

    path: Path | None = None
    step: int = 0
    checkpoints: list[Path] = field(default_factory=list)


def find_resume_point(
    checkpoint_dir: Path,
    *,
    model_config: Mapping[str, Any],
    vocab_sha256: str,
    max_steps: int,
) -> ResumePoint:
    """The newest checkpoint of ``checkpoint_dir``, verified readable and of this experiment."""
    found = ckpt_lib.list_checkpoints(checkpoint_dir)
    if not found:
        return ResumePoint(None, 0, [])
    newest = found[-1]
    payload = ckpt_lib.load_checkpoint(newest)  # CheckpointError names a corrupt file
    meta = ckpt_lib.checkpoint_meta(payload, newest)
    if dict(meta["model_config"]) != dict(model_config):
        diff = sorted(
            k
            for k in set(meta["model_config"]) | set(model_config)
            if meta["model_config"].get(k) != model_config.get(k)
        )
        raise CheckpointError(
            f"{newest}: trained with another model config (differs in {diff}); use a new run "
            "directory or delete its checkpoints to start over"
        )
    if meta["vocab"].get("sha256") != vocab_sha256:
        raise CheckpointError(
            f"{newest}: trained with another vocabulary (sha256 {meta['vocab'].get('sha256')}, "
            f"now {vocab_sha256}); use a new run directory or delete its checkpoints"
        )
    step = int(payload.get("global_step", ckpt_lib.checkpoint_step(newest) or 0))
    if step > max_steps:
        raise ConfigError(
            f"train config key 'max_steps' is {max_steps} but {newest} is already at step {step}; "
            "raise max_steps or use a new run directory (checkpoints are never overwritten by "
            "older ones)"
        )
    return ResumePoint(newest, step, found)


def build_trainer(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    logger: Any = False,
    callbacks: Sequence[Callback] = (),
    enable_progress_bar: bool = False,
) -> L.Trainer:
    """A ``lightning.Trainer`` from ``cfg``: checkpoints in ``<run_dir>/checkpoints``."""
    strategy = resolve_strategy(cfg)
    # Under SLURM, Snakemake's executor owns resubmission and a rerun resumes from checkpoints/
    # (find_resume_point): Lightning's own requeue on SIGUSR1, with its hpc_ckpt_*.ckpt files
    # (which it would also prefer on resume), stays off.
    plugins = [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else None
    all_callbacks: list[Callback] = [
        StepCheckpoint(run_dir / CHECKPOINT_DIR, cfg),
        StepSeed(cfg.seed),
        Throughput(cfg.log_every_steps),
        LogLines(cfg.log_every_steps, cfg.max_steps),
        *callbacks,
    ]
    return L.Trainer(
        accelerator=resolve_accelerator(cfg),
        devices=resolve_devices(cfg),
        num_nodes=cfg.num_nodes,
        strategy=strategy,
        plugins=plugins,
        precision=resolve_precision(cfg),
        max_steps=cfg.max_steps,
        max_epochs=-1,
        accumulate_grad_batches=accumulation(cfg),
        gradient_clip_val=cfg.clip_grad_norm,
        gradient_clip_algorithm="norm",
        val_check_interval=cfg.val_every_steps * accumulation(cfg),  # in micro-batches
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


def prune_checkpoints(checkpoint_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (Lightning keeps the resumed-from file
    beyond its top-k); returns the kept ones, oldest first."""
    found = ckpt_lib.list_checkpoints(checkpoint_dir)
    for old in found[:-keep]:
        old.unlink(missing_ok=True)
        log.info("removed old checkpoint %s (keeping the newest %d)", old.name, keep)
    return found[-keep:]


class Stopwatch:
    """Wall time of this job."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def seconds(self) -> float:
        return time.monotonic() - self.start
