"""A run's metrics history: ``results/runs/<experiment>/metrics.csv``, the data of the learning
curves (``evaluation/figures.py``), written during training by ``callbacks.MetricsHistory``.

The file format (docs/interfaces.md): CSV with the header ``COLUMNS``, one row per event, in
the order the events happened:

* a *training* row every ``log_every_steps`` updates (and at ``max_steps``): ``train_loss`` is
  the label-smoothed loss per target token averaged over the updates since the previous
  training row (§5.4), ``lr`` the learning rate of the row's update (§5.3);
* a *validation* row after each validation: ``val_loss``, ``val_ppl`` (exp of the NLL per
  token) and, when that validation measured them, ``val_bleu`` (greedy, the first
  ``val_bleu_sentences`` dev sentences) and ``val_bleu_beam`` (§6.1 beam search, whole dev set).

``step`` is the number of optimizer updates done; ``elapsed_s`` the wall-clock seconds of
training up to the row, summed over the jobs of a resumed run. An empty cell is a value not
measured in that row. Values are written with ``repr`` (they read back exactly).

Kept here, apart from Lightning, so that the report stage reads it without importing training.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from transformer_nmt.errors import DataError
from transformer_nmt.io_utils import atomic_open

COLUMNS = (
    "step",
    "elapsed_s",
    "train_loss",
    "lr",
    "val_loss",
    "val_ppl",
    "val_bleu",
    "val_bleu_beam",
)
VALUE_COLUMNS = COLUMNS[2:]


@dataclass(frozen=True)
class MetricsRow:
    step: int
    elapsed_s: float
    values: dict[str, float]  # column of VALUE_COLUMNS -> value; absent = not measured

    def cells(self) -> list[str]:
        return [
            str(self.step),
            repr(float(self.elapsed_s)),
            *(repr(float(self.values[c])) if c in self.values else "" for c in VALUE_COLUMNS),
        ]


def _parse(cells: list[str], path: Path, line: int) -> MetricsRow:
    if len(cells) != len(COLUMNS):
        raise DataError(f"{path}:{line}: expected {len(COLUMNS)} columns, found {len(cells)}")
    try:
        step = int(cells[0])
        elapsed = float(cells[1])
        values = {c: float(v) for c, v in zip(VALUE_COLUMNS, cells[2:], strict=True) if v != ""}
    except ValueError as err:
        raise DataError(f"{path}:{line}: not a number ({err})") from None
    if step < 0 or not math.isfinite(elapsed) or elapsed < 0:
        raise DataError(f"{path}:{line}: step and elapsed_s must be non-negative numbers")
    return MetricsRow(step, elapsed, values)


def read_metrics(
    path: str | os.PathLike[str], *, drop_partial_last: bool = False
) -> list[MetricsRow]:
    """The rows of a metrics file. A ``DataError`` names the file and line of anything malformed
    (a missing file is "file not found"). ``drop_partial_last``: a last line cut short (a job
    killed while appending it: no newline at its end) is dropped instead."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot read it ({err})") from None
    lines = text.splitlines(keepends=True)
    if drop_partial_last and lines and not lines[-1].endswith("\n"):
        lines.pop()
    if not lines:
        raise DataError(f"{path}: empty (expected the header {','.join(COLUMNS)})")
    records = list(csv.reader(lines))
    if tuple(records[0]) != COLUMNS:
        raise DataError(f"{path}:1: expected the header {','.join(COLUMNS)}")
    return [_parse(cells, path, n) for n, cells in enumerate(records[1:], start=2)]


def write_metrics(path: str | os.PathLike[str], rows: Iterable[MetricsRow]) -> None:
    """Write the whole file atomically (header and ``rows``)."""
    with atomic_open(path) as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows(row.cells() for row in rows)


def append_metrics(path: str | os.PathLike[str], row: MetricsRow) -> None:
    """Append one row (the header first when the file is new), flushed at once."""
    path = Path(path)
    new = not path.is_file() or path.stat().st_size == 0
    with open(path, "a", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        if new:
            writer.writerow(COLUMNS)
        writer.writerow(row.cells())


def row(step: int, elapsed_s: float, values: Mapping[str, float]) -> MetricsRow:
    """A row of the finite ``values`` among ``VALUE_COLUMNS`` (others are left out)."""
    kept = {k: float(v) for k, v in values.items() if k in VALUE_COLUMNS and math.isfinite(v)}
    return MetricsRow(int(step), float(elapsed_s), kept)
