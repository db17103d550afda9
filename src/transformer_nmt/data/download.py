"""Fetch a dataset's files from their URLs or from a mirror directory, sha256-verified.

Every file is written to a temporary name beside its target, hashed while it is written, and
renamed only once its sha256 matches: a mismatch, a 404, a timeout or a missing mirror file is a
``DataError`` naming the URL or path, and nothing half-written is left. Transient network errors
(timeouts, refused connections, HTTP 5xx/429) are retried with exponential backoff.

Checksums not known in advance (``sha256: null`` in the registry) are recorded by the first
verified download in ``<out_dir>/checksums.lock.json``; every later use verifies against it.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import logging
import os
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
from transformer_nmt.io_utils import atomic_path, sha256_file, write_json
from transformer_nmt.progress import Progress

log = logging.getLogger(__name__)

LOCK_NAME = "checksums.lock.json"
MIRROR_ENV = "TRANSFORMER_NMT_MIRROR"
_CHUNK = 1 << 20


class _Transient(Exception):
    """A network error worth retrying."""


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
        f"that download was bad, fetch and pin again with `snakemake --forcerun "
        f"download_{dataset}` (or delete the file's entry from the lock file)"
    )


def _copy_hashing(src: BinaryIO, dst: BinaryIO, total: int | None, label: str) -> str:
    digest = hashlib.sha256()
    # a bar on a terminal; in a log file a line every 10% (every 64 MB of an unknown size)
    with Progress(total, label, unit="MB", scale=1e6, report_every=64 * _CHUNK) as progress:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            progress(len(chunk))
    return digest.hexdigest()


def _fetch_mirror(path: Path, tmp: Path) -> str:
    if not path.parent.parent.is_dir():
        raise DataError(f"mirror directory {path.parent.parent} does not exist")
    if not path.is_file():
        raise DataError(f"{path}: file missing from the mirror")
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        return _copy_hashing(src, dst, path.stat().st_size, path.name)


def _fetch_url_once(url: str, tmp: Path, timeout: float) -> str:
    request = urllib.request.Request(url, headers={"User-Agent": "transformer_nmt"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response, open(tmp, "wb") as dst:
            length = response.headers.get("Content-Length")
            total = int(length) if length else None
            digest = _copy_hashing(response, dst, total, Path(url).name)
            received = dst.tell()
        if total is not None and received != total:  # a cut connection: retry, never pin it
            raise _Transient(f"received {received} of the {total} bytes the server announced")
        return digest
    except urllib.error.HTTPError as err:
        if err.code >= 500 or err.code == 429:
            raise _Transient(f"HTTP {err.code} {err.reason}") from err
        raise DataError(f"{url}: HTTP {err.code} {err.reason}") from err
    except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as err:
        raise _Transient(str(getattr(err, "reason", err)) or type(err).__name__) from err


def _fetch_url(
    url: str,
    tmp: Path,
    *,
    timeout: float,
    retries: int,
    backoff: float,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    for attempt in range(retries + 1):
        try:
            return _fetch_url_once(url, tmp, timeout)
        except _Transient as err:
            if attempt == retries:
                raise DataError(
                    f"{url}: download failed after {retries + 1} attempts: {err}. Without "
                    "network access, copy the files to <mirror>/<dataset>/ and run snakemake "
                    f"with --config data_mirror=<mirror> (or set {MIRROR_ENV})"
                ) from err
            delay = backoff * 2**attempt
            log.warning("%s: %s; retrying in %.1f s", url, err, delay)
            sleep(delay)
    raise AssertionError("unreachable")


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

    ``expected`` None: the file is about to be pinned, so it is first read to its end as an
    archive (``check_structure``). ``pinned_by_lock``: ``expected`` came from the lock file
    (errors then say how to re-pin)."""
    target = out_dir / spec.name
    if target.is_file() and expected is not None:
        if sha256_file(target) == expected:
            log.info("%s: present and verified", target)
            return expected
        log.warning("%s: sha256 mismatch with %s; fetching it again", target, expected)
    source = str(mirror / dataset / spec.name) if mirror is not None else spec.url
    with atomic_path(target) as tmp:
        if mirror is not None:
            actual = _fetch_mirror(mirror / dataset / spec.name, tmp)
        else:
            actual = _fetch_url(spec.url, tmp, timeout=timeout, retries=retries, backoff=backoff)
        if expected is not None and actual != expected:
            hint = f"; {lock_hint(out_dir, dataset)}" if pinned_by_lock else ""
            raise DataError(
                f"{source}: sha256 {actual} does not match the expected {expected}{hint}"
            )
        if expected is None:
            check_structure(tmp, spec.name, source)  # about to be pinned: it must be whole
    log.info("%s <- %s (sha256 %s)", target, source, actual)
    return actual


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
    if mirror is not None and not mirror.is_dir():
        raise DataError(f"mirror directory {mirror} does not exist")
    lock = read_lock(out_dir)
    sums: dict[str, str] = {}
    for spec in dataset.files.values():
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
    # Always written (also empty): the pipeline declares it an output of the download job, so
    # `snakemake --forcerun download_<dataset>` deletes it and pins afresh.
    write_json(out_dir / LOCK_NAME, lock)
    return sums


def verify_files(dataset: Dataset, raw_dir: str | Path, names: set[str]) -> None:
    """Check the sha256 of the named downloaded files before use (registry or lock file)."""
    raw_dir = Path(raw_dir)
    lock = read_lock(raw_dir)
    for name in sorted(names):
        spec = dataset.files[name]
        path = raw_dir / name
        if not path.is_file():
            raise DataError(f"{path}: not downloaded (run the download stage)")
        expected = expected_sha256(spec, lock, raw_dir)
        if expected is None:
            raise DataError(f"{path}: no sha256 in the registry nor in {raw_dir / LOCK_NAME}")
        if sha256_file(path) != expected:
            hint = f"; {lock_hint(raw_dir, dataset.name)}" if spec.sha256 is None else ""
            raise DataError(f"{path}: sha256 does not match the expected {expected}{hint}")
