"""Prepare one language pair: read every split's corpora, clean the training pairs, write text.

Writes ``{out_dir}/{split}.{lang}`` (UTF-8, one sentence per line, line-aligned) for train,
valid and every test set, and ``clean_report.json`` (per split, per corpus: pairs read, kept,
dropped per reason, modified). All outputs are first written into a temporary directory inside
``out_dir`` and moved into place only when every split succeeded: a bad input leaves no output.

Memory stays bounded for 36M-pair corpora: pairs are streamed; exact-duplicate removal keeps an
8-byte hash per candidate pair (a second pass then copies the first occurrences).

Parallel (``workers``, ``data/parallel.py``): this process reads the training corpora (the
archives' decompression, lines split in C) and writes the kept pairs in order; worker processes
decode, clean and hash chunks of ``CHUNK_PAIRS`` pairs, and compare the cleaned training data
with the evaluation sets. The outputs are byte-identical for any number of workers.

Data provenance and splits (``data/splits.py``): the report counts, for every validation and
test set, the sentences that also occur in the cleaned training data (under
``splits.<split>.train_overlap``); a pair may carve valid/test sets out of the training data
(``Pair.carve``), reported under ``splits.<split>.carved_from`` and
``splits.train.carved_out``. A test set read from files that shares pairs with the training data
is a warning in the log, or an error with ``test_overlap: error``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain, compress, islice, zip_longest
from pathlib import Path
from typing import Any

import numpy as np

from transformer_nmt.data import splits
from transformer_nmt.data.clean import BROKEN_REASONS, CleanConfig, CorpusCounts, clean_pair
from transformer_nmt.data.download import redownload_hint, verify_files
from transformer_nmt.data.parallel import OrderedMap, ordered_map
from transformer_nmt.data.readers import decode_block, iter_lines, raw_line_chunks, side_label
from transformer_nmt.data.registry import Corpus, Dataset, Pair, Side
from transformer_nmt.data.splits import (
    OVERLAP_NORMALISATION,
    carve,
    enforce_test_overlap,
    open_text,
    pair_hash,
    train_overlap,
)
from transformer_nmt.errors import DamagedFileError, DataError
from transformer_nmt.io_utils import write_json

log = logging.getLogger(__name__)

REPORT_NAME = "clean_report.json"


def read_pairs(
    raw_dir: Path, corpus: Corpus, src: str, tgt: str, *, lenient: bool = False
) -> Iterator[tuple[str, str]]:
    """Aligned (source, target) lines of a corpus; DamagedFileError if the line counts differ
    or the corpus has no line. ``lenient``: lines that are not UTF-8 come as ``InvalidLine``."""
    src_side, tgt_side = corpus.sides[src], corpus.sides[tgt]
    src_lines = iter_lines(raw_dir, src_side, lenient=lenient)
    tgt_lines = iter_lines(raw_dir, tgt_side, lenient=lenient)
    n = 0
    for n, (s, t) in enumerate(zip_longest(src_lines, tgt_lines), 1):
        if s is None or t is None:
            rest = sum(1 for _ in (tgt_lines if s is None else src_lines))
            counts = (n - 1, n + rest) if s is None else (n + rest, n - 1)
            raise _misaligned(raw_dir, corpus, src_side, tgt_side, *counts)
        yield s, t
    if n == 0:
        raise _no_line(raw_dir, corpus, src_side)


def _misaligned(
    raw_dir: Path, corpus: Corpus, src_side: Side, tgt_side: Side, n_src: int, n_tgt: int
) -> DamagedFileError:
    (short, n_short), (longer, n_longer) = sorted(
        ((src_side, n_src), (tgt_side, n_tgt)), key=lambda side_lines: side_lines[1]
    )
    return DamagedFileError(
        f"misaligned corpus {corpus.name!r}: {side_label(raw_dir, short)} has {n_short} "
        f"lines but {side_label(raw_dir, longer)} has {n_longer}; every line of one "
        "side must translate the same line of the other"
    )


def _no_line(raw_dir: Path, corpus: Corpus, side: Side) -> DamagedFileError:
    return DamagedFileError(f"{side_label(raw_dir, side)}: corpus {corpus.name!r} has no line")


def _check_broken_share(
    raw_dir: Path, pair: Pair, corpus: Corpus, counts: CorpusCounts, first_bad: int | None,
    limit: float | None,
) -> None:  # fmt: skip
    """DamagedFileError when more than ``limit`` of the corpus's pairs were not text."""
    broken = sum(counts.dropped[reason] for reason in BROKEN_REASONS)
    if limit is None or broken <= limit * counts.read:
        return
    lang = pair.src if counts.broken["src"] >= counts.broken["tgt"] else pair.tgt
    raise DamagedFileError(
        f"{side_label(raw_dir, corpus.sides[lang])}: {broken} of the {counts.read} pairs of "
        f"corpus {corpus.name!r} ({broken / counts.read:.2%}) are not valid UTF-8 or hold "
        f"control characters (the first at line {first_bad}), more than clean.max_invalid_share "
        f"({limit:.2%}) allows: the file is likely damaged (or raise clean.max_invalid_share)"
    )


def _limited(
    pairs: Iterator[tuple[str, str]], budget: list[int | None]
) -> Iterator[tuple[str, str]]:
    """Stop when the split's max_sentences budget (a one-item list, shared by its corpora) is 0;
    a corpus is not even opened once the budget is spent."""
    if budget[0] is None:
        yield from pairs
        return
    while budget[0] > 0:
        pair = next(pairs, None)
        if pair is None:
            return
        budget[0] -= 1
        yield pair


CHUNK_PAIRS = 20_000  # pairs per job for a worker process


@dataclass(frozen=True)
class _CleanJob:
    """A chunk of one training corpus's pairs: raw lines from line ``first`` on, joined into
    one block per side (decoded by the worker), or text already decoded where a side is SGML."""

    corpus_index: int
    first: int
    sources: bytes | list[str]
    targets: bytes | list[str]
    sides: tuple[Side, Side]
    labels: tuple[str, str]
    rules: CleanConfig


def _decoded(items: bytes | list[str], job: _CleanJob, side: int) -> list[str]:
    if isinstance(items, list):
        return items  # SGML: decoded by the reader
    lines = decode_block(items, job.first, job.sides[side], job.labels[side], True)
    return lines  # type: ignore[return-value]  (None only for SGML)


def _clean_chunk(job: _CleanJob) -> tuple[int, bytes, bytes, bytes, int, CorpusCounts, int | None]:
    """A worker's share of cleaning: (corpus index, the kept sources and targets as UTF-8 with
    a newline per line, their pair hashes as uint64 bytes (dedupe), how many were kept, counts,
    the 1-based position in the chunk of the first broken pair or None)."""
    sources, targets = _decoded(job.sources, job, 0), _decoded(job.targets, job, 1)
    counts = CorpusCounts()
    kept_src, kept_tgt, hashes = [], [], array("Q")
    first_bad = None
    for s, t in zip(sources, targets, strict=True):
        counts.read += 1
        cleaned = clean_pair(s, t, job.rules, counts)
        if cleaned is None:
            if first_bad is None and counts.broken.total():
                first_bad = counts.read
            continue
        kept_src.append(cleaned[0])
        kept_tgt.append(cleaned[1])
        if job.rules.dedupe:
            hashes.append(pair_hash(*cleaned))
    text = ["".join(f"{line}\n" for line in side).encode() for side in (kept_src, kept_tgt)]
    return job.corpus_index, text[0], text[1], hashes.tobytes(), len(kept_src), counts, first_bad


def _pair_chunks(
    raw_dir: Path, corpus: Corpus, src: str, tgt: str
) -> Iterator[tuple[int, list[bytes] | list[str], list[bytes] | list[str]]]:
    """(first line, sources, targets) of a training corpus, ``CHUNK_PAIRS`` at a time: raw
    lines, which this process only splits (the workers decode them), or decoded text where a
    side is SGML (its segments are known only once decoded); misaligned sides are an error."""
    sides = (corpus.sides[src], corpus.sides[tgt])
    if "sgml" in (sides[0].format, sides[1].format):
        pairs = read_pairs(raw_dir, corpus, src, tgt, lenient=True)
        first = 1
        while chunk := list(islice(pairs, CHUNK_PAIRS)):
            sources, targets = zip(*chunk, strict=True)
            yield first, list(sources), list(targets)
            first += len(chunk)
        return
    src_chunks, tgt_chunks = (raw_line_chunks(raw_dir, side, CHUNK_PAIRS) for side in sides)
    n = 0
    for sources, targets in zip_longest(src_chunks, tgt_chunks, fillvalue=[]):
        if len(sources) != len(targets):  # chunks are equal in size until a side ends
            n_src = n + len(sources) + sum(map(len, src_chunks))
            n_tgt = n + len(targets) + sum(map(len, tgt_chunks))
            raise _misaligned(raw_dir, corpus, *sides, n_src, n_tgt)
        yield n + 1, sources, targets
        n += len(sources)
    if n == 0:
        raise _no_line(raw_dir, corpus, sides[0])


def _cleaning_jobs(pair: Pair, raw_dir: Path, rules: CleanConfig) -> Iterator[_CleanJob]:
    """Every training corpus's pairs, in order, in chunks; ``max_sentences`` is a budget for
    the whole split (a corpus is not even opened once it is spent)."""
    budget = rules.max_sentences
    for ci, corpus in enumerate(pair.splits["train"]):
        if budget == 0:
            return
        sides = (corpus.sides[pair.src], corpus.sides[pair.tgt])
        labels = (side_label(raw_dir, sides[0]), side_label(raw_dir, sides[1]))
        for first, sources, targets in _pair_chunks(raw_dir, corpus, pair.src, pair.tgt):
            if budget is not None:
                sources, targets = sources[:budget], targets[:budget]
                budget -= len(sources)
            if isinstance(sources[0], bytes):  # one object each to pickle, not 20k
                sources, targets = b"".join(sources), b"".join(targets)  # type: ignore[arg-type]
            yield _CleanJob(ci, first, sources, targets, sides, labels, rules)
            if budget == 0:
                break


def _prepare_train(
    pair: Pair, raw_dir: Path, tmp_dir: Path, rules: CleanConfig, run: OrderedMap
) -> dict[str, CorpusCounts]:
    """Clean the training corpora: this process reads them and writes the kept pairs in
    order; ``run``'s workers clean and hash the chunks. Dedupe is global: the first
    occurrence of every distinct pair is kept, across corpora (a second pass copies them)."""
    corpora = pair.splits["train"]
    counts = {c.name: CorpusCounts() for c in corpora}
    first_bad: dict[int, int] = {}  # corpus index -> line of its first broken pair
    final = (tmp_dir / f"train.{pair.src}", tmp_dir / f"train.{pair.tgt}")
    first = (tmp_dir / ".pass1.src", tmp_dir / ".pass1.tgt") if rules.dedupe else final
    hashes, corpus_ids = array("Q"), array("H")  # 8 + 2 bytes per candidate pair

    def check(ci: int) -> None:  # a corpus is complete
        corpus = corpora[ci]
        c = counts[corpus.name]
        _check_broken_share(raw_dir, pair, corpus, c, first_bad.get(ci), rules.max_invalid_share)

    current = None
    with open(first[0], "wb") as out_src, open(first[1], "wb") as out_tgt:  # UTF-8, "\n" ends
        for ci, src_text, tgt_text, chunk_hashes, kept, chunk, bad in run(
            _clean_chunk, _cleaning_jobs(pair, raw_dir, rules)
        ):
            if current is not None and ci != current:
                check(current)
            current = ci
            c = counts[corpora[ci].name]
            if bad is not None and ci not in first_bad:
                first_bad[ci] = c.read + bad
            c.add(chunk)
            out_src.write(src_text)
            out_tgt.write(tgt_text)
            if rules.dedupe:
                hashes.frombytes(chunk_hashes)
                corpus_ids.extend(array("H", [ci]) * kept)
            else:
                c.kept += kept
    if current is not None:
        check(current)
    if not rules.dedupe:
        return counts
    h = np.frombuffer(hashes, dtype=np.uint64) if len(hashes) else np.zeros(0, np.uint64)
    cid = np.frombuffer(corpus_ids, dtype=np.uint16) if len(corpus_ids) else np.zeros(0, np.uint16)
    keep = np.zeros(len(h), dtype=bool)
    keep[np.unique(h, return_index=True)[1]] = True  # first occurrence of every distinct pair
    for ci, corpus in enumerate(corpora):
        in_corpus = cid == ci
        counts[corpus.name].kept += int((keep & in_corpus).sum())
        counts[corpus.name].dropped["duplicate"] += int((~keep & in_corpus).sum())
    for pass1, out in zip(first, final, strict=True):  # each side: its kept lines, as bytes
        keep_flags = chain.from_iterable(
            keep[i : i + CHUNK_PAIRS].tolist() for i in range(0, len(keep), CHUNK_PAIRS)
        )  # a list of 36M bools would take 290 MB
        with open(pass1, "rb") as lines, open(out, "wb") as kept_lines:
            kept_lines.writelines(compress(lines, keep_flags))
    first[0].unlink()
    first[1].unlink()
    return counts


def _prepare_eval(
    pair: Pair, split: str, raw_dir: Path, tmp_dir: Path, rules: CleanConfig
) -> dict[str, CorpusCounts]:
    """Validation/test: copied unchanged (never filtered), only checked for alignment/UTF-8."""
    counts = {c.name: CorpusCounts() for c in pair.splits[split]}
    budget: list[int | None] = [rules.max_sentences]
    with (
        open_text(tmp_dir / f"{split}.{pair.src}", "w") as out_src,
        open_text(tmp_dir / f"{split}.{pair.tgt}", "w") as out_tgt,
    ):
        for corpus in pair.splits[split]:
            c = counts[corpus.name]
            for s, t in _limited(read_pairs(raw_dir, corpus, pair.src, pair.tgt), budget):
                out_src.write(s + "\n")
                out_tgt.write(t + "\n")
                c.read += 1
                c.kept += 1
    return counts


def _split_report(counts: dict[str, CorpusCounts], filtered: bool) -> dict[str, Any]:
    corpora = {name: c.to_dict() for name, c in counts.items()}
    total: dict[str, Any] = {
        "filtered": filtered,
        "read": sum(c["read"] for c in corpora.values()),
        "kept": sum(c["kept"] for c in corpora.values()),
        "dropped": {},
        "corpora": corpora,
    }
    for c in corpora.values():
        for reason, n in c["dropped"].items():
            total["dropped"][reason] = total["dropped"].get(reason, 0) + n
    return total


def prepare_pair(
    dataset: Dataset,
    pair_name: str,
    raw_dir: str | Path,
    out_dir: str | Path,
    rules: CleanConfig,
    *,
    verify_checksums: bool = True,
    workers: int = 1,
) -> dict[str, Any]:
    """Write every split of ``pair_name`` and the cleaning report into ``out_dir``; returns it.
    ``workers``: processes that clean the training pairs and compare them with the evaluation
    sets (``data/parallel.py``); the outputs do not depend on it."""
    pair = dataset.pair(pair_name)
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    if verify_checksums:
        used = {s.file for cs in pair.splits.values() for c in cs for s in c.sides.values()}
        verify_files(dataset, raw_dir, used)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=".prepare.", dir=out_dir))
    try:
        with ordered_map(workers) as run:
            return _prepare_into(dataset, pair, raw_dir, out_dir, tmp_dir, rules, run)
    except DamagedFileError as err:  # a fresh download fixes it: say how to get one
        raise DataError(f"{err}; {redownload_hint(dataset.name)}") from err
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _prepare_into(
    dataset: Dataset, pair: Pair, raw_dir: Path, out_dir: Path, tmp_dir: Path, rules: CleanConfig,
    run: OrderedMap,
) -> dict[str, Any]:  # fmt: skip
    """``prepare_pair``'s work: every output into ``tmp_dir``, then moved into ``out_dir``."""
    report: dict[str, Any] = {
        "dataset": dataset.name,
        "pair": pair.name,
        "rules": rules.to_dict(),
        "splits": {},
    }
    for split in pair.splits:
        if split == "train":
            counts = _prepare_train(pair, raw_dir, tmp_dir, rules, run)
        else:
            counts = _prepare_eval(pair, split, raw_dir, tmp_dir, rules)
        report["splits"][split] = _split_report(counts, filtered=split == "train")
        log.info(
            "%s: %d pairs read, %d kept",
            split,
            report["splits"][split]["read"],
            report["splits"][split]["kept"],
        )
    if pair.carve:
        carved, removed = carve(pair, tmp_dir)
        train = report["splits"]["train"]
        train["kept"] -= removed
        train["carved_out"] = removed
        for split, n in carved.items():
            report["splits"][split] = {
                "filtered": True, "carved_from": "train", "carve_seed": pair.carve_seed,
                "read": n, "kept": n, "dropped": {}, "corpora": {},
            }  # fmt: skip
            log.info("%s: %d pairs carved out of train (seed %d)", split, n, pair.carve_seed)
        log.info("train: %d pairs removed (drawn or equal to a drawn one)", removed)
    eval_splits = [split for split in pair.split_names() if split != "train"]
    if "train" in pair.splits and eval_splits:
        overlap = train_overlap(tmp_dir, pair.src, pair.tgt, eval_splits, run)
        report["overlap_normalisation"] = OVERLAP_NORMALISATION
        report["overlap_lines_listed"] = splits.OVERLAP_LINES
        for split, counts in overlap.items():
            report["splits"][split]["train_overlap"] = counts
            log.info(
                "%s: %d/%d pairs also in train (source %d, target %d)",
                split, counts["pair"], counts["sentences"], counts["source"],
                counts["target"],
            )  # fmt: skip
        enforce_test_overlap(
            dataset.name,
            pair,
            {s: overlap[s]["pair"] for s in dataset.test_splits if s in pair.splits},
        )
    write_json(tmp_dir / REPORT_NAME, report)
    for path in sorted(tmp_dir.iterdir()):
        os.replace(path, out_dir / path.name)
    return report
