"""Line readers for raw corpus files: plain text, gzip, WMT SGML and TSV (one column of
``source<TAB>target`` lines, plain or gzip), on disk or inside a tar.

Tar members are streamed straight from the archive (nothing is extracted to disk). Before any
member is read, every member of the archive is checked with the standard library's
``tarfile.data_filter`` (PEP 706): absolute paths, ``..`` escapes and links pointing outside the
archive make the archive unsafe (absolute member names, which ``data_filter`` would
silently make relative, are refused too), and reading it is a ``DataError``.

Lines are split at ``\\n`` only (a trailing ``\\r`` is removed) and decoded as strict UTF-8; an
invalid byte, a truncated or corrupt gzip stream is a ``DamagedFileError`` naming the file and
line; a TSV line without exactly one tab is a ``DamagedFileError`` naming the file and line.
Crawled training corpora are read with ``lenient=True``: a line that is not valid UTF-8
is then yielded as an ``InvalidLine`` (its text with U+FFFD for the bad bytes), which the
prepare stage drops and counts; dev and test sets are always read strictly.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import re
import tarfile
import zlib
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import BinaryIO

from transformer_nmt.data.registry import TSV_FORMATS, Side
from transformer_nmt.errors import DamagedFileError, DataError

# Any absolute directory serves as the pretend extraction root for the safety check.
_CHECK_ROOT = "/transformer_nmt_archive_root"
# WMT SGML: a segment is one line <seg id="1">text</seg>. Same rule as sacrebleu's
# FakeSGMLDataset (sacrebleu/dataset/fake_sgml.py), so references match sacrebleu's test sets:
# the text between the tags, whitespace runs collapsed, no entity unescaping.
_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")
_SPACES = re.compile(r"\s+")
READ_CHUNK_LINES = 10_000  # raw lines read at a time


class InvalidLine(str):
    """A line that is not valid UTF-8 (lenient reading): decoded with U+FFFD replacements.
    ``number``: its 1-based line number."""

    number: int

    def __new__(cls, text: str, number: int) -> InvalidLine:
        line = super().__new__(cls, text)
        line.number = number
        return line

    def __reduce__(self) -> tuple[type[InvalidLine], tuple[str, int]]:  # to worker processes
        return InvalidLine, (str(self), self.number)


def check_archive_members(tar: tarfile.TarFile, archive: Path) -> None:
    """DataError unless every member would extract inside the archive's root directory."""
    for member in tar.getmembers():
        if member.name.startswith(("/", "\\")):  # data_filter would strip it; we refuse it
            raise DataError(f"{archive}: unsafe archive member {member.name!r}: absolute path")
        try:
            tarfile.data_filter(member, _CHECK_ROOT)
        except tarfile.FilterError as err:
            raise DataError(f"{archive}: unsafe archive member {member.name!r}: {err}") from err


@contextlib.contextmanager
def open_member(archive: Path, member: str) -> Iterator[BinaryIO]:
    """A binary stream of one regular-file member of a (possibly compressed) tar archive."""
    if not archive.is_file():
        raise DamagedFileError(f"{archive}: archive not found")
    try:
        tar = tarfile.open(archive, "r:*")  # noqa: SIM115 (closed by the with block below)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise DamagedFileError(f"{archive}: not a readable tar archive ({err})") from err
    with tar:
        try:
            check_archive_members(tar, archive)
            info = tar.getmember(member)
        except KeyError as err:
            raise DamagedFileError(f"{archive}: has no member {member!r}") from err
        except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
            raise DamagedFileError(f"{archive}: corrupt or truncated tar archive ({err})") from err
        stream = tar.extractfile(info)
        if stream is None:
            raise DataError(f"{archive}: member {member!r} is not a regular file")
        yield stream


def decode_line(line: bytes, n: int, side: Side, label: str, lenient: bool) -> str | None:
    """Raw line ``n`` (1-based, terminator included) of ``side`` as text; None for an SGML line
    that holds no segment. Invalid UTF-8 is a DamagedFileError naming ``label`` and the line,
    or with ``lenient`` an ``InvalidLine``."""
    invalid = False
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        if not lenient:
            raise DamagedFileError(
                f"{label}: line {n}: invalid UTF-8 (byte {err.start + 1}: "
                f"{line[err.start : err.start + 1]!r})"
            ) from err
        text, invalid = line.decode("utf-8", errors="replace"), True
    text = text.removesuffix("\n").removesuffix("\r")
    if side.format in TSV_FORMATS:
        fields = text.split("\t")
        if len(fields) != 2:
            raise DamagedFileError(
                f"{label}: line {n}: expected source<TAB>target (one tab), found "
                f"{len(fields) - 1} tabs; fix the line or remove it"
            )
        text = fields[side.column or 0]
    if side.format == "sgml":
        if not text.startswith("<seg "):
            return None
        text = _SPACES.sub(" ", _SEG.sub(r"\1", text).strip())
    return InvalidLine(text, n) if invalid else text


def decode_block(
    block: bytes, first: int, side: Side, label: str, lenient: bool
) -> list[str | None]:
    """``decode_line`` for each raw line of ``block`` (consecutive lines from line ``first``
    on, joined). Plain text that is all valid UTF-8 (nearly every block) is decoded in one call
    and split in C; a block travels to a worker process as one object, not a list of lines."""
    if not block:
        return []
    if side.format in ("text", "gzip"):
        try:
            text = block.decode("utf-8")
        except UnicodeDecodeError:
            pass  # line by line: lenient replacement or the error naming the line
        else:
            decoded: list[str | None] = list(text.removesuffix("\n").split("\n"))
            if "\r" in text:
                decoded = [line.removesuffix("\r") for line in decoded]  # type: ignore[union-attr]
            return decoded
    lines = block.removesuffix(b"\n").split(b"\n")
    return [decode_line(line, n, side, label, lenient) for n, line in enumerate(lines, first)]


@contextlib.contextmanager
def _open_side(raw_dir: str | Path, side: Side) -> Iterator[BinaryIO]:
    """The bytes of one corpus side (a file or a tar member), gunzipped for gzip formats."""
    path = Path(raw_dir) / side.file
    with contextlib.ExitStack() as stack:
        if side.member is None:
            if not path.is_file():
                raise DamagedFileError(f"{path}: raw file not found (run the download stage)")
            raw: BinaryIO = stack.enter_context(open(path, "rb"))
        else:
            raw = stack.enter_context(open_member(path, side.member))
        if side.format in ("gzip", "tsv-gzip"):  # buffered: split into lines in C
            raw = io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), 1 << 20)  # type: ignore[arg-type]
        yield raw


def raw_line_chunks(raw_dir: str | Path, side: Side, size: int) -> Iterator[list[bytes]]:
    """One corpus side's raw lines, terminators kept, ``size`` at a time: split at b"\n" only
    (in C), not decoded (``decode_line`` does that, in whichever process does the work)."""
    label = side_label(raw_dir, side)
    with _open_side(raw_dir, side) as stream:
        n = 0
        while True:
            try:
                chunk = list(islice(stream, size))
            except EOFError as err:
                raise DamagedFileError(f"{label}: truncated gzip stream after line {n}") from err
            except (gzip.BadGzipFile, zlib.error, tarfile.TarError) as err:
                raise DamagedFileError(
                    f"{label}: corrupt compressed data after line {n} ({err})"
                ) from err
            if not chunk:
                return
            yield chunk
            n += len(chunk)


def iter_lines(raw_dir: str | Path, side: Side, *, lenient: bool = False) -> Iterator[str]:
    """The lines (segments, for SGML) of one corpus side, without line terminators.
    ``lenient``: a line that is not UTF-8 comes as an ``InvalidLine`` instead of an error."""
    label = side_label(raw_dir, side)
    first = 1
    for chunk in raw_line_chunks(raw_dir, side, READ_CHUNK_LINES):
        for text in decode_block(b"".join(chunk), first, side, label, lenient):
            if text is not None:
                yield text
        first += len(chunk)


def side_label(raw_dir: str | Path, side: Side) -> str:
    """``<raw_dir>/<file>`` or ``<raw_dir>/<archive>:<member>``: how errors name a side (a
    linked local file by its own path, the one its owner knows)."""
    path = Path(raw_dir) / side.file
    if path.is_symlink():
        path = path.resolve()
    return str(path) if side.member is None else f"{path}:{side.member}"
