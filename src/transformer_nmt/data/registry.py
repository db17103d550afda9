"""The dataset registry (``config/datasets.yaml``): files, checksums, pairs, splits, corpora.

``load_registry(path)`` validates the whole file and returns typed objects; every problem is a
``ConfigError`` naming the file and the key path (``multi30k.pairs.en-de.splits.train[0].de``).

A file's checksums: ``sha256`` (64 hex digits or null) and, optionally, ``md5`` (32 hex digits,
or ``sacrebleu``: the md5 that the installed sacrebleu's dataset table, ``DATASETS``, pins for
the same URL, looked up when the registry is read, so that nobody copies it by hand).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from transformer_nmt.errors import ConfigError

FORMATS = ("text", "gzip", "sgml")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MD5 = re.compile(r"^[0-9a-f]{32}$")
MD5_FROM_SACREBLEU = "sacrebleu"


@dataclass(frozen=True)
class FileSpec:
    """A file to download: its name under ``resources/<dataset>/``, URL, sha256 and md5 (each
    None when not published)."""

    name: str
    url: str
    sha256: str | None
    md5: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The entry as written under ``files:`` in the registry (md5 resolved, when set)."""
        entry = {"url": self.url, "sha256": self.sha256}
        return entry if self.md5 is None else {**entry, "md5": self.md5}


def sacrebleu_md5(url: str, where: str) -> str:
    """The md5 that sacrebleu's dataset table pins for the archive at ``url``."""
    import sacrebleu
    from sacrebleu.dataset import DATASETS

    for dataset in DATASETS.values():
        for i, data_url in enumerate(dataset.data):
            if data_url == url and dataset.md5 and i < len(dataset.md5):
                return dataset.md5[i]
    raise ConfigError(
        f"{where}: md5 'sacrebleu', but sacrebleu {sacrebleu.__version__} pins no md5 for {url} "
        "(its DATASETS table); give the md5 as 32 hex digits, or null"
    )


def _parse_md5(value: Any, url: str, where: str) -> str | None:
    if value is None or (isinstance(value, str) and _MD5.match(value)):
        return value
    if value == MD5_FROM_SACREBLEU:
        return sacrebleu_md5(url, where)
    raise ConfigError(f"{where}: expected 32 lowercase hex digits, 'sacrebleu' or null")


@dataclass(frozen=True)
class Side:
    """One language side of a corpus: a file, optionally a member inside a tar archive."""

    file: str
    member: str | None
    format: str  # text | gzip | sgml

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "member": self.member, "format": self.format}


@dataclass(frozen=True)
class Corpus:
    name: str
    sides: dict[str, Side]  # language -> side

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **{lang: side.to_dict() for lang, side in self.sides.items()}}


@dataclass(frozen=True)
class Pair:
    name: str  # "en-de"
    src: str
    tgt: str
    splits: dict[str, list[Corpus]]  # train, valid, every test set

    def to_dict(self) -> dict[str, Any]:
        """The pair as written under ``pairs:`` in the registry."""
        return {
            "splits": {
                split: [c.to_dict() for c in corpora] for split, corpora in self.splits.items()
            }
        }


@dataclass(frozen=True)
class Dataset:
    name: str
    description: str
    files: dict[str, FileSpec]
    pairs: dict[str, Pair]
    test_splits: list[str]

    def pair(self, name: str) -> Pair:
        if name not in self.pairs:
            raise ConfigError(
                f"dataset {self.name!r} has no pair {name!r} (pairs: {sorted(self.pairs)})"
            )
        return self.pairs[name]


def _expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}: expected {names}, got {value!r}")
    return value


def _keys(d: dict, required: set[str], optional: set[str], where: str) -> None:
    unknown = sorted(set(d) - required - optional)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}")
    missing = sorted(required - set(d))
    if missing:
        raise ConfigError(f"{where}: missing key(s) {missing}")


def _parse_dataset(name: str, raw: Any, where: str) -> Dataset:
    _expect(raw, dict, where)
    _keys(raw, {"files", "pairs"}, {"description", "test_splits"}, where)
    files: dict[str, FileSpec] = {}
    for fname, spec in _expect(raw["files"], dict, f"{where}.files").items():
        fw = f"{where}.files.{fname}"
        _expect(spec, dict, fw)
        _keys(spec, {"url", "sha256"}, {"md5"}, fw)
        if "/" in fname or fname in (".", ".."):
            raise ConfigError(f"{fw}: file names must be plain names without '/'")
        sha = spec["sha256"]
        if sha is not None and not (isinstance(sha, str) and _SHA256.match(sha)):
            raise ConfigError(f"{fw}.sha256: expected 64 lowercase hex digits or null")
        url = _expect(spec["url"], str, f"{fw}.url")
        md5 = _parse_md5(spec.get("md5"), url, f"{fw}.md5")
        files[fname] = FileSpec(fname, url, sha, md5)
    pairs: dict[str, Pair] = {}
    for pname, praw in _expect(raw["pairs"], dict, f"{where}.pairs").items():
        pw = f"{where}.pairs.{pname}"
        langs = str(pname).split("-")
        if len(langs) != 2 or not all(langs):
            raise ConfigError(f"{pw}: a pair is named <src>-<tgt>, e.g. en-de")
        _expect(praw, dict, pw)
        _keys(praw, {"splits"}, set(), pw)
        splits: dict[str, list[Corpus]] = {}
        for split, corpora in _expect(praw["splits"], dict, f"{pw}.splits").items():
            sw = f"{pw}.splits.{split}"
            if not _expect(corpora, list, sw):
                raise ConfigError(f"{sw}: lists no corpus")
            splits[split] = [
                _parse_corpus(c, langs, files, f"{sw}[{i}]") for i, c in enumerate(corpora)
            ]
        for needed in ("train", "valid"):
            if needed not in splits:
                raise ConfigError(f"{pw}.splits: missing split {needed!r}")
        pairs[pname] = Pair(pname, langs[0], langs[1], splits)
    tests = _expect(raw.get("test_splits", []), list, f"{where}.test_splits")
    for pair in pairs.values():
        for split in tests:
            if split not in pair.splits:
                raise ConfigError(f"{where}.test_splits: pair {pair.name} has no split {split!r}")
    return Dataset(name, str(raw.get("description", "")), files, pairs, list(tests))


def _parse_corpus(raw: Any, langs: list[str], files: dict[str, FileSpec], where: str) -> Corpus:
    _expect(raw, dict, where)
    _keys(raw, {"name", *langs}, set(), where)
    sides = {}
    for lang in langs:
        lw = f"{where}.{lang}"
        side = _expect(raw[lang], dict, lw)
        _keys(side, {"file", "format"}, {"member"}, lw)
        if side["file"] not in files:
            raise ConfigError(f"{lw}.file: {side['file']!r} is not listed under files")
        if side["format"] not in FORMATS:
            raise ConfigError(f"{lw}.format: {side['format']!r} is not one of {FORMATS}")
        member = side.get("member")
        if member is not None:
            _expect(member, str, f"{lw}.member")
        sides[lang] = Side(side["file"], member, side["format"])
    return Corpus(str(raw["name"]), sides)


def load_registry(path: str | Path) -> dict[str, Dataset]:
    """Parse and validate ``config/datasets.yaml``: dataset name -> Dataset."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the dataset registry ({err})") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML ({err})") from err
    _expect(raw, dict, str(path))
    return {name: _parse_dataset(name, d, f"{path}: {name}") for name, d in raw.items()}


def get_dataset(path: str | Path, name: str) -> Dataset:
    registry = load_registry(path)
    if name not in registry:
        raise ConfigError(f"{path}: no dataset {name!r} (datasets: {sorted(registry)})")
    return registry[name]
