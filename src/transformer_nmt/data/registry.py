"""The dataset registry (``config/datasets.yaml``): files, checksums, pairs, splits, corpora.

``load_registry(path)`` validates the whole file and returns typed objects; every problem is a
``ConfigError`` naming the file and the key path (``multi30k.pairs.en-de.splits.train[0].de``).

A file's checksums: ``sha256`` (64 hex digits or null) and, optionally, ``md5`` (32 hex digits,
or ``sacrebleu``: the md5 that the installed sacrebleu's dataset table, ``DATASETS``, pins for
the same URL, looked up when the registry is read, so that nobody copies it by hand).

A user's own corpus (``data/local.py``) is a dataset whose files have a local ``path`` instead
of a ``url`` (read in place: the download stage links them), whose sides may be the two columns
of one TSV file (``format: tsv`` or ``tsv-gzip`` with ``column: 0`` or ``1``), and whose pair may
carve its valid and test sets out of the training data (``carve: {<split>: size}``, ``carve_seed``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from transformer_nmt.errors import ConfigError

# the registry this package ships (config/datasets.yaml of a checkout is a link to it)
DEFAULT_REGISTRY = Path(__file__).with_name("datasets.yaml")
FORMATS = ("text", "gzip", "sgml", "tsv", "tsv-gzip")
TSV_FORMATS = ("tsv", "tsv-gzip")  # one file, source <TAB> target; each side reads one column
TEST_OVERLAP_POLICIES = ("warn", "error")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MD5 = re.compile(r"^[0-9a-f]{32}$")
MD5_FROM_SACREBLEU = "sacrebleu"


@dataclass(frozen=True)
class FileSpec:
    """A file to download: its name under ``resources/<dataset>/``, URL, sha256 and md5 (each
    None when not published). A local file (``path``, absolute) is linked, not downloaded; its
    ``url`` is then the path's ``file://`` URI (the MLflow dataset source)."""

    name: str
    url: str
    sha256: str | None
    md5: str | None = None
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The entry as written under ``files:`` in the registry (md5 resolved, when set)."""
        entry: dict[str, Any] = (
            {"url": self.url, "sha256": self.sha256}
            if self.path is None
            else {"path": self.path, "sha256": self.sha256}
        )
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
    """One language side of a corpus: a file, optionally a member inside a tar archive; for a
    TSV file, the column (0: source, 1: target) this side reads."""

    file: str
    member: str | None
    format: str  # text | gzip | sgml | tsv | tsv-gzip
    column: int | None = None

    def to_dict(self) -> dict[str, Any]:
        entry = {"file": self.file, "member": self.member, "format": self.format}
        return entry if self.column is None else {**entry, "column": self.column}


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
    splits: dict[str, list[Corpus]]  # train, valid, every test set read from files
    # splits drawn from the (cleaned) training data, split -> pairs, in this order (data/local.py)
    carve: dict[str, int] = field(default_factory=dict)
    carve_seed: int = 1
    test_overlap: str = "warn"  # a test pair also in train: warn (count in the log) | error

    def split_names(self) -> list[str]:
        """Every split prepare writes: those read from files, then the carved ones."""
        return [*self.splits, *self.carve]

    def to_dict(self) -> dict[str, Any]:
        """The pair as written under ``pairs:`` in the registry."""
        entry: dict[str, Any] = {
            "splits": {
                split: [c.to_dict() for c in corpora] for split, corpora in self.splits.items()
            }
        }
        if self.carve:
            entry.update(carve=dict(self.carve), carve_seed=self.carve_seed)
        if self.test_overlap != "warn":
            entry["test_overlap"] = self.test_overlap
        return entry


@dataclass(frozen=True)
class Dataset:
    name: str
    description: str
    files: dict[str, FileSpec]
    pairs: dict[str, Pair]
    test_splits: list[str]

    @property
    def local(self) -> bool:
        """A user's own corpus (files on this machine, ``data/local.py``)."""
        return any(spec.path is not None for spec in self.files.values())

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
        if "path" in spec:  # a local file (data/local.py): linked, not downloaded
            _keys(spec, {"path", "sha256"}, set(), fw)
        else:
            _keys(spec, {"url", "sha256"}, {"md5"}, fw)
        if "/" in fname or fname in (".", ".."):
            raise ConfigError(f"{fw}: file names must be plain names without '/'")
        sha = spec["sha256"]
        if sha is not None and not (isinstance(sha, str) and _SHA256.match(sha)):
            raise ConfigError(f"{fw}.sha256: expected 64 lowercase hex digits or null")
        if "path" in spec:
            local = Path(_expect(spec["path"], str, f"{fw}.path"))
            if not local.is_absolute():
                raise ConfigError(f"{fw}.path: expected an absolute path, got {str(local)!r}")
            files[fname] = FileSpec(fname, local.as_uri(), sha, None, str(local))
            continue
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
        _keys(praw, {"splits"}, {"carve", "carve_seed", "test_overlap"}, pw)
        splits: dict[str, list[Corpus]] = {}
        for split, corpora in _expect(praw["splits"], dict, f"{pw}.splits").items():
            sw = f"{pw}.splits.{split}"
            if not _expect(corpora, list, sw):
                raise ConfigError(f"{sw}: lists no corpus")
            splits[split] = [
                _parse_corpus(c, langs, files, f"{sw}[{i}]") for i, c in enumerate(corpora)
            ]
        carve = _parse_carve(praw.get("carve", {}), splits, f"{pw}.carve")
        seed = _expect(praw.get("carve_seed", 1), int, f"{pw}.carve_seed")
        policy = praw.get("test_overlap", "warn")
        if policy not in TEST_OVERLAP_POLICIES:
            raise ConfigError(
                f"{pw}.test_overlap: {policy!r} is not one of {TEST_OVERLAP_POLICIES}"
            )
        if "train" not in splits:
            raise ConfigError(f"{pw}.splits: missing split 'train'")
        if "valid" not in splits and "valid" not in carve:
            raise ConfigError(f"{pw}.splits: missing split 'valid' (or carve it: carve.valid)")
        pairs[pname] = Pair(pname, langs[0], langs[1], splits, carve, seed, policy)
    tests = _expect(raw.get("test_splits", []), list, f"{where}.test_splits")
    for pair in pairs.values():
        for split in tests:
            if split not in pair.split_names():
                raise ConfigError(f"{where}.test_splits: pair {pair.name} has no split {split!r}")
    return Dataset(name, str(raw.get("description", "")), files, pairs, list(tests))


def _parse_carve(raw: Any, splits: dict[str, list[Corpus]], where: str) -> dict[str, int]:
    """``carve: {<split>: pairs}``: splits drawn from the training data, none also read from
    files, each of at least one pair."""
    carve = {}
    for split, size in _expect(raw, dict, where).items():
        if split == "train" or split in splits:
            raise ConfigError(f"{where}.{split}: the split is also read from files (or is train)")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"{where}.{split}: expected a number of pairs >= 1, got {size!r}")
        carve[str(split)] = size
    return carve


def _parse_corpus(raw: Any, langs: list[str], files: dict[str, FileSpec], where: str) -> Corpus:
    _expect(raw, dict, where)
    _keys(raw, {"name", *langs}, set(), where)
    sides = {}
    for lang in langs:
        lw = f"{where}.{lang}"
        side = _expect(raw[lang], dict, lw)
        _keys(side, {"file", "format"}, {"member", "column"}, lw)
        if side["file"] not in files:
            raise ConfigError(f"{lw}.file: {side['file']!r} is not listed under files")
        if side["format"] not in FORMATS:
            raise ConfigError(f"{lw}.format: {side['format']!r} is not one of {FORMATS}")
        member = side.get("member")
        if member is not None:
            _expect(member, str, f"{lw}.member")
        column = side.get("column")
        if (side["format"] in TSV_FORMATS) != (column in (0, 1)):
            raise ConfigError(f"{lw}.column: a TSV side (and only a TSV side) names column 0 or 1")
        sides[lang] = Side(side["file"], member, side["format"], column)
    return Corpus(str(raw["name"]), sides)


def read_registry(path: str | Path) -> dict[str, Any]:
    """The registry file's YAML, unparsed (dataset name -> entry); ConfigError naming the file."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the dataset registry ({err})") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML ({err})") from err
    return _expect(raw, dict, str(path))


def parse_registry(raw: dict[str, Any], where: str) -> dict[str, Dataset]:
    """Validate a registry's entries (``read_registry``'s): dataset name -> Dataset."""
    return {name: _parse_dataset(name, d, f"{where}: {name}") for name, d in raw.items()}


def load_registry(path: str | Path) -> dict[str, Dataset]:
    """Parse and validate ``config/datasets.yaml``: dataset name -> Dataset."""
    return parse_registry(read_registry(path), str(path))


def get_dataset(path: str | Path, name: str) -> Dataset:
    registry = load_registry(path)
    if name not in registry:
        raise ConfigError(f"{path}: no dataset {name!r} (datasets: {sorted(registry)})")
    return registry[name]
