"""Atomic writes: every stage writes to a temporary file beside the target, then renames it.

A killed job therefore never leaves a half-written output under the final name.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it onto ``target`` on success.

    On any exception the temporary file is removed and ``target`` is left untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    # mkstemp creates 0600 files; give the output the mode a plain open() would (0666 & ~umask),
    # so results stay readable by the group on shared clusters.
    os.fchmod(fd, 0o666 & ~_current_umask())
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
