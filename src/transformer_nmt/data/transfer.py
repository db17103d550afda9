"""Moving a file's bytes: from a mirror directory, or from a URL with resume and retries.

A URL is fetched into ``<name>.part``; a cut connection is continued with an HTTP Range request
(``If-Range`` guards against a file that changed on the server; ``<name>.part.json`` remembers
the URL and the server's validators). Transient errors (timeouts, cut or refused connections,
HTTP 5xx/429) are retried with exponential backoff; an attempt that received data does not use
up a retry. A progress line gives MB, MB/s and the ETA. What the bytes must be (checksums, the
lock file) is ``data/download.py``'s concern.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from transformer_nmt.errors import DataError
from transformer_nmt.io_utils import read_json_object
from transformer_nmt.progress import Progress

log = logging.getLogger(__name__)

MIRROR_ENV = "TRANSFORMER_NMT_MIRROR"
PART_SUFFIX = ".part"
CHUNK = 1 << 20
_MAX_DELAY_S = 60.0
_PROGRESS_EVERY_S = 30.0


def copy_with_progress(
    src: BinaryIO, dst: BinaryIO, total: int | None, label: str, initial: int = 0
) -> int:
    """Copy to the end of ``src``; returns the bytes copied. Progress: a bar on a terminal; in
    a log file a line every 10% (64 MB of an unknown size) and at least every 30 s."""
    copied = 0
    with Progress(
        total, label, unit="MB", scale=1e6, report_every=64 * CHUNK, initial=initial,
        every_s=_PROGRESS_EVERY_S,
    ) as progress:  # fmt: skip
        while chunk := src.read(CHUNK):
            dst.write(chunk)
            copied += len(chunk)
            progress(len(chunk))
    return copied


def fetch_mirror(path: Path, part: Path) -> None:
    """Copy the mirror's file ``path`` into ``part`` (a DataError names a missing one)."""
    if not path.parent.parent.is_dir():
        raise DataError(f"mirror directory {path.parent.parent} does not exist")
    if not path.is_file():
        raise DataError(f"{path}: file missing from the mirror")
    try:
        with open(path, "rb") as src, open(part, "wb") as dst:
            copy_with_progress(src, dst, path.stat().st_size, path.name)
    except BaseException:
        part.unlink(missing_ok=True)  # a local copy: cheap to redo, never resumed
        raise


class _Transient(Exception):
    """A network error worth retrying; ``received``: bytes this attempt added to the file."""

    def __init__(self, message: str, received: int = 0) -> None:
        super().__init__(message)
        self.received = received


def part_meta_path(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def _resume_state(part: Path, url: str) -> tuple[int, str | None]:
    """(bytes to continue from, If-Range validator): 0 unless ``part`` was fetched from
    ``url``."""
    state = read_json_object(part_meta_path(part))
    if not part.is_file() or state.get("url") != url:
        return 0, None
    return part.stat().st_size, state.get("etag") or state.get("last_modified")


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """(first byte, total size) of a ``Content-Range: bytes a-b/n`` (or ``bytes */n``) header."""
    match = re.fullmatch(r"\s*bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)\s*", value or "")
    if match is None:
        return None, None
    first, total = match.groups()
    return (int(first) if first else None), (int(total) if total and total != "*" else None)


def _fetch_url_once(url: str, part: Path, timeout: float) -> None:
    """One attempt: continue ``part`` from where it ends (or start it), to the file's end."""
    offset, validator = _resume_state(part, url)
    headers = {"User-Agent": "transformer_nmt"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if validator:
            headers["If-Range"] = validator
    received = 0
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout
        ) as response:
            length = response.headers.get("Content-Length")
            remaining = int(length) if length else None
            if response.status == 206:
                first, total = _content_range(response.headers.get("Content-Range"))
                if first != offset:
                    part.unlink(missing_ok=True)
                    raise _Transient(
                        f"the server answered the request for bytes {offset}- from byte "
                        f"{first}; restarting from zero"
                    )
            else:
                if offset:
                    log.warning(
                        "%s: the server ignored the Range request for bytes %d- (or the file "
                        "changed there); restarting the download from zero",
                        url, offset,
                    )  # fmt: skip
                offset = 0
                total = remaining
            if total is None and remaining is not None:
                total = offset + remaining
            state = {"url": url, "total": total, "etag": response.headers.get("ETag"),
                     "last_modified": response.headers.get("Last-Modified")}  # fmt: skip
            part_meta_path(part).write_text(json.dumps(state), encoding="utf-8")
            if offset:
                log.info("%s: continuing at %.1f MB of %s", url, offset / 1e6, part)
            with open(part, "r+b" if offset else "wb") as dst:
                dst.seek(offset)
                dst.truncate()
                counter = _Counting(response)
                try:
                    copy_with_progress(counter, dst, total, Path(url).name, initial=offset)
                finally:
                    received = counter.count
        if total is not None and offset + received != total:  # a cut connection: continue it
            raise _Transient(
                f"received {offset + received} of the {total} bytes the server announced",
                received,
            )
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:  # nothing after `offset`: is the part already whole?
            _, total = _content_range(err.headers.get("Content-Range"))
            if total == offset:
                return
            part.unlink(missing_ok=True)
            raise _Transient("HTTP 416 for the rest of the file; restarting from zero") from err
        if err.code >= 500 or err.code == 429:
            raise _Transient(f"HTTP {err.code} {err.reason}") from err
        raise DataError(f"{url}: HTTP {err.code} {err.reason}") from err
    except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as err:
        message = str(getattr(err, "reason", err)) or type(err).__name__
        raise _Transient(message, received) from err


class _Counting:
    """A readable stream that counts what was read from it (also when a read fails later)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream, self.count = stream, 0

    def read(self, size: int) -> bytes:
        chunk = self.stream.read(size)
        self.count += len(chunk)
        return chunk


def fetch_url(
    url: str,
    part: Path,
    *,
    timeout: float,
    retries: int,
    backoff: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Fetch ``url`` into ``part`` (continuing it). ``retries``: attempts in a row that may fail
    without bringing the file further than it ever was; the waits between them double from
    ``backoff`` (at most 60 s)."""
    failures = 0
    furthest = part.stat().st_size if part.is_file() else 0
    while True:
        try:
            _fetch_url_once(url, part, timeout)
            return
        except _Transient as err:
            size = part.stat().st_size if part.is_file() else 0
            # progress: continue at once, the retry budget is untouched. A server that ignores
            # Range and cuts again before the furthest point so far makes none.
            if err.received and size > furthest:
                failures, furthest = 0, size
                log.warning("%s: %s; continuing", url, err)
                continue
            if failures == retries:
                kept = part.stat().st_size if part.is_file() else 0
                resume = (
                    f"; the {kept / 1e6:.1f} MB received are kept in {part}, the next run "
                    "continues there"
                    if kept
                    else ""
                )
                raise DataError(
                    f"{url}: download failed after {retries + 1} attempts: {err}{resume}. Without "
                    "network access, copy the files to <mirror>/<dataset>/ and run snakemake "
                    f"with --config data_mirror=<mirror> (or set {MIRROR_ENV})"
                ) from err
            delay = min(backoff * 2**failures, _MAX_DELAY_S)
            failures += 1
            log.warning("%s: %s; retrying in %.1f s", url, err, delay)
            sleep(delay)
