"""Fetch a dataset's files from their URLs or from a mirror directory, checksum-verified.

A URL is downloaded into ``<name>.part`` beside its target, and a cut connection is continued
with an HTTP Range request (``If-Range`` guards against a file that changed on the server;
``<name>.part.json`` remembers the URL and the server's validators). The ``.part`` file is kept
when every retry failed, so the next run continues where this one stopped; a server that
ignores Range requests restarts the file from zero (said in the log). Transient errors
(timeouts, cut or refused connections, HTTP 5xx/429) are retried with exponential backoff; an
attempt that received data does not use up a retry. A progress line gives MB, MB/s and the ETA.

Only a complete file is verified, over its whole content, and renamed onto its target: sha256
(the registry's or the lock file's) and md5 (the registry's, e.g. sacrebleu's for the WMT test
sets). A mismatch, a 404 or a missing mirror file is a ``DataError`` naming the file; a file that
fails its checksum is deleted, never resumed.

Checksums not known in advance (``sha256: null`` in the registry) are recorded by the first
verified download in ``<out_dir>/checksums.lock.json`` (the log says so); every later use
verifies against it. Before a file is pinned without any published checksum it is read to its
end as an archive (``check_structure``), and an empty file is refused.

A local file (a user's own corpus, ``data/local.py``: ``FileSpec.path``) is read where it is:
``<out_dir>/<name>`` becomes a symbolic link to it and the lock records its current sha256 (the
file, not the first download, is the reference: an edited corpus is pinned afresh, and the
stages after it re-run).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import logging
import os
import re
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from transformer_nmt.data.registry import Dataset, FileSpec
from transformer_nmt.errors import DataError
from transformer_nmt.io_utils import replace_durably, write_json
from transformer_nmt.progress import Progress

log = logging.getLogger(__name__)

LOCK_NAME = "checksums.lock.json"
MIRROR_ENV = "TRANSFORMER_NMT_MIRROR"
_CHUNK = 1 << 20


def read_lock(out_dir: Path) -> dict[str, str]:
    lock = out_dir / LOCK_NAME
    if not lock.is_file():
        return {}
    try:
        data = json.loads(lock.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise DataError(f"{lock}: unreadable checksum lock file ({err})") from err
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise DataError(f"{lock}: expected a JSON object of file name -> sha256")
    return data


def expected_sha256(spec: FileSpec, lock: dict[str, str], out_dir: Path) -> str | None:
    """The registry's sha256, else the lock file's; a disagreement between both is an error."""
    locked = lock.get(spec.name)
    if spec.sha256 and locked and locked != spec.sha256:
        raise DataError(
            f"{out_dir / LOCK_NAME}: records sha256 {locked} for {spec.name}, but the registry "
            f"says {spec.sha256}"
        )
    return spec.sha256 or locked


def check_structure(path: Path, name: str, source: str) -> None:
    """Read a compressed archive to its end before its checksum is pinned: a truncated or
    corrupt first download must fail here, not become the reference for every later one."""
    try:
        if name.endswith((".tgz", ".tar.gz", ".tar", ".tar.bz2", ".tar.xz")):
            with tarfile.open(path) as archive:
                for member in archive:
                    if member.isfile():
                        handle = archive.extractfile(member)
                        while handle is not None and handle.read(_CHUNK):
                            pass
        elif name.endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                while handle.read(_CHUNK):
                    pass
    except (OSError, EOFError, tarfile.TarError, zlib.error) as err:
        raise DataError(
            f"{source}: the download is not a complete {Path(name).suffix} archive "
            f"({type(err).__name__}: {err}); nothing was pinned, run the download again"
        ) from err


def lock_hint(out_dir: Path, dataset: str) -> str:
    """How to re-pin a checksum that the first download recorded."""
    return (
        f"the expected sha256 was pinned by the first download in {out_dir / LOCK_NAME}; if "
        f"that download was bad, {redownload_hint(dataset)} (or delete the file's entry from "
        "the lock file)"
    )


PART_SUFFIX = ".part"
_MAX_DELAY_S = 60.0
_PROGRESS_EVERY_S = 30.0


def redownload_hint(dataset: str) -> str:
    """The command that fetches a dataset's files afresh (and pins unknown checksums again)."""
    return (
        f"fetch the files again with `snakemake --forcerun download_{dataset} ...` (your usual "
        "snakemake arguments; it also pins unknown checksums afresh)"
    )


def file_digests(path: Path, *, md5: bool = False) -> tuple[str, str | None]:
    """(sha256, md5 or None) of a whole file, in one pass."""
    sha = hashlib.sha256()
    md = hashlib.md5(usedforsecurity=False) if md5 else None
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            sha.update(chunk)
            if md is not None:
                md.update(chunk)
    return sha.hexdigest(), md.hexdigest() if md is not None else None


def _copy(src: BinaryIO, dst: BinaryIO, total: int | None, label: str, initial: int = 0) -> int:
    """Copy to the end of ``src``; returns the bytes copied. Progress: a bar on a terminal; in
    a log file a line every 10% (64 MB of an unknown size) and at least every 30 s."""
    copied = 0
    with Progress(
        total, label, unit="MB", scale=1e6, report_every=64 * _CHUNK, initial=initial,
        every_s=_PROGRESS_EVERY_S,
    ) as progress:  # fmt: skip
        while chunk := src.read(_CHUNK):
            dst.write(chunk)
            copied += len(chunk)
            progress(len(chunk))
    return copied


def _fetch_mirror(path: Path, part: Path) -> None:
    if not path.parent.parent.is_dir():
        raise DataError(f"mirror directory {path.parent.parent} does not exist")
    if not path.is_file():
        raise DataError(f"{path}: file missing from the mirror")
    try:
        with open(path, "rb") as src, open(part, "wb") as dst:
            _copy(src, dst, path.stat().st_size, path.name)
    except BaseException:
        part.unlink(missing_ok=True)  # a local copy: cheap to redo, never resumed
        raise


class _Transient(Exception):
    """A network error worth retrying; ``received``: bytes this attempt added to the file."""

    def __init__(self, message: str, received: int = 0) -> None:
        super().__init__(message)
        self.received = received


def _meta_path(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def _resume_state(part: Path, url: str) -> tuple[int, str | None]:
    """(bytes to continue from, If-Range validator): 0 unless ``part`` was fetched from
    ``url``."""
    meta = _meta_path(part)
    try:
        state = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = None
    if not part.is_file() or not isinstance(state, dict) or state.get("url") != url:
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
            _meta_path(part).write_text(json.dumps(state), encoding="utf-8")
            if offset:
                log.info("%s: continuing at %.1f MB of %s", url, offset / 1e6, part)
            with open(part, "r+b" if offset else "wb") as dst:
                dst.seek(offset)
                dst.truncate()
                counter = _Counting(response)
                try:
                    _copy(counter, dst, total, Path(url).name, initial=offset)
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


def _fetch_url(
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


def _verify_download(
    part: Path, spec: FileSpec, source: str, expected: str | None, hint: str
) -> str:
    """The sha256 of a complete download after every check; DataError naming ``source``."""
    if part.stat().st_size == 0:
        raise DataError(f"{source}: the download is empty; nothing was pinned; {hint}")
    actual, md5 = file_digests(part, md5=spec.md5 is not None)
    if expected is not None and actual != expected:
        raise DataError(f"{source}: sha256 {actual} does not match the expected {expected}{hint}")
    if spec.md5 is not None and md5 != spec.md5:
        raise DataError(
            f"{source}: md5 {md5} does not match the published {spec.md5} (config/datasets.yaml; "
            "`md5: sacrebleu` is sacrebleu's); the mirror or server holds another file"
        )
    if expected is None and spec.md5 is None:
        check_structure(part, spec.name, source)  # about to be pinned: it must be whole
    return actual


def download_file(
    spec: FileSpec,
    dataset: str,
    out_dir: Path,
    *,
    mirror: Path | None,
    expected: str | None,
    timeout: float = 60.0,
    retries: int = 4,
    backoff: float = 2.0,
    pinned_by_lock: bool = False,
) -> str:
    """Fetch one file into ``out_dir`` unless a verified copy is there; returns its sha256.

    ``expected``: the sha256 to match (None: the file is about to be pinned; it must then pass
    its md5, or read to its end as an archive). ``pinned_by_lock``: ``expected`` came from the
    lock file (errors then say how to re-pin)."""
    target = out_dir / spec.name
    if target.is_file() and (expected is not None or spec.md5 is not None):
        sha, md5 = file_digests(target, md5=spec.md5 is not None)
        if expected in (None, sha) and md5 == spec.md5:
            log.info("%s: present and verified", target)
            return sha
        log.warning("%s: checksum mismatch; fetching it again", target)
    source = str(mirror / dataset / spec.name) if mirror is not None else spec.url
    part = out_dir / f"{spec.name}{PART_SUFFIX}"
    out_dir.mkdir(parents=True, exist_ok=True)
    if mirror is not None:
        _fetch_mirror(mirror / dataset / spec.name, part)
    else:
        _fetch_url(spec.url, part, timeout=timeout, retries=retries, backoff=backoff)
    hint = f"; {lock_hint(out_dir, dataset)}" if pinned_by_lock else ""
    try:
        actual = _verify_download(part, spec, source, expected, hint)
    except DataError:
        part.unlink(missing_ok=True)  # wrong bytes: never continued by a later run
        _meta_path(part).unlink(missing_ok=True)
        raise
    replace_durably(part, target)
    _meta_path(part).unlink(missing_ok=True)
    log.info("%s <- %s (sha256 %s)", target, source, actual)
    return actual


def link_local_file(spec: FileSpec, dataset: str, out_dir: Path) -> str:
    """``out_dir/<name>`` -> the local file ``spec.path`` (a symbolic link, replaced when it
    points elsewhere); returns the file's sha256. An empty or missing file is a DataError."""
    source = Path(str(spec.path))
    if not source.is_file():
        raise DataError(
            f"{source}: file of dataset {dataset!r} not found; fix its path under "
            f"datasets.{dataset} in the config"
        )
    if source.stat().st_size == 0:
        raise DataError(f"{source}: file of dataset {dataset!r} is empty")
    link = out_dir / spec.name
    if not (link.is_symlink() and Path(os.readlink(link)) == source):
        tmp = out_dir / f".{spec.name}.link"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(source)
        os.replace(tmp, link)
    sha, _ = file_digests(source)
    log.info("%s -> %s (sha256 %s)", link, source, sha)
    return sha


def resolve_mirror(cli_mirror: str | os.PathLike[str] | None) -> Path | None:
    """``--mirror`` (or the config key ``data_mirror``) first, then $TRANSFORMER_NMT_MIRROR."""
    chosen = cli_mirror or os.environ.get(MIRROR_ENV) or None
    return Path(chosen) if chosen else None


def download_dataset(
    dataset: Dataset,
    out_dir: str | Path,
    *,
    mirror: Path | None = None,
    timeout: float = 60.0,
    retries: int = 4,
    backoff: float = 2.0,
) -> dict[str, str]:
    """Fetch every file of ``dataset`` into ``out_dir``; returns file name -> verified sha256."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if mirror is not None and not mirror.is_dir() and not dataset.local:
        raise DataError(f"mirror directory {mirror} does not exist")
    lock = read_lock(out_dir)
    sums: dict[str, str] = {}
    for spec in dataset.files.values():
        if spec.path is not None:
            sums[spec.name] = link_local_file(spec, dataset.name, out_dir)
            if lock.get(spec.name) not in (None, sums[spec.name]):
                log.info("%s: changed since it was pinned; pinned afresh", spec.path)
            lock[spec.name] = sums[spec.name]
            continue
        expected = expected_sha256(spec, lock, out_dir)
        sums[spec.name] = download_file(
            spec,
            dataset.name,
            out_dir,
            mirror=mirror,
            expected=expected,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            pinned_by_lock=spec.sha256 is None and spec.name in lock,
        )
        if spec.sha256 is None and spec.name not in lock:
            lock[spec.name] = sums[spec.name]  # first verified download: record it
            log.info(
                "%s: %s; pinned its sha256 %s in %s: every later download and prepare must "
                "match it (`snakemake --forcerun download_%s` pins afresh)",
                spec.name,
                f"verified by its published md5 {spec.md5}"
                if spec.md5
                else "no published checksum, this first download is trusted",
                sums[spec.name], out_dir / LOCK_NAME, dataset.name,
            )  # fmt: skip
    # Always written (also empty): the pipeline declares it an output of the download job, so
    # `snakemake --forcerun download_<dataset>` deletes it and pins afresh.
    write_json(out_dir / LOCK_NAME, lock)
    return sums


def verify_files(dataset: Dataset, raw_dir: str | Path, names: set[str]) -> None:
    """Check the named downloaded files before use: sha256 (registry or lock file), else md5."""
    raw_dir = Path(raw_dir)
    lock = read_lock(raw_dir)
    for name in sorted(names):
        spec = dataset.files[name]
        path = raw_dir / name
        if not path.is_file():
            raise DataError(f"{path}: not downloaded; {redownload_hint(dataset.name)}")
        expected = expected_sha256(spec, lock, raw_dir)
        if expected is None and spec.md5 is None:
            raise DataError(
                f"{path}: no sha256 in the registry nor in {raw_dir / LOCK_NAME}; "
                f"{redownload_hint(dataset.name)}"
            )
        sha, md5 = file_digests(path, md5=expected is None)
        if expected is not None and sha != expected:
            how = (
                lock_hint(raw_dir, dataset.name)
                if spec.sha256 is None
                else redownload_hint(dataset.name)
            )
            raise DataError(f"{path}: sha256 does not match the expected {expected}; {how}")
        if expected is None and md5 != spec.md5:
            raise DataError(
                f"{path}: md5 does not match the published {spec.md5}; "
                f"{redownload_hint(dataset.name)}"
            )
