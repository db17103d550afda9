"""Memory-mapped token-id arrays: ``{prefix}.tokens.npy`` + ``{prefix}.offsets.npy``.

Sentence ``i`` is ``tokens[offsets[i]:offsets[i + 1]]`` (no BOS/EOS; they are added at
batching). ``tokens`` is a flat uint16 array when the vocabulary has fewer than 65,536 entries,
else uint32; ``offsets`` is int64 of length n + 1. Readers memory-map both files, so a worker
process costs no copy of the corpus; writers stream, so memory does not grow with the corpus.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from transformer_nmt.errors import DataError
from transformer_nmt.io_utils import atomic_path

TOKENS_SUFFIX = ".tokens.npy"
OFFSETS_SUFFIX = ".offsets.npy"
# Bytes reserved for the .npy header so it can be written after the data has been streamed:
# a version-1.0 header for any 1-D shape fits (numpy pads headers to multiples of 64 bytes).
_HEADER_BYTES = 128


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65,536), else uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def array_paths(prefix: str | Path) -> tuple[Path, Path]:
    """(tokens path, offsets path) of a token array prefix such as ``bin/train.en``."""
    prefix = str(prefix)
    return Path(prefix + TOKENS_SUFFIX), Path(prefix + OFFSETS_SUFFIX)


class TokenArray:
    """Read-only view of one encoded split: ``len``, ``[i] -> np.ndarray``, ``.lengths``.

    Pickles by path (workers reopen the memory map instead of copying the data).
    """

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        self._open()

    def _open(self) -> None:
        tokens_path, offsets_path = array_paths(self.prefix)
        for path in (tokens_path, offsets_path):
            if not path.is_file():
                raise DataError(f"{path}: token array file not found")
        try:
            self.tokens = np.load(tokens_path, mmap_mode="r", allow_pickle=False)
            self.offsets = np.load(offsets_path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as err:
            raise DataError(
                f"{tokens_path} / {offsets_path}: unreadable .npy file ({err})"
            ) from err
        if self.tokens.ndim != 1 or self.tokens.dtype not in (np.uint16, np.uint32):
            raise DataError(
                f"{tokens_path}: expected a 1-D uint16/uint32 array, "
                f"got {self.tokens.dtype} of shape {self.tokens.shape}"
            )
        off = self.offsets
        if off.ndim != 1 or off.dtype != np.int64 or len(off) == 0:
            raise DataError(f"{offsets_path}: expected a non-empty 1-D int64 array")
        lengths = np.diff(off)  # [n] tokens per sentence, without BOS/EOS
        if off[0] != 0 or off[-1] != len(self.tokens) or np.any(lengths < 0):
            raise DataError(
                f"{offsets_path}: offsets must start at 0, never decrease and end at "
                f"{len(self.tokens)} (the length of {tokens_path.name}); got end {off[-1]}"
            )
        # int32 halves the resident memory of 36M-sentence corpora; a sentence is never 2^31 long
        self.lengths = lengths.astype(np.int32)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sentence {i} out of range for {len(self)} sentences")
        i %= len(self)
        return np.asarray(self.tokens[self.offsets[i] : self.offsets[i + 1]])

    def gather(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sentences ``indices`` concatenated (flat ids) and their lengths, in one vectorised
        read of the memory map (the batch loader's hot path)."""
        idx = np.asarray(indices, dtype=np.int64)
        lengths = self.lengths[idx]
        ends = np.cumsum(lengths)  # end of each sentence in the gathered output
        # output position p of row r reads tokens[starts[r] + p - (ends[r] - lengths[r])]
        shift = np.repeat(self.offsets[idx] - (ends - lengths), lengths)
        return self.tokens[shift + np.arange(int(ends[-1]) if len(ends) else 0)], lengths

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self[i]

    def __getstate__(self) -> dict[str, object]:
        return {"prefix": self.prefix}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.prefix = Path(state["prefix"])  # type: ignore[arg-type]
        self._open()


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    """A version-1.0 .npy header for a 1-D array of ``n`` items, padded to ``_HEADER_BYTES``."""
    descr = np.lib.format.dtype_to_descr(dtype)
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': ({n},), }}"
    pad = _HEADER_BYTES - len(np.lib.format.MAGIC_PREFIX) - 2 - 2 - len(text) - 1
    if pad < 0:
        raise ValueError(f"npy header for shape ({n},) does not fit in {_HEADER_BYTES} bytes")
    body = (text + " " * pad + "\n").encode("latin1")
    return np.lib.format.MAGIC_PREFIX + bytes([1, 0]) + len(body).to_bytes(2, "little") + body


class _StreamingNpy:
    """Appends 1-D chunks to a .npy file whose header is written once the length is known."""

    def __init__(self, handle: BinaryIO, dtype: np.dtype) -> None:
        self.handle, self.dtype, self.n = handle, np.dtype(dtype), 0
        handle.write(b"\0" * _HEADER_BYTES)

    def append(self, chunk: np.ndarray) -> None:
        chunk = np.ascontiguousarray(chunk, dtype=self.dtype.newbyteorder("<"))
        self.handle.write(chunk.tobytes())
        self.n += len(chunk)

    def finish(self) -> None:
        self.handle.seek(0)
        self.handle.write(_npy_header(self.dtype.newbyteorder("<"), self.n))
        self.handle.flush()
        os.fsync(self.handle.fileno())


class TokenArrayWriter:
    """Stream sentences into ``{prefix}.tokens.npy`` / ``.offsets.npy`` in bounded memory.

    Both files appear (renamed from temporary files) only when the ``with`` block succeeds.
    """

    def __init__(self, prefix: str | Path, vocab_size: int) -> None:
        self.prefix = Path(prefix)
        self.vocab_size = vocab_size
        self.dtype = token_dtype(vocab_size)
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> TokenArrayWriter:
        tokens_path, offsets_path = array_paths(self.prefix)
        stack = contextlib.ExitStack()
        try:
            tmp_offsets = stack.enter_context(atomic_path(offsets_path))
            tmp_tokens = stack.enter_context(atomic_path(tokens_path))
            self._tokens = _StreamingNpy(stack.enter_context(open(tmp_tokens, "wb")), self.dtype)
            self._offsets = _StreamingNpy(
                stack.enter_context(open(tmp_offsets, "wb")), np.dtype(np.int64)
            )
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        self._offsets.append(np.zeros(1, dtype=np.int64))
        self._end = 0
        return self

    def write_many(self, sentences: Iterable[Iterable[int]]) -> None:
        """Append sentences (each a sequence of ids) in order."""
        lengths, flat = [], []
        for ids in sentences:
            ids = list(ids)
            lengths.append(len(ids))
            flat.extend(ids)
        self.write_flat(np.asarray(flat, dtype=np.int64), np.asarray(lengths, dtype=np.int64))

    def write_flat(self, flat_ids: np.ndarray, lengths: np.ndarray) -> None:
        """Append sentences given as concatenated ids and per-sentence lengths."""
        if len(flat_ids) and (flat_ids.min() < 0 or flat_ids.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        if int(lengths.sum()) != len(flat_ids):
            raise ValueError("lengths do not sum to the number of ids")
        self._tokens.append(flat_ids)
        self._offsets.append(self._end + np.cumsum(lengths, dtype=np.int64))
        self._end += len(flat_ids)

    def __exit__(self, exc_type, exc, tb) -> bool:
        assert self._stack is not None, "TokenArrayWriter used outside a with block"
        stack, self._stack = self._stack, None
        if exc_type is None:
            try:
                self._tokens.finish()
                self._offsets.finish()
            except BaseException as err:
                stack.__exit__(type(err), err, err.__traceback__)  # deletes the temp files
                raise
        return bool(stack.__exit__(exc_type, exc, tb))
