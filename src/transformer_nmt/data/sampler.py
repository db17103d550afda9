"""Token-bounded batches of similar-length sentence pairs (§5.1 "batched together by
approximate sequence length ... approximately 25000 source tokens and 25000 target tokens").

Per device, a batch holds at most ``max_tokens`` tokens *counting padding*: with the lengths
the model sees (source ``x EOS``, target ``BOS y`` / ``y EOS``, so each side is one token longer
than its token array entry), ``batch_size * max(longest source, longest target) <= max_tokens``.
The paper's ~25k tokens per step is ``max_tokens * GPUs * gradient accumulation``.

Batches are built once: pairs are sorted by (source length, target length), ties broken by a
seeded random permutation for training (by index for validation/test), and cut greedily. Each
epoch the *order of batches* is shuffled from ``(seed, epoch)`` (training only; validation and
test keep their deterministic order). Distributed training: every rank draws the same shuffled
list, which is padded by repeating its first batches to a multiple of ``world_size`` so that all
ranks run the same number of steps (as ``torch.utils.data.DistributedSampler`` pads), and rank
``r`` takes ``batches[r::world_size]``: the ranks' shares are disjoint except for those fewer
than ``world_size`` padding repeats, and together they cover every batch. With gradient
accumulation the padding is to a multiple of ``world_size * multiple_of`` (the accumulation), so
that no optimizer step at an epoch's end sums fewer micro-batches than the others.

With ``pad_multiple`` > 1 a batch's widths are rounded up to a multiple of it (the collate
pads to them: ``data/batch.py``, ``padded_width``) and counted rounded here: the same
``max_tokens`` bound holds for what the model computes, and an epoch has few distinct shapes.

Examples too long for the model (a side longer than ``max_positions``) or for any batch (longer
than ``max_tokens``) are dropped once, with one warning that counts them: a corpus outlier must
not crash a run hours in.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import numpy as np

from transformer_nmt.data.batch import padded_width

log = logging.getLogger(__name__)

# Tokens the model adds to each side: EOS after the source; BOS (tgt_in) / EOS (tgt_out).
SRC_EXTRA = 1
TGT_EXTRA = 1


def row_width_limit(max_tokens: int, max_positions: int | None) -> int:
    """The widest row (BOS/EOS included) a batch may hold: ``max_tokens``, and the model's
    ``max_positions`` when given. Longer examples are dropped; rounded widths stop here."""
    return max_tokens if max_positions is None else min(max_tokens, max_positions)


def _cut_batches(widths: np.ndarray, max_tokens: int, chunk: int = 1 << 20) -> np.ndarray:
    """Greedy cut of length-sorted examples: returns batch boundaries ``[0, b1, ..., n]``.

    (A Python loop, chunk by chunk so that no list of all widths is held: ~1 s per 4.5M.)
    """
    bounds = [0]
    start, longest = 0, 0
    for base in range(0, len(widths), chunk):
        for i, width in enumerate(widths[base : base + chunk].tolist(), base):
            longest_with_i = max(longest, width)
            if (i - start + 1) * longest_with_i > max_tokens:  # padded size if i joined
                bounds.append(i)
                start, longest_with_i = i, width
            longest = longest_with_i
    if len(widths) > start:
        bounds.append(len(widths))
    return np.asarray(bounds, dtype=np.int64)


class TokenBatchSampler:
    """Yields lists of example indices; ``len`` is the number of batches of this rank per epoch.

    ``src_lengths`` / ``tgt_lengths``: token-array lengths (without BOS/EOS).
    ``shuffle``: training (seeded tie-break and per-epoch batch order) vs. deterministic order.
    """

    def __init__(
        self,
        src_lengths: np.ndarray,
        tgt_lengths: np.ndarray,
        *,
        max_tokens: int,
        shuffle: bool,
        seed: int = 1,
        rank: int = 0,
        world_size: int = 1,
        max_positions: int | None = None,
        multiple_of: int = 1,
        pad_multiple: int = 1,
        name: str = "data",
    ) -> None:
        src_len = np.asarray(src_lengths, dtype=np.int32) + SRC_EXTRA
        tgt_len = np.asarray(tgt_lengths, dtype=np.int32) + TGT_EXTRA
        if src_len.shape != tgt_len.shape or src_len.ndim != 1:
            raise ValueError(
                f"{name}: source and target length arrays differ: {src_len.shape} vs "
                f"{tgt_len.shape}"
            )
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        if multiple_of < 1 or pad_multiple < 1:
            raise ValueError(
                f"multiple_of and pad_multiple must be positive: {multiple_of}, {pad_multiple}"
            )
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.rank, self.world_size, self.epoch = rank, world_size, 0
        # Batches per rank and epoch are padded to a multiple of this (the gradient
        # accumulation): every optimizer step then sums exactly that many micro-batches, also
        # at an epoch's end, so steps stay micro-batches / accumulation and step-based
        # validation and checkpoints fall where the config says.
        self.multiple_of = multiple_of

        width = np.maximum(src_len, tgt_len)  # padded tokens per row of a batch
        limit = row_width_limit(max_tokens, max_positions)
        too_long = width > limit
        self.num_dropped = int(too_long.sum())
        if self.num_dropped:
            log.warning(
                "%s: dropped %d of %d examples longer than %d tokens (max_tokens=%d, "
                "max_positions=%s; lengths include BOS/EOS), e.g. indices %s",
                name,
                self.num_dropped,
                len(width),
                limit,
                max_tokens,
                max_positions,
                np.flatnonzero(too_long)[:5].tolist(),
            )
        keep = np.flatnonzero(~too_long)
        if shuffle:
            tie = np.random.default_rng(seed).permutation(len(keep))
        else:
            tie = np.arange(len(keep))
        # np.lexsort sorts by the last key first: source length, then target length, then tie.
        self.order = keep[np.lexsort((tie, tgt_len[keep], src_len[keep]))]
        # the width the collate pads a batch to: rounded up to pad_multiple, not past the limit
        rounded = padded_width(width[self.order], pad_multiple, limit)
        self.bounds = _cut_batches(rounded, max_tokens)
        # real (non-padding) tokens of the kept examples: x EOS and y EOS
        self.real_tokens = (int(src_len[keep].sum()), int(tgt_len[keep].sum()))

    def real_tokens_per_batch(self) -> tuple[float, float]:
        """Real (non-padding) source and target tokens (``x EOS``, ``y EOS``) of an average
        batch: what §5.1's "25000 source tokens and 25000 target tokens" count."""
        n = max(self.num_batches, 1)
        return self.real_tokens[0] / n, self.real_tokens[1] / n

    @property
    def num_batches(self) -> int:
        """Batches over all ranks before distributed padding."""
        return len(self.bounds) - 1

    def batch(self, b: int) -> list[int]:
        """Example indices of global batch ``b`` (in the unshuffled, length-sorted order)."""
        return self.order[self.bounds[b] : self.bounds[b + 1]].tolist()

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at the start of each epoch: selects the batch-order shuffle."""
        self.epoch = epoch

    def epoch_batch_ids(self) -> np.ndarray:
        """Global batch ids this rank visits this epoch, in order."""
        n = self.num_batches
        ids = np.arange(n)
        if self.shuffle:
            ids = np.random.default_rng([self.seed, self.epoch]).permutation(n)
        total = len(self) * self.world_size
        if total > n:  # pad with the first batches: every rank takes the same, whole steps
            ids = np.resize(ids, total)  # np.resize repeats the array cyclically
        return ids[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[list[int]]:
        for b in self.epoch_batch_ids():
            yield self.batch(int(b))

    def __len__(self) -> int:
        unit = self.world_size * self.multiple_of
        return math.ceil(self.num_batches / unit) * self.multiple_of
