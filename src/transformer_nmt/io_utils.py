"""File helpers every stage shares: atomic writes, reading text lines, file checksums.

Atomic writes: every stage writes to a temporary file beside the target, then renames it, so a
killed job never leaves a half-written output under the final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from transformer_nmt.errors import DataError


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


TEMP_SUFFIX = ".tmp"


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it onto ``target`` on success.

    The temporary file lives beside the target (never in ``$TMPDIR``, often another filesystem
    on clusters, where a rename becomes a copy that a kill can cut short), is flushed to disk
    (fsync) before the rename, and the directory entry after it: the target is either whole or
    absent, also after a crash. On any exception the temporary file is removed and ``target``
    is left untouched; a killed writer's temporary file is removed by ``remove_stale_temps``.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=TEMP_SUFFIX, dir=target.parent
    )
    # mkstemp creates 0600 files; give the output the mode a plain open() would (0666 & ~umask),
    # so results stay readable by the group on shared clusters.
    os.fchmod(fd, 0o666 & ~_current_umask())
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, target)
        _fsync(target.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems cannot fsync a directory; the data file is synced
        if not path.is_dir():
            raise
    finally:
        os.close(fd)


def remove_stale_temps(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files ``atomic_path`` left in ``directory`` when its writer was
    killed (``.<name>.<random>.tmp``); returns what was removed. Call it only while no other
    process writes there (a run holds its run directory's lock)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = [p for p in directory.glob(f".*{TEMP_SUFFIX}") if p.is_file()]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


@contextlib.contextmanager
def atomic_open(
    target: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8"
) -> Iterator[IO[Any]]:
    """Open a temporary file for writing that replaces ``target`` only when the block succeeds."""
    if "b" in mode:
        encoding = None
    with atomic_path(target) as tmp, open(tmp, mode, encoding=encoding) as handle:
        yield handle


def write_json(target: str | os.PathLike[str], payload: Any) -> None:
    """Atomically write ``payload`` as pretty, key-sorted JSON."""
    with atomic_open(target) as handle:
        json.dump(payload, handle, indent=2, sort_keys=True, ensure_ascii=False)
        handle.write("\n")


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """Read a UTF-8 text file as a list of lines without their line endings.

    Lines end at ``\n`` only (``\r\n`` is stripped too); other Unicode line separators
    (U+2028, form feed, ...) stay inside their line, so line i is sentence i.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: invalid UTF-8 ({err.reason})") from err
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start a new one
    return [line.rstrip("\r") for line in lines]


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks (bounded memory for multi-GB archives)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()
