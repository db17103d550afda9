"""LightningDataModule over the token arrays of one language pair (``results/bin/D/P``).

Batches are dicts of long tensors in the format of ``data/batch.py`` (``src = x EOS``,
``tgt_in = BOS y``, ``tgt_out = y EOS``, ``index``), padded with PAD_ID.

Batch composition comes from ``TokenBatchSampler`` (token-bounded, grouped by length, one
disjoint share per rank). The sampler is given to the DataLoader as its ``sampler`` with
``batch_size=None``, and the dataset fetches a whole batch per index list: one call per batch
(fast), and Lightning finds ``dataloader.sampler.set_epoch`` and calls it every epoch (Lightning
looks for ``set_epoch`` on ``dataloader.sampler`` and ``dataloader.batch_sampler.sampler``).
Use ``Trainer(use_distributed_sampler=False)``: the sampler already splits across ranks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from transformer_nmt.data.batch import training_batch
from transformer_nmt.data.sampler import TokenBatchSampler, row_width_limit
from transformer_nmt.data.token_array import TokenArray
from transformer_nmt.errors import DataError


class PairDataset(Dataset):
    """Aligned source/target token arrays; ``ds[list_of_indices]`` returns a collated batch,
    its widths rounded up to ``pad_multiple`` but not past ``width_cap`` (as the sampler counts
    them)."""

    def __init__(
        self, src: TokenArray, tgt: TokenArray, pad_multiple: int = 1, width_cap: int | None = None
    ) -> None:
        if len(src) != len(tgt):
            raise DataError(
                f"{src.prefix} has {len(src)} sentences but {tgt.prefix} has {len(tgt)}: "
                "source and target token arrays are misaligned"
            )
        self.src, self.tgt = src, tgt
        self.pad_multiple, self.width_cap = pad_multiple, width_cap

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
        """The batch of ``indices`` as int64 numpy arrays (``NumpyBatchLoader`` makes them
        tensors)."""
        src, src_len = self.src.gather(indices)
        tgt, tgt_len = self.tgt.gather(indices)
        return training_batch(
            src, src_len, tgt, tgt_len, indices, multiple=self.pad_multiple, cap=self.width_cap
        )


def _identity(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return batch


class NumpyBatchLoader(DataLoader):
    """DataLoader whose workers send numpy batches, turned into tensors in the main process.

    Sending four small tensors per batch from a worker goes through torch's shared-memory
    transfer, about 3x slower per batch than pickling numpy arrays through the worker's pipe
    (measured with benchmarks/bench_data.py); ``torch.from_numpy`` in the main process is free.
    """

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:  # type: ignore[override]
        for batch in super().__iter__():
            yield {key: torch.from_numpy(value) for key, value in batch.items()}


class TranslationDataModule(L.LightningDataModule):
    """Train/valid loaders over ``{bin_dir}/{split}.{lang}.tokens.npy`` + offsets.

    ``max_tokens``: per device per batch, counting padding (§5.1). ``max_positions``: longest
    side (with BOS/EOS) the model accepts; longer examples are dropped with a warning.
    ``accumulation``: micro-batches per optimizer step; each epoch's training batches per rank
    are padded to a multiple of it (set it once resolved, before fitting). ``pad_multiple``:
    batch widths are rounded up to a multiple of it (few distinct shapes; padding is masked).
    """

    def __init__(
        self,
        bin_dir: str | Path,
        src_lang: str,
        tgt_lang: str,
        max_tokens: int = 4096,
        seed: int = 1,
        train_split: str = "train",
        valid_split: str = "valid",
        num_workers: int = 0,
        max_positions: int = 1024,
        pad_multiple: int = 1,
    ) -> None:
        super().__init__()
        self.bin_dir = Path(bin_dir)
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.max_tokens, self.seed = max_tokens, seed
        self.train_split, self.valid_split = train_split, valid_split
        self.num_workers, self.max_positions = num_workers, max_positions
        self.pad_multiple = pad_multiple
        self.accumulation = 1
        self._datasets: dict[str, PairDataset] = {}
        self.samplers: dict[str, TokenBatchSampler] = {}

    def rank_and_world_size(self) -> tuple[int, int]:
        """(global rank, world size) of the attached trainer, else (0, 1)."""
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    def dataset(self, split: str) -> PairDataset:
        """The (cached) aligned token arrays of ``split``."""
        if split not in self._datasets:
            self._datasets[split] = PairDataset(
                TokenArray(self.bin_dir / f"{split}.{self.src_lang}"),
                TokenArray(self.bin_dir / f"{split}.{self.tgt_lang}"),
                pad_multiple=self.pad_multiple,
                width_cap=row_width_limit(self.max_tokens, self.max_positions),
            )
        return self._datasets[split]

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit"):
            self.dataset(self.train_split)
        if stage in (None, "fit", "validate"):
            self.dataset(self.valid_split)

    def batch_sampler(self, split: str, *, shuffle: bool) -> TokenBatchSampler:
        """A new token-batch sampler over ``split`` for this process's rank."""
        ds = self.dataset(split)
        rank, world_size = self.rank_and_world_size()
        sampler = TokenBatchSampler(
            ds.src.lengths,
            ds.tgt.lengths,
            max_tokens=self.max_tokens,
            shuffle=shuffle,
            seed=self.seed,
            rank=rank,
            world_size=world_size,
            max_positions=self.max_positions,
            multiple_of=self.accumulation if split == self.train_split and shuffle else 1,
            pad_multiple=self.pad_multiple,
            name=f"{self.bin_dir}/{split}",
        )
        self.samplers[split] = sampler
        return sampler

    def real_tokens_per_batch(self, split: str | None = None) -> tuple[float, float]:
        """Real source/target tokens of an average batch of ``split`` (default: train), over
        the batches of all ranks."""
        return self.batch_sampler(split or self.train_split, shuffle=False).real_tokens_per_batch()

    def dataloader(self, split: str, *, shuffle: bool) -> NumpyBatchLoader:
        return NumpyBatchLoader(
            self.dataset(split),
            sampler=self.batch_sampler(split, shuffle=shuffle),
            batch_size=None,  # the sampler yields whole batches; the dataset collates them
            collate_fn=_identity,  # keep numpy (see NumpyBatchLoader)
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> NumpyBatchLoader:
        return self.dataloader(self.train_split, shuffle=True)

    def val_dataloader(self) -> NumpyBatchLoader:
        return self.dataloader(self.valid_split, shuffle=False)
