"""Where a run resumes: the resume point, checkpoint pruning, and a training loader that
continues mid-epoch.

Resume rules (docs/interfaces.md, docs/design.md):

* A run directory's checkpoints live in ``<run-dir>/checkpoints/step=00001000.ckpt``
  (``checkpoints.CHECKPOINT_DIR``, ``checkpoints.checkpoint_name``). A job that finds
  checkpoints there resumes from the **newest by step**, restoring weights, optimizer, LR
  schedule, loop counters and the data position (epoch and batches consumed in it, see
  ``ResumableDataLoader``).
* A corrupt newest checkpoint is a ``CheckpointError`` naming the file. It does **not** fall
  back to an older one: silently training again over steps already done would hide data loss.
  Delete the corrupt file to resume from the previous checkpoint.
* Checkpoints of another experiment (``checkpoints.experiment_mismatch``: model config or
  vocabulary) in the same directory are a ``CheckpointError``.
* A newest checkpoint already at ``max_steps`` means training is done; one beyond
  ``max_steps`` is a ``ConfigError`` (the run would otherwise have to overwrite newer
  checkpoints with older ones).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from transformer_nmt import checkpoints as ckpt_lib
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)


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
    mismatch = ckpt_lib.experiment_mismatch(
        meta, model_config=model_config, vocab_sha256=vocab_sha256
    )
    if mismatch:
        raise CheckpointError(
            f"{newest}: trained with {mismatch}; use a new run directory or delete its "
            "checkpoints to start over"
        )
    step = int(payload.get("global_step", ckpt_lib.checkpoint_step(newest) or 0))
    if step > max_steps:
        raise ConfigError(
            f"train config key 'max_steps' is {max_steps} but {newest} is already at step {step}; "
            "raise max_steps or use a new run directory (checkpoints are never overwritten by "
            "older ones)"
        )
    return ResumePoint(newest, step, found)


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
