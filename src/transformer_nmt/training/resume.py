"""Where a run resumes: the resume point, checkpoint pruning, and a training loader that
continues mid-epoch.

Resume rules (docs/interfaces.md, docs/design.md):

* A run directory's checkpoints live in ``<run-dir>/checkpoints/step=00001000.ckpt``
  (``layout.CHECKPOINT_DIR``, ``checkpoints.checkpoint_name``). A job that finds
  checkpoints there resumes from the **newest by step**, restoring weights, optimizer, LR
  schedule, loop counters and the data position (epoch and batches consumed in it, see
  ``ResumableDataLoader``).
* A corrupt newest checkpoint is a ``CheckpointError`` naming the file. It does **not** fall
  back to an older one: silently training again over steps already done would hide data loss.
  Delete the corrupt file to resume from the previous checkpoint.
* Checkpoints that learned from other settings (model config, vocabulary, or a train setting
  outside ``training.config.RESUMABLE_KEYS``) are moved aside to ``<run>/superseded/<time>/``
  and the run starts from scratch (``start_point``); so does a forced re-run of a finished run.
* A newest checkpoint already at ``max_steps`` means training is done; one beyond
  ``max_steps`` is a ``ConfigError`` (the run would otherwise have to overwrite newer
  checkpoints with older ones).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.errors import CheckpointError, ConfigError
from transformer_nmt.io_utils import read_json_object, write_json
from transformer_nmt.removed_keys import without_removed
from transformer_nmt.runs import checkpoints as ckpt_lib
from transformer_nmt.runs.layout import FINISHED_FILE, SUPERSEDED_DIR
from transformer_nmt.training.config import (
    GEOMETRY_KEYS,
    TrainConfig,
    learning_fingerprint,
    learning_settings,
)

log = logging.getLogger(__name__)


@dataclass
class ResumePoint:
    """Where a run starts: ``path`` None = from scratch. ``superseded``: where the checkpoints of
    an earlier run with other settings were moved (``reason`` says why), else None."""

    path: Path | None = None
    step: int = 0
    checkpoints: list[Path] = field(default_factory=list)
    superseded: Path | None = None
    reason: str | None = None


def _learning_record(payload: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """What the checkpoint's run learned from (``checkpoints.LEARNING_KEY``)."""
    record = payload.get(ckpt_lib.LEARNING_KEY)
    if not (isinstance(record, Mapping) and "fingerprint" in record):
        ckpt_lib.raise_pre_release(path, f"no {ckpt_lib.LEARNING_KEY} record")
    return dict(record)


def _changes(
    payload: Mapping[str, Any],
    path: Path,
    record: Mapping[str, Any],
    *,
    model_config: Mapping[str, Any],
    vocab_sha256: str,
    cfg: TrainConfig,
) -> str:
    """What differs between the run that wrote checkpoint ``path`` and this one: another
    experiment (``checkpoints.experiment_mismatch``) or changed learning settings."""
    meta = ckpt_lib.checkpoint_meta(payload, path)
    mismatch = ckpt_lib.experiment_mismatch(
        meta, model_config=model_config, vocab_sha256=vocab_sha256
    )
    if mismatch:
        return mismatch
    before = without_removed("train", record.get("train") or {})
    now = learning_settings(cfg)
    keys = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    if not keys:
        return ""
    return "changed " + ", ".join(f"train.{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in keys)


def geometry_change(payload: Mapping[str, Any], cfg: TrainConfig) -> str:
    """``train.max_tokens: 3125 -> 12500, ...``: how the batch geometry (``GEOMETRY_KEYS``) of
    this job differs from the one that wrote the checkpoint ``payload``; "" when it does not."""
    before = (payload.get("hyper_parameters") or {}).get("train_config") or {}
    now = cfg.to_dict()
    keys = [k for k in GEOMETRY_KEYS if k in before and before[k] != now[k]]
    return ", ".join(f"train.{k}: {before[k]!r} -> {now[k]!r}" for k in keys)


def start_point(
    checkpoint_dir: Path,
    *,
    model_config: Mapping[str, Any],
    vocab_sha256: str,
    train_cfg: TrainConfig,
    move_aside: bool = True,
) -> ResumePoint:
    """Where a run in ``checkpoint_dir`` starts.

    * No checkpoint: from scratch.
    * The newest checkpoint learned from other settings (``learning_fingerprint``: model
      config, vocabulary, ``learning_settings``): from scratch; the old checkpoints move aside.
    * The run had finished (``FINISHED_FILE``) with exactly these settings: the job runs again
      only because it was asked to (``snakemake --forcerun train``): from scratch, likewise.
    * Else resume from the newest checkpoint (``max_steps`` raised, a killed job, a changed
      logging or checkpoint interval...). A newest checkpoint beyond ``max_steps`` is a
      ConfigError (checkpoints are never overwritten by older ones).

    ``move_aside`` False (DDP ranks other than 0) decides the same without moving anything.
    """
    found = ckpt_lib.list_checkpoints(checkpoint_dir)
    if not found:
        return ResumePoint()
    newest = found[-1]
    try:
        payload = ckpt_lib.load_checkpoint(newest)
    except ckpt_lib.PreReleaseFile:
        raise  # the checkpoints before it are as old: no previous one to resume from
    except CheckpointError as err:
        # Never silently train again over the steps it held: say what to do instead.
        previous = found[-2] if len(found) > 1 else None
        if previous is not None and not _weights_only(previous):
            hint = f"delete it (or move it away) to resume from the previous one {previous.name}"
        else:  # the older ones kept for averaging hold no optimizer state
            hint = f"move {checkpoint_dir} aside to train this run from scratch"
        raise CheckpointError(f"{err}; it is the newest checkpoint of this run: {hint}") from err
    if ckpt_lib.is_weights_only(payload):
        # its full successor is gone (deleted or moved by hand): no optimizer state to resume
        raise CheckpointError(
            f"{newest}: the newest checkpoint holds weights only (kept for averaging; the full "
            f"one after it is gone), so training cannot resume from it: put the newer full "
            f"checkpoint back, or move {checkpoint_dir} aside to train this run from scratch"
        )
    record = _learning_record(payload, newest)
    fingerprint = learning_fingerprint(model_config, vocab_sha256, train_cfg)
    step = int(payload.get("global_step", ckpt_lib.checkpoint_step(newest) or 0))
    reason = None
    changes = ""
    if record["fingerprint"] != fingerprint:
        changes = _changes(
            payload,
            newest,
            record,
            model_config=model_config,
            vocab_sha256=vocab_sha256,
            cfg=train_cfg,
        )
    if changes:
        reason = f"{newest.name} learned from other settings: {changes}"
    elif step >= train_cfg.max_steps and _finished_with(checkpoint_dir, train_cfg):
        reason = (
            f"the run had finished at step {step} with exactly these settings: a forced re-run "
            "(snakemake --forcerun train) trains again from scratch"
        )
    if reason is not None:
        superseded = _move_aside(checkpoint_dir) if move_aside else None
        if superseded is not None:
            log.warning(
                "starting from scratch: %s; its checkpoints moved to %s", reason, superseded
            )
        return ResumePoint(superseded=superseded, reason=reason)
    geometry = geometry_change(payload, train_cfg)
    if geometry and step < train_cfg.max_steps:
        log.warning(
            "resuming from %s at step %d in a new batch geometry (%s): the update's token budget "
            "(train.tokens_per_update %d), the schedule and the optimizer state carry over; the "
            "epoch continues from the same share of its batches",
            newest.name, step, geometry, train_cfg.tokens_per_update,
        )  # fmt: skip
    if step > train_cfg.max_steps:
        raise ConfigError(
            f"train config key 'max_steps' is {train_cfg.max_steps} but {newest} is already at "
            f"step {step}; raise max_steps or use a new run directory (checkpoints are never "
            "overwritten by older ones)"
        )
    return ResumePoint(newest, step, found)


def _weights_only(path: Path) -> bool:
    try:
        return ckpt_lib.is_weights_only(ckpt_lib.load_checkpoint(path, mmap=True))
    except CheckpointError:
        return True  # unreadable: no resume from it either


def _finished_with(checkpoint_dir: Path, cfg: TrainConfig) -> bool:
    return read_json_object(checkpoint_dir / FINISHED_FILE).get("train_config") == cfg.to_dict()


def mark_finished(checkpoint_dir: Path, cfg: TrainConfig, step: int) -> None:
    """Record that the run finished with ``cfg`` (read by ``start_point``)."""
    write_json(checkpoint_dir / FINISHED_FILE, {"train_config": cfg.to_dict(), "step": step})


def _move_aside(checkpoint_dir: Path) -> Path:
    """Move ``<run>/checkpoints`` to ``<run>/superseded/<UTC time>/`` (never deleted)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = checkpoint_dir.parent / SUPERSEDED_DIR / stamp
    suffix = 1
    while target.exists():
        target = checkpoint_dir.parent / SUPERSEDED_DIR / f"{stamp}-{suffix}"
        suffix += 1
    target.parent.mkdir(parents=True, exist_ok=True)
    checkpoint_dir.rename(target)
    return target


def prune_checkpoints(checkpoint_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (Lightning keeps the resumed-from file
    beyond its top-k); returns the kept ones, oldest first."""
    found = ckpt_lib.list_checkpoints(checkpoint_dir)
    for old in found[:-keep]:
        old.unlink(missing_ok=True)
        log.info("removed old checkpoint %s (keeping the newest %d)", old.name, keep)
    return found[-keep:]


# --- resumable training data -------------------------------------------------------------------


class SkipFirstBatches:
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
            sampler=SkipFirstBatches(loader.sampler),
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
        return {
            "epoch": self.sampler.epoch,
            "consumed": int(self.consumed),
            "batches": len(self.sampler),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        saved_batches = int(state.get("batches", len(self.sampler)))
        if saved_batches != len(self.sampler) and saved_batches > 0:
            # Another batch geometry (max_tokens, ranks) cuts the epoch into another number of
            # batches: continue after the same share of the epoch (batches hold similar token
            # counts, so a share of batches is about that share of the data).
            consumed = round(consumed * len(self.sampler) / saved_batches)
        if consumed >= len(self.sampler):  # saved at the end of an epoch: start the next one
            epoch, consumed = epoch + 1, 0
        self.sampler.set_epoch(epoch)
        self.sampler.skip = consumed
        self.consumed = consumed


class ResumableTranslationDataModule(TranslationDataModule):
    """``TranslationDataModule`` whose training loader resumes mid-epoch."""

    def train_dataloader(self) -> DataLoader:
        return ResumableDataLoader(super().train_dataloader())
