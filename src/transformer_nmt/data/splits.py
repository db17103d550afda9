"""What keeps a pair's splits apart: the comparison form of a sentence (``overlap_key``), the
overlap report of each evaluation split against the training data, the test-overlap rule, and
the carving of valid/test sets out of the training data.

Overlap (``train_overlap``): for every validation and test set, the sentences whose source,
target or (source, target) pair also occurs in the (cleaned) training data, compared after
``overlap_key`` normalisation (NFKC, lowercase, whitespace runs collapsed to one space, ends
stripped), with their line numbers (1-based, the first ``OVERLAP_LINES``). Empty lines never
count. Only the evaluation sentences are held in memory; the training data is streamed once.

Carving (``carve``; ``Pair.carve``, a user's own corpus: ``data/local.py``): after cleaning, the
distinct training pairs (compared after the same normalisation) are shuffled with
``carve_seed`` and the first ones drawn for each carved split in turn; every training pair
equal to a drawn one is removed from train, so no pair is in two splits.
"""

from __future__ import annotations

import hashlib
import logging
import os
import unicodedata
from array import array
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from transformer_nmt.data.parallel import OrderedMap
from transformer_nmt.data.registry import Pair
from transformer_nmt.errors import DataError

log = logging.getLogger(__name__)

OVERLAP_LINES = 100  # line numbers listed per split and kind; the counts are always complete
OVERLAP_KINDS = ("source", "target", "pair")
OVERLAP_NORMALISATION = "NFKC, lowercase, whitespace collapsed"


def open_text(path: Path, mode: str) -> TextIO:
    """A corpus text file, UTF-8."""
    # newline="\n": lines end with \n only; a stray \r inside a line never splits it.
    return open(path, mode, encoding="utf-8", newline="\n")


def pair_hash(src: str, tgt: str) -> int:
    """An 8-byte hash of a pair as it is (exact-duplicate removal)."""
    data = src.encode("utf-8") + b"\0" + tgt.encode("utf-8")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def overlap_key(line: str) -> str:
    """The form in which evaluation and training sentences are compared: Unicode NFKC,
    lowercased, whitespace runs collapsed to one space and the ends stripped."""
    if line.isascii():  # NFKC leaves ASCII unchanged; most lines skip the normalisation
        return " ".join(line.lower().split())
    return " ".join(unicodedata.normalize("NFKC", line).lower().split())


def pair_key_hash(src: str, tgt: str) -> int:
    """An 8-byte hash of a pair's ``overlap_key`` form: equal for pairs the overlap report
    counts as the same."""
    return pair_hash(overlap_key(src), overlap_key(tgt))


def enforce_test_overlap(dataset: str, pair: Pair, overlaps: dict[str, int]) -> None:
    """Test sets sharing pairs with the training data (``overlaps``: split -> count): a
    warning with the count, or with ``test_overlap: error`` a DataError saying how to fix it."""
    for split, count in overlaps.items():
        if not count:
            continue
        text = (
            f"{dataset} {pair.name}: {count} pair(s) of test set {split!r} also occur in the "
            f"training data (compared after {OVERLAP_NORMALISATION})"
        )
        if pair.test_overlap == "error":
            raise DataError(
                f"{text}; remove them from the training files, or set datasets.{dataset}."
                "test_overlap: warn"
            )
        log.warning("%s", text)


def carve(pair: Pair, tmp_dir: Path) -> tuple[dict[str, int], int]:
    """Draw ``pair.carve``'s splits out of ``tmp_dir``'s cleaned train files (see the module
    docstring), in place; returns (split -> pairs drawn, training pairs removed)."""
    train = (tmp_dir / f"train.{pair.src}", tmp_dir / f"train.{pair.tgt}")
    hashes = array("Q")
    with open_text(train[0], "r") as fs, open_text(train[1], "r") as ft:
        for s, t in zip(fs, ft, strict=True):
            hashes.append(pair_key_hash(s, t))
    h = np.frombuffer(hashes, dtype=np.uint64) if len(hashes) else np.zeros(0, np.uint64)
    distinct, first_line = np.unique(h, return_index=True)
    needed = sum(pair.carve.values())
    if needed >= len(distinct):
        raise DataError(
            f"pair {pair.name}: carving {needed} pairs for {', '.join(pair.carve)} needs more "
            f"than the {len(distinct)} distinct cleaned training pairs; carve fewer"
        )
    drawn = np.random.default_rng(pair.carve_seed).permutation(len(distinct))[:needed]
    split_of_line = np.full(len(h), -1, dtype=np.int64)
    split_of_line[first_line[drawn]] = np.repeat(
        np.arange(len(pair.carve)), list(pair.carve.values())
    )
    keep = ~np.isin(h, distinct[drawn])
    outputs = [
        (open_text(tmp_dir / f"{split}.{pair.src}", "w"),
         open_text(tmp_dir / f"{split}.{pair.tgt}", "w"))
        for split in pair.carve
    ]  # fmt: skip
    kept = (tmp_dir / ".kept.src", tmp_dir / ".kept.tgt")
    with (
        open_text(train[0], "r") as fs, open_text(train[1], "r") as ft,
        open_text(kept[0], "w") as ks, open_text(kept[1], "w") as kt,
    ):  # fmt: skip
        for line, (s, t) in enumerate(zip(fs, ft, strict=True)):
            if keep[line]:
                ks.write(s)
                kt.write(t)
            elif split_of_line[line] >= 0:  # in corpus order within each carved split
                out_s, out_t = outputs[split_of_line[line]]
                out_s.write(s)
                out_t.write(t)
    for handles in outputs:
        for handle in handles:
            handle.close()
    os.replace(kept[0], train[0])
    os.replace(kept[1], train[1])
    return dict(pair.carve), int((~keep).sum())


OVERLAP_CHUNK_LINES = 20_000  # training lines per job for a worker process


def _overlap_chunk(
    job: tuple[set[str], set[str], set[tuple[str, str]], bytes, bytes],
) -> tuple[set[str], set[str], set[tuple[str, str]]]:
    """A worker's share of ``train_overlap``: which of the wanted sources, targets and pairs
    occur among these training lines (compared after ``overlap_key``)."""
    wanted_src, wanted_tgt, wanted_pair, raw_sources, raw_targets = job
    # prepare wrote them: UTF-8, every line ending in "\n"
    sources = raw_sources.decode("utf-8").removesuffix("\n").split("\n")
    targets = raw_targets.decode("utf-8").removesuffix("\n").split("\n")
    seen_src: set[str] = set()
    seen_tgt: set[str] = set()
    seen_pair: set[tuple[str, str]] = set()
    for s, t in zip(sources, targets, strict=True):
        s, t = overlap_key(s), overlap_key(t)
        if s in wanted_src:
            seen_src.add(s)
        if t in wanted_tgt:
            seen_tgt.add(t)
            if (s, t) in wanted_pair:
                seen_pair.add((s, t))
    return seen_src, seen_tgt, seen_pair


def train_overlap(
    text_dir: Path, src: str, tgt: str, eval_splits: list[str], run: OrderedMap = map
) -> dict[str, dict[str, Any]]:
    """Per evaluation split of ``text_dir`` (``{split}.{lang}`` files): how many of its
    sentences have their source, target or pair in ``train.{src}``/``train.{tgt}`` after
    ``overlap_key``, with the first ``OVERLAP_LINES`` line numbers (1-based) of each kind.
    ``run``: the ordered map whose workers compare the training lines (``data/parallel.py``)."""
    keys: dict[str, list[tuple[str, str]]] = {}
    for split in eval_splits:
        with (
            open_text(text_dir / f"{split}.{src}", "r") as fs,
            open_text(text_dir / f"{split}.{tgt}", "r") as ft,
        ):
            keys[split] = [(overlap_key(s), overlap_key(t)) for s, t in zip(fs, ft, strict=True)]
    wanted_src = {s for pairs in keys.values() for s, _ in pairs if s}
    wanted_tgt = {t for pairs in keys.values() for _, t in pairs if t}
    wanted_pair = {p for pairs in keys.values() for p in pairs if p[0] and p[1]}
    seen_src: set[str] = set()
    seen_tgt: set[str] = set()
    seen_pair: set[tuple[str, str]] = set()

    def jobs() -> Iterator[tuple]:
        with (
            open(text_dir / f"train.{src}", "rb") as fs,
            open(text_dir / f"train.{tgt}", "rb") as ft,
        ):
            while sources := list(islice(fs, OVERLAP_CHUNK_LINES)):  # decoded by the workers
                targets = list(islice(ft, OVERLAP_CHUNK_LINES))  # aligned: prepare wrote both
                blocks = b"".join(sources), b"".join(targets)  # one object each to pickle
                yield wanted_src, wanted_tgt, wanted_pair, *blocks

    for hits_src, hits_tgt, hits_pair in run(_overlap_chunk, jobs()):
        seen_src |= hits_src
        seen_tgt |= hits_tgt
        seen_pair |= hits_pair
    result = {}
    for split, pairs in keys.items():
        lines: dict[str, list[int]] = {kind: [] for kind in OVERLAP_KINDS}
        for n, (s, t) in enumerate(pairs, 1):
            for kind, hit in zip(
                OVERLAP_KINDS, (s in seen_src, t in seen_tgt, (s, t) in seen_pair), strict=True
            ):
                if hit:
                    lines[kind].append(n)
        result[split] = {
            "sentences": len(pairs),
            **{kind: len(lines[kind]) for kind in OVERLAP_KINDS},
            "lines": {kind: lines[kind][:OVERLAP_LINES] for kind in OVERLAP_KINDS},
        }
    return result
