"""A user's own corpus: the config's ``datasets:`` block, as registry entries, and its checks.

A dataset there is declared by local paths instead of URLs (docs/own-data.md)::

    datasets:
      my_corpus:
        pair: en-sw                  # any source-target codes
        train: data/corpus.tsv       # source<TAB>target lines (.tsv or .tsv.gz)
        valid: 1000                  # pairs carved from the training data (seeded)
        test: 1000

A corpus is one TSV file (``*.tsv``, ``*.tsv.gz``), a prefix ``P`` naming the files ``P.<src>``
and ``P.<tgt>`` (each plain or ``.gz``), a mapping ``{<src>: file, <tgt>: file}``, or a list of
these (concatenated in order). ``valid`` and ``test`` are corpora too, or a number of pairs to
carve out of the training data; ``test`` may also map test-set names to either. Relative paths
are relative to the directory snakemake (or ``check-config``) runs in. Optional keys: ``seed``
(of the carving, default 1), ``test_overlap`` (``warn``: a test pair also in the training data
is counted in the log and the cleaning report; ``error``: it stops the first stage),
``description``.

``registry_entry`` turns such a block into the registry's own form (``data/registry.py``: files
with a local ``path``, TSV sides, ``carve``), so that every stage reads it like a downloaded
dataset: the download stage links the files into ``resources/<dataset>/`` and pins their sha256,
``prepare`` cleans and carves, and MLflow records each file with its ``file://`` source and
sha256. ``check_pair`` reads a pair's corpora once and stops at the first bad input (unequal
line counts, a TSV line without one tab, more empty or undecodable lines than the cleaning
share, too few pairs to carve, test pairs also in training with ``test_overlap: error``); the
download stage and ``check-config`` both run it, before any other job.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from transformer_nmt.data.clean import CleanConfig
from transformer_nmt.data.prepare import read_pairs
from transformer_nmt.data.readers import InvalidLine, side_label
from transformer_nmt.data.registry import Dataset
from transformer_nmt.data.splits import enforce_test_overlap, pair_key_hash
from transformer_nmt.errors import ConfigError, DataError

CONFIG_KEY = "datasets"
DEFAULT_TEST_SET = "test"
_TSV_SUFFIXES = (".tsv", ".tsv.gz")


def _side_format(path: Path, tsv: bool) -> str:
    gz = path.name.endswith(".gz")
    if tsv:
        return "tsv-gzip" if gz else "tsv"
    return "gzip" if gz else "text"


class _Files:
    """The dataset's ``files:``: a plain name per local file, unique, in first-use order."""

    def __init__(self) -> None:
        self.by_path: dict[Path, str] = {}

    def name(self, path: Path) -> str:
        if path not in self.by_path:
            taken = set(self.by_path.values())
            name, n = path.name, 1
            while name in taken:
                n += 1
                name = f"{n}-{path.name}"
            self.by_path[path] = name
        return self.by_path[path]

    def entries(self) -> dict[str, Any]:
        return {name: {"path": str(path), "sha256": None} for path, name in self.by_path.items()}


def _existing(path: Path, where: str) -> Path:
    if not path.is_file():
        raise ConfigError(f"{where}: {path} does not exist (or is not a file); fix the path")
    return path


def _corpus(
    raw: Any, langs: tuple[str, str], files: _Files, base: Path, where: str
) -> dict[str, Any]:
    """One corpus spec (TSV path, prefix, or {lang: path}) -> the registry's corpus entry."""
    src, tgt = langs
    if isinstance(raw, str) and raw.endswith(_TSV_SUFFIXES):
        path = _existing((base / raw).absolute(), where)
        name = files.name(path)
        fmt = _side_format(path, tsv=True)
        return {
            "name": path.name.removesuffix(".gz").removesuffix(".tsv"),
            src: {"file": name, "format": fmt, "column": 0},
            tgt: {"file": name, "format": fmt, "column": 1},
        }
    if isinstance(raw, str):  # a prefix: <prefix>.<src> and <prefix>.<tgt>, each maybe .gz
        prefix = (base / raw).absolute()
        sides = {}
        for lang in langs:
            plain = prefix.with_name(f"{prefix.name}.{lang}")
            gz = plain.with_name(plain.name + ".gz")
            if not plain.is_file() and not gz.is_file():
                raise ConfigError(
                    f"{where}: neither {plain} nor {gz} exists; fix the path (a prefix names "
                    f"<prefix>.{src} and <prefix>.{tgt}; a TSV file ends in .tsv or .tsv.gz)"
                )
            path = plain if plain.is_file() else gz
            sides[lang] = {"file": files.name(path), "format": _side_format(path, tsv=False)}
        return {"name": prefix.name, **sides}
    if isinstance(raw, dict) and set(raw) == set(langs):
        sides = {}
        for lang in langs:
            if not isinstance(raw[lang], str):
                raise ConfigError(f"{where}.{lang}: expected a file path, got {raw[lang]!r}")
            path = _existing((base / raw[lang]).absolute(), f"{where}.{lang}")
            sides[lang] = {"file": files.name(path), "format": _side_format(path, tsv=False)}
        return {"name": Path(raw[src]).name.removesuffix(".gz").removesuffix(f".{src}"), **sides}
    raise ConfigError(
        f"{where}: expected a TSV file (.tsv, .tsv.gz), a prefix of <prefix>.{src} and "
        f"<prefix>.{tgt}, a mapping {{{src}: file, {tgt}: file}} or a list of these; "
        f"got {raw!r}"
    )


def _split(
    raw: Any, langs: tuple[str, str], files: _Files, base: Path, where: str, carvable: bool
) -> list[dict[str, Any]] | int:
    """A split: a number of pairs to carve (valid, test) or its corpora (named uniquely)."""
    if carvable and isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 1:
            raise ConfigError(f"{where}: carve at least 1 pair, got {raw}")
        return raw
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise ConfigError(f"{where}: lists no corpus")
    corpora = [_corpus(item, langs, files, base, f"{where}[{i}]") for i, item in enumerate(items)]
    seen: dict[str, int] = {}
    for corpus in corpora:  # corpus names key the cleaning report: make them unique
        seen[corpus["name"]] = seen.get(corpus["name"], 0) + 1
        if seen[corpus["name"]] > 1:
            corpus["name"] = f"{corpus['name']}_{seen[corpus['name']]}"
    return corpora


def registry_entry(name: str, raw: Any, base_dir: str | Path = ".") -> dict[str, Any]:
    """The config's ``datasets.<name>`` block -> the registry's entry for the dataset (files
    with absolute paths); ConfigError naming the key for a bad block or a missing file."""
    where = f"{CONFIG_KEY}.{name}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with pair, train, valid and test")
    known = {"pair", "train", "valid", "test", "seed", "test_overlap", "description"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} (known: {sorted(known)})")
    missing = sorted({"pair", "train", "valid", "test"} - set(raw))
    if missing:
        raise ConfigError(f"{where}: missing key(s) {missing}")
    langs = tuple(str(raw["pair"]).split("-"))
    if len(langs) != 2 or not all(langs) or langs[0] == langs[1]:
        raise ConfigError(f"{where}.pair: expected <src>-<tgt> of two codes, e.g. en-sw")
    base = Path(base_dir)
    files = _Files()
    splits: dict[str, Any] = {}
    carve: dict[str, int] = {}
    tests = raw["test"]
    named_tests = isinstance(tests, dict) and set(tests) != set(langs)
    # (split, spec, may it be carved, its config key)
    wanted = [
        ("train", raw["train"], False, f"{where}.train"),
        ("valid", raw["valid"], True, f"{where}.valid"),
    ]
    if named_tests:
        wanted += [(str(k), v, True, f"{where}.test.{k}") for k, v in tests.items()]
    else:
        wanted.append((DEFAULT_TEST_SET, tests, True, f"{where}.test"))
    for split, spec, carvable, key in wanted:
        value = _split(spec, langs, files, base, key, carvable)
        if isinstance(value, int):
            carve[split] = value
        else:
            splits[split] = value
    pair: dict[str, Any] = {"splits": splits}
    if carve:
        pair.update(carve=carve, carve_seed=raw.get("seed", 1))
    if "test_overlap" in raw:
        pair["test_overlap"] = raw["test_overlap"]
    return {
        "description": raw.get("description", f"local corpus {name} ({raw['pair']})"),
        "files": files.entries(),
        "pairs": {raw["pair"]: pair},
        "test_splits": [split for split, *_ in wanted[2:]],
    }


def merged_registry(
    registry: dict[str, Any], datasets: dict[str, Any] | None, base_dir: str | Path = "."
) -> dict[str, Any]:
    """The registry file's entries plus the config's own datasets; a name in both is an error."""
    merged = dict(registry)
    for name, raw in (datasets or {}).items():
        if name in registry:
            raise ConfigError(
                f"{CONFIG_KEY}.{name}: the dataset registry already has a dataset {name!r}; "
                "give yours another name"
            )
        merged[name] = registry_entry(name, raw, base_dir)
    return merged


# --- checks -------------------------------------------------------------------------


def _check_corpus_shares(
    label: str, corpus: str, read: int, broken: int, empty: int, first: int | None,
    limit: float | None,
) -> None:  # fmt: skip
    bad = broken + empty
    if limit is None or bad <= limit * read:
        return
    raise DataError(
        f"{label}: {bad} of the {read} pairs of corpus {corpus!r} ({bad / read:.2%}) have an "
        f"empty side ({empty}) or are not valid UTF-8 ({broken}), the first at line {first}, "
        f"more than clean.max_invalid_share ({limit:.2%}) allows: fix the file (or raise "
        "clean.max_invalid_share)"
    )


def _corpus_pairs(
    raw_dir: Path, pair: Any, corpus: Any, lenient: bool, limit: float | None
) -> Iterator[tuple[str, str]]:
    """A corpus's aligned pairs that have text on both sides; DataError when more than
    ``limit`` of them have an empty side or are not UTF-8."""
    n = broken = empty = 0
    first = None
    for n, (s, t) in enumerate(read_pairs(raw_dir, corpus, pair.src, pair.tgt, lenient=lenient), 1):
        bad_text = isinstance(s, InvalidLine) or isinstance(t, InvalidLine)
        blank = not bad_text and (not s.strip() or not t.strip())
        broken += bad_text
        empty += blank
        if bad_text or blank:
            first = first or n
            continue
        yield s, t
    labels = dict.fromkeys(side_label(raw_dir, corpus.sides[lang]) for lang in (pair.src, pair.tgt))
    _check_corpus_shares(" + ".join(labels), corpus.name, n, broken, empty, first, limit)


def check_pair(
    dataset: Dataset, pair_name: str, raw_dir: str | Path, rules: CleanConfig
) -> dict[str, Any]:
    """Read every corpus of a local dataset's pair (``raw_dir``: where the download stage
    linked them) and stop at the first bad input (DataError naming file, line or key); returns
    per split the pairs with text on both sides, and per test set read from files how many of
    its pairs also occur in the training data. Memory: 8 bytes per training pair."""
    pair = dataset.pair(pair_name)
    raw_dir = Path(raw_dir)
    limit = rules.max_invalid_share
    counts: dict[str, int] = {}
    test_keys: dict[str, list[int]] = {}
    for split, corpora in pair.splits.items():  # evaluation sets first: they are small
        if split == "train":
            continue
        keys = [
            pair_key_hash(s, t)
            for corpus in corpora
            for s, t in _corpus_pairs(raw_dir, pair, corpus, False, limit)
        ]
        counts[split] = len(keys)
        if split in dataset.test_splits:
            test_keys[split] = keys
    wanted = {key for keys in test_keys.values() for key in keys}
    train_hashes, seen = array("Q"), set()
    for corpus in pair.splits["train"]:
        for s, t in _corpus_pairs(raw_dir, pair, corpus, True, limit):
            key = pair_key_hash(s, t)
            train_hashes.append(key)
            if key in wanted:
                seen.add(key)
    counts["train"] = len(train_hashes)
    distinct = len(np.unique(np.frombuffer(train_hashes, dtype=np.uint64))) if train_hashes else 0
    needed = sum(pair.carve.values())
    if needed and needed >= distinct:
        raise DataError(
            f"{CONFIG_KEY}.{dataset.name}: carving {needed} pairs for "
            f"{', '.join(pair.carve)} needs more than the {distinct} distinct training pairs; "
            "carve fewer (valid, test) or give them as files"
        )
    overlaps = {split: sum(key in seen for key in keys) for split, keys in test_keys.items()}
    enforce_test_overlap(dataset.name, pair, overlaps)
    return {"splits": counts, "distinct_train_pairs": distinct, "test_overlap": overlaps}
