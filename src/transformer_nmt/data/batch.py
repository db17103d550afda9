"""The batch format shared by training, validation and translation (no Lightning, no torch
data loading): how sentences become padded id matrices.

A batch is a dict of int64 arrays, right-padded with PAD_ID:
- ``src``     [B, S]: ``x EOS``       (the encoder input; the source ends with EOS),
- ``tgt_in``  [B, T]: ``BOS y``       (the decoder input, shifted right, §3),
- ``tgt_out`` [B, T]: ``y EOS``       (what the decoder must predict),
- ``index``   [B]:    example indices in the split (to find the references).

Translation builds only ``src`` (``source_batch``), in exactly the form training saw.

Widths may be rounded up to a multiple (``padded_width``): padding is masked (attention keys,
the loss), so the numbers do not change, but a few distinct shapes let kernels, compiled graphs
and the CPU's oneDNN primitives be reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from transformer_nmt.data.vocab import BOS_ID, EOS_ID, PAD_ID


def padded_width(width: Any, multiple: int, cap: int | None = None) -> Any:
    """``width`` (an int, or an int array) rounded up to a multiple of ``multiple``, but not past
    ``cap`` (the longest row the model takes) where ``width`` itself fits it."""
    width = np.asarray(width)
    rounded = -(-width // multiple) * multiple
    if cap is not None:
        rounded = np.where(width <= cap, np.minimum(rounded, cap), rounded)
    return int(rounded) if rounded.ndim == 0 else rounded


def pad_flat(
    flat: np.ndarray,
    lengths: np.ndarray,
    *,
    prefix: int | None = None,
    suffix: int | None = None,
    multiple: int = 1,
    cap: int | None = None,
) -> np.ndarray:
    """[B, L] int64 array of rows ``prefix + seq + suffix``, right-padded with PAD_ID, where
    the B sequences are given concatenated (``flat``) with their ``lengths``; L is the longest
    row rounded up to ``multiple`` (``padded_width``)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    start = 1 if prefix is not None else 0
    width = int(lengths.max(initial=0)) + start + (suffix is not None)
    width = padded_width(width, multiple, cap)
    out = np.full((len(lengths), width), PAD_ID, dtype=np.int64)
    cols = np.arange(width)
    # row-major boolean assignment fills row 0, then row 1, ...: the order of ``flat``
    out[(cols >= start) & (cols < start + lengths[:, None])] = flat
    if prefix is not None:
        out[:, 0] = prefix
    if suffix is not None:
        out[np.arange(len(lengths)), start + lengths] = suffix
    return out


def flatten(seqs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sequences -> (their concatenation as int64, their lengths): the input of ``pad_flat``."""
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    if not seqs:
        return np.zeros(0, dtype=np.int64), lengths
    return np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs]), lengths


def training_batch(
    src: np.ndarray,
    src_lengths: np.ndarray,
    tgt: np.ndarray,
    tgt_lengths: np.ndarray,
    indices: Sequence[int],
    *,
    multiple: int = 1,
    cap: int | None = None,
) -> dict[str, np.ndarray]:
    """The batch dict (module docstring) of aligned flat source/target ids and their lengths;
    each side's width rounded up to ``multiple`` (not past ``cap``)."""
    pad = {"multiple": multiple, "cap": cap}
    return {
        "src": pad_flat(src, src_lengths, suffix=EOS_ID, **pad),
        "tgt_in": pad_flat(tgt, tgt_lengths, prefix=BOS_ID, **pad),
        "tgt_out": pad_flat(tgt, tgt_lengths, suffix=EOS_ID, **pad),
        "index": np.asarray(indices, dtype=np.int64),
    }


def source_batch(seqs: Sequence[np.ndarray]) -> torch.Tensor:
    """Encoder input ``x EOS`` [B, S] as a long tensor: the same form at training and
    translation time."""
    return torch.from_numpy(pad_flat(*flatten(seqs), suffix=EOS_ID))
