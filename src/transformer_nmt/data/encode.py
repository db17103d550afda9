"""Encode text splits into token-id arrays (``data/token_array.py``) with SentencePiece.

Streaming and parallel: lines are read in chunks, encoded by ``workers`` processes, and written
in input order as they come back (``data/parallel.py``: bounded memory, one code path for any
number of workers). No BOS/EOS in the arrays: they are added at batching.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from itertools import chain, islice
from pathlib import Path

import numpy as np

from transformer_nmt.data.parallel import OrderedMap, ordered_map
from transformer_nmt.data.token_array import TokenArrayWriter, array_paths, token_dtype
from transformer_nmt.data.vocab import load_vocab_info
from transformer_nmt.errors import DataError

log = logging.getLogger(__name__)

CHUNK_LINES = 20_000

_processor = None  # the worker process's SentencePieceProcessor


def _init_worker(model_path: str) -> None:
    import sentencepiece as spm

    global _processor
    _processor = spm.SentencePieceProcessor(model_file=model_path)


def _encode_chunk(job: tuple[str, int, bytes, str]) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids, lengths) of a block of raw lines (from line ``first_line`` on, each ending in
    b"\n" but perhaps the last); DataError names the file and line."""
    path, first_line, block, dtype = job
    try:
        texts = block.decode("utf-8").removesuffix("\n").split("\n")  # one call, split in C
    except UnicodeDecodeError:
        for n, raw in enumerate(block.split(b"\n"), first_line):  # the line to name
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{path}: line {n}: invalid UTF-8 (byte {err.start + 1})") from err
        raise
    assert _processor is not None, "worker not initialised"
    ids = _processor.encode(texts, out_type=int, num_threads=1)  # parallel by processes
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
    return flat, lengths


def _chunks(path: Path, dtype: str) -> Iterator[tuple[str, int, bytes, str]]:
    """``CHUNK_LINES`` lines at a time, joined: one object to ship to a worker, not a list."""
    with open(path, "rb") as handle:  # binary: split at b"\n" only, decode in the workers
        first = 1
        while lines := list(islice(handle, CHUNK_LINES)):
            yield str(path), first, b"".join(lines), dtype
            first += len(lines)


def output_prefix(out_dir: Path, input_path: Path) -> Path:
    """``{split}.{lang}`` -> ``{out_dir}/{split}.{lang}`` (+ .tokens.npy / .offsets.npy)."""
    return out_dir / input_path.name


def _encode_file(path: Path, prefix: Path, vocab_size: int, run: OrderedMap) -> int:
    dtype = token_dtype(vocab_size).str
    n = 0
    with TokenArrayWriter(prefix, vocab_size) as writer:
        for flat, lengths in run(_encode_chunk, _chunks(path, dtype)):
            writer.write_flat(flat, lengths)
            n += len(lengths)
    return n


def encode_files(
    spm_model: str | Path, inputs: Sequence[str | Path], out_dir: str | Path, *, workers: int = 1
) -> dict[str, int]:
    """Encode every input ``{split}.{lang}`` into ``out_dir``; returns name -> sentences.

    On any error, the arrays this call already wrote are removed again: all or nothing.
    """
    info = load_vocab_info(spm_model)
    out_dir = Path(out_dir)
    paths = [Path(p) for p in inputs]
    for path in paths:
        if not path.is_file():
            raise DataError(f"{path}: input to encode not found")
    names = [p.name for p in paths]
    if len(set(names)) != len(names):
        raise DataError(f"inputs {[str(p) for p in paths]} share a file name; outputs would clash")
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    counts: dict[str, int] = {}
    try:
        with ordered_map(workers, _init_worker, (str(spm_model),)) as run:
            for path in paths:
                prefix = output_prefix(out_dir, path)
                counts[path.name] = _encode_file(path, prefix, info.size, run)
                written.append(prefix)
                log.info("%s: %d sentences -> %s.*.npy", path, counts[path.name], prefix)
    except BaseException:
        for prefix in written:
            for out in array_paths(prefix):
                out.unlink(missing_ok=True)
        raise
    return counts
