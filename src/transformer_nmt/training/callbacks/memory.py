"""The process's heap during training: freed pages handed back every few updates."""

from __future__ import annotations

import logging

from lightning.pytorch.callbacks import Callback

from transformer_nmt.cpu_memory import release_freed_memory

log = logging.getLogger(__name__)


class ReleaseFreedMemory(Callback):
    """Every ``every`` updates, after the update, the free pages of the process's heap go back
    to the kernel (``cpu_memory.release_freed_memory``; where the allocator is not glibc's, or
    its fast path is off, nothing happens). Batches of many widths strand free holes in a heap
    that keeps freed blocks for speed; this bounds what they cost in memory."""

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = every
        self.releases = 0  # how many times pages were handed back (the tests read it)

    def on_train_start(self, trainer, pl_module) -> None:
        self._previous_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        stepped, self._previous_step = step != self._previous_step, step
        if stepped and step % self.every == 0 and release_freed_memory():
            if not self.releases:
                log.info(
                    "memory: the heap's free pages go back to the kernel every %d updates "
                    "(malloc_trim)", self.every,
                )  # fmt: skip
            self.releases += 1
