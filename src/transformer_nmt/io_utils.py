"""File helpers every stage shares: atomic writes, reading text lines, file checksums.

Atomic writes: every stage writes to a temporary file beside the target, then renames it, so a
killed job never leaves a half-written output under the final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

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
        replace_durably(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def replace_durably(tmp: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Rename a finished file onto ``target`` (same directory), with its data on disk first and
    the directory entry after: ``target`` is whole or absent, also after a crash."""
    tmp, target = Path(tmp), Path(target)
    _fsync(tmp)
    os.replace(tmp, target)
    _fsync(target.parent)


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


def read_json(path: str | os.PathLike[str], missing: str = "") -> Any:
    """The JSON value in ``path``; ``DataError`` naming the file when it is missing (with the
    hint ``missing``), unreadable or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: file not found{f' ({missing})' if missing else ''}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err})") from None
    except OSError as err:
        raise DataError(f"{path}: cannot be read ({err.strerror or err})") from None


def read_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in ``path``; {} when the file is missing, unreadable, not JSON or not
    an object: for records whose absence or damage means that nothing was recorded."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


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


def _decode_line(raw: bytes, name: str, number: int) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{name}:{number}: invalid UTF-8 ({err.reason})") from err
    return text[:-1] if text.endswith("\r") else text


def stream_line_batches(
    stream: BinaryIO, max_lines: int, pause_s: float = 0.05, name: str = "<stdin>"
) -> Iterator[list[str]]:
    """Lines of a byte stream (a pipe, stdin) in batches, as they arrive.

    Lines end at ``\n`` only, as in ``read_lines`` (a trailing ``\r`` is stripped; U+2028, form
    feed, NEL and lone ``\r`` stay inside their line), so batch lines map one to one onto input
    lines. A batch holds at most ``max_lines`` lines and ends early when no further complete line
    arrives within ``pause_s`` seconds, so a producer that writes a line and waits for its
    answer gets it. Invalid UTF-8 raises ``DataError`` naming ``name`` and the line number.
    Streams without a file descriptor are read line by line (batches of ``max_lines``).
    """
    if max_lines < 1:
        raise ValueError(f"max_lines must be >= 1, got {max_lines}")
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    if fd is None:
        yield from _readline_batches(stream, max_lines, name)
        return
    # Raw reads on the descriptor (never through a buffered reader, whose buffer select()
    # cannot see): ``pending`` holds the bytes after the last complete line.
    pending = b""
    batch: list[str] = []
    number = 0
    eof = False
    while not eof:
        wait = pause_s if batch else None  # nothing to hand over yet: block until input
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:  # the input paused: hand over what has arrived
            yield batch
            batch = []
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            eof = True
            if pending:  # a last line without a final newline
                number += 1
                batch.append(_decode_line(pending, name, number))
                pending = b""
        else:
            *complete, pending = (pending + chunk).split(b"\n")
            for raw in complete:
                number += 1
                batch.append(_decode_line(raw, name, number))
        while len(batch) >= max_lines:
            yield batch[:max_lines]
            batch = batch[max_lines:]
    if batch:
        yield batch


def _readline_batches(stream: BinaryIO, max_lines: int, name: str) -> Iterator[list[str]]:
    batch: list[str] = []
    for number, raw in enumerate(iter(stream.readline, b""), start=1):
        batch.append(_decode_line(raw[:-1] if raw.endswith(b"\n") else raw, name, number))
        if len(batch) == max_lines:
            yield batch
            batch = []
    if batch:
        yield batch


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks (bounded memory for multi-GB archives)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()
