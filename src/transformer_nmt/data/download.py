"""Fetch a dataset's files from their URLs or from a mirror directory, checksum-verified.

The bytes move in ``data/transfer.py``: a URL into ``<name>.part`` beside its target,
continued with HTTP Range requests after a cut connection and kept when every retry failed, so
that the next run continues where this one stopped; a mirror file by a local copy.

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
import json
import logging
import os
import tarfile
import zlib
from pathlib import Path

from transformer_nmt.data.registry import Dataset, FileSpec
from transformer_nmt.data.transfer import (
    CHUNK,
    MIRROR_ENV,
    PART_SUFFIX,
    fetch_mirror,
    fetch_url,
    part_meta_path,
)
from transformer_nmt.errors import DataError
from transformer_nmt.io_utils import replace_durably, write_json

log = logging.getLogger(__name__)

LOCK_NAME = "checksums.lock.json"


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
                        while handle is not None and handle.read(CHUNK):
                            pass
        elif name.endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                while handle.read(CHUNK):
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
        while chunk := handle.read(CHUNK):
            sha.update(chunk)
            if md is not None:
                md.update(chunk)
    return sha.hexdigest(), md.hexdigest() if md is not None else None


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
        fetch_mirror(mirror / dataset / spec.name, part)
    else:
        fetch_url(spec.url, part, timeout=timeout, retries=retries, backoff=backoff)
    hint = f"; {lock_hint(out_dir, dataset)}" if pinned_by_lock else ""
    try:
        actual = _verify_download(part, spec, source, expected, hint)
    except DataError:
        part.unlink(missing_ok=True)  # wrong bytes: never continued by a later run
        part_meta_path(part).unlink(missing_ok=True)
        raise
    replace_durably(part, target)
    part_meta_path(part).unlink(missing_ok=True)
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
