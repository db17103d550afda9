"""The report's figures (matplotlib, Agg): each a PNG with the plotted data as CSV beside it.

* Learning curves of an experiment (``runs/<experiment>/learning_curves``), from its
  ``metrics.csv`` (``metrics_history``): the training loss (label-smoothed, per target token,
  averaged over each logging window; §5.4) with the validation loss, the validation perplexity
  and the validation BLEU (greedy on the first dev sentences, and the §6.1 beam search on the
  whole dev set), against the step and against wall-clock minutes of training.
* The same curves of every experiment of one dataset pair on shared axes
  (``pairs/<dataset>_<pair>/learning_curves``), when several experiments share the pair.
* Dev BLEU against the number of averaged checkpoints (``runs/<experiment>/
  bleu_vs_averaged_checkpoints``), from ``average_selection.json`` (``average --last auto``,
  ``selection.py``); with a fixed K (§6.1's 5 or 20) only one K was tried and there is none.

Paths are relative to the figures directory (the pipeline's ``results/figures/``). Figures are
written with ``io_utils.atomic_path`` (whole or absent). matplotlib imports lazily and draws on
a ``Figure`` with the Agg canvas, never through pyplot's global state.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer_nmt.errors import DataError
from transformer_nmt.evaluation.table3 import RowTest, Table3Entry
from transformer_nmt.io_utils import atomic_open, atomic_path
from transformer_nmt.model.config import TABLE3
from transformer_nmt.runs.layout import FIGURES_DIR, METRICS_FILE, SELECTION_FILE
from transformer_nmt.runs.metrics_history import (
    VALUE_COLUMNS,
    MetricsRow,
    read_metrics,
)

log = logging.getLogger(__name__)

LEARNING_CURVES = "learning_curves"
AVERAGING = "bleu_vs_averaged_checkpoints"
# Figures that other stages write beside a run (attention maps, ...): the report shows every
# PNG found there.

# (metrics.csv column, legend label) of the panels: loss, perplexity, BLEU
_PANELS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("loss per target token", (("train_loss", "train (window mean)"), ("val_loss", "dev"))),
    ("dev perplexity", (("val_ppl", "dev"),)),
    ("dev BLEU", (("val_bleu", "greedy, first sentences"), ("val_bleu_beam", "beam (§6.1)"))),
)


@dataclass(frozen=True)
class FigureFile:
    """A written figure: ``png`` and its data ``csv``; ``experiments``: the runs it belongs to
    (one for an experiment's figure, all of the pair for a pair's)."""

    png: Path
    csv: Path | None
    title: str
    experiments: tuple[str, ...]


@dataclass
class ReportFigures:
    """What ``make_figures`` produced: figures per experiment and per pair, the figures other
    stages left in ``<run>/figures/``, and notes on figures not drawn (and why)."""

    runs: dict[str, list[FigureFile]] = field(default_factory=dict)
    pairs: dict[str, FigureFile] = field(default_factory=dict)
    found: dict[str, list[Path]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)

    def all(self) -> list[FigureFile]:
        return [f for files in self.runs.values() for f in files] + list(self.pairs.values())


def _new_figure(rows: int, cols: int, title: str) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.0 * cols, 3.0 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title)
    return fig


def _save(fig: Any, png: Path) -> None:
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)


def _write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    with atomic_open(path) as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def _cell(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _series(rows: Sequence[MetricsRow], column: str, x: str) -> tuple[list[float], list[float]]:
    points = [
        (r.step if x == "step" else r.elapsed_s / 60.0, r.values[column])
        for r in rows
        if column in r.values
    ]
    return [p[0] for p in points], [p[1] for p in points]


def _draw_panels(fig: Any, histories: Mapping[str, Sequence[MetricsRow]], single: bool) -> None:
    """3 × 2 panels (loss, perplexity, BLEU × step, minutes); one line per series (``single``:
    one experiment, lines per metric) or per experiment (the pair's figure)."""
    axes = fig.subplots(len(_PANELS), 2, squeeze=False)
    for (ylabel, series), row_axes in zip(_PANELS, axes, strict=True):
        for x, ax in zip(("step", "minutes"), row_axes, strict=True):
            drawn = False
            for number, (name, rows) in enumerate(histories.items()):
                for style, (column, label) in zip(("-", "--"), series, strict=False):
                    xs, ys = _series(rows, column, x)
                    if not xs:
                        continue
                    few = len(xs) < 30 or column.startswith("val_")
                    # the pair's figure: a colour per experiment, a line style per series
                    kwargs = {} if single else {"color": f"C{number % 10}", "linestyle": style}
                    line = label if single else (f"{name}: {label}" if len(series) > 1 else name)
                    ax.plot(xs, ys, marker="o" if few else None, markersize=3, label=line,
                            **kwargs)  # fmt: skip
                    drawn = True
            ax.set_xlabel("step (optimizer updates)" if x == "step" else "wall-clock minutes")
            ax.set_ylabel(ylabel)
            if drawn and ylabel == "dev perplexity":
                ax.set_yscale("log")  # from ~vocabulary size at the start down to ~10
            ax.grid(alpha=0.3)
            if drawn:
                ax.legend(fontsize="small")
            else:
                ax.text(0.5, 0.5, "not measured", ha="center", va="center",
                        transform=ax.transAxes, color="grey")  # fmt: skip


def _history_rows(rows: Sequence[MetricsRow]) -> list[list[str]]:
    return [
        [str(r.step), _cell(r.elapsed_s), _cell(r.elapsed_s / 60.0)]
        + [_cell(r.values.get(c)) for c in VALUE_COLUMNS]
        for r in rows
    ]


HISTORY_HEADER = ("step", "elapsed_s", "minutes", *VALUE_COLUMNS)


def learning_curves(rows: Sequence[MetricsRow], png: Path, title: str) -> Path:
    """One experiment's learning curves as ``png`` and the rows as ``png``'s ``.csv``."""
    if not rows:
        raise DataError(f"{title}: the metrics history has no rows")
    fig = _new_figure(len(_PANELS), 2, title)
    _draw_panels(fig, {title: rows}, single=True)
    _save(fig, png)
    _write_csv(png.with_suffix(".csv"), HISTORY_HEADER, _history_rows(rows))
    return png


def pair_learning_curves(
    histories: Mapping[str, Sequence[MetricsRow]], png: Path, title: str
) -> Path:
    """The learning curves of several experiments on shared axes; the CSV has an
    ``experiment`` column."""
    fig = _new_figure(len(_PANELS), 2, title)
    _draw_panels(fig, histories, single=False)
    _save(fig, png)
    table = [[name, *cells] for name, rows in histories.items() for cells in _history_rows(rows)]
    _write_csv(png.with_suffix(".csv"), ("experiment", *HISTORY_HEADER), table)
    return png


def read_selection(path: Path) -> dict[int, float]:
    """K -> dev BLEU of an ``average_selection.json``; ``DataError`` naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        table = {int(k): float(v) for k, v in data["dev_bleu"].items()}
        best = int(data["best_k"])
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise DataError(f"{path}: not an average selection ({type(err).__name__}: {err})") from None
    if best not in table:
        raise DataError(f"{path}: best_k {best} is not among the K of dev_bleu")
    return dict(sorted(table.items()))


def averaging_curve(table: Mapping[int, float], png: Path, title: str) -> Path:
    """Dev BLEU against the number of averaged checkpoints K (§6.1), the chosen K marked (the
    best, ties to the smaller K as ``selection.select_average``)."""
    ks = sorted(table)
    best = max(ks, key=lambda k: (table[k], -k))
    fig = _new_figure(1, 1, title)
    ax = fig.subplots()
    ax.plot(ks, [table[k] for k in ks], marker="o")
    ax.plot(
        [best], [table[best]], marker="*", markersize=14, linestyle="", label=f"chosen K={best}"
    )
    ax.set_xticks(ks)
    ax.set_xlabel("number of averaged checkpoints K (the last K)")
    ax.set_ylabel("dev BLEU (beam search)")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, png)
    _write_csv(
        png.with_suffix(".csv"),
        ("k", "dev_bleu", "chosen"),
        [[k, repr(table[k]), int(k == best)] for k in ks],
    )
    return png


def make_figures(
    run_dirs: Mapping[str, Path],
    experiments: Mapping[str, Mapping[str, Any]],
    out_dir: Path,
) -> ReportFigures:
    """The figures of the experiments ``run_dirs`` (name -> ``results/runs/<name>``) under
    ``out_dir``; ``experiments`` (name -> dataset, pair) groups them by pair.

    A run without ``metrics.csv`` (trained before it was recorded) or without
    ``average_selection.json`` (a fixed K) gets a note instead of that figure; a malformed file
    is a ``DataError`` naming it."""
    out = ReportFigures()
    histories: dict[str, list[MetricsRow]] = {}
    for name, run_dir in sorted(run_dirs.items()):
        files: list[FigureFile] = []
        notes: list[str] = []
        metrics = run_dir / METRICS_FILE
        if metrics.is_file():
            rows = read_metrics(metrics)
            if rows:
                histories[name] = rows
                png = learning_curves(rows, out_dir / "runs" / name / f"{LEARNING_CURVES}.png",
                                      f"{name}: learning curves")  # fmt: skip
                files.append(FigureFile(png, png.with_suffix(".csv"), "learning curves", (name,)))
            else:
                notes.append(f"no learning curves: `{metrics}` has no rows yet")
        else:
            notes.append(f"no learning curves: no `{metrics}` (trained before it was recorded)")
        selection = run_dir / SELECTION_FILE
        if selection.is_file():
            table = read_selection(selection)
            png = averaging_curve(table, out_dir / "runs" / name / f"{AVERAGING}.png",
                                  f"{name}: dev BLEU against averaged checkpoints")  # fmt: skip
            files.append(
                FigureFile(png, png.with_suffix(".csv"), "dev BLEU against K averaged", (name,))
            )
        else:
            notes.append(
                "no BLEU-against-averaged-checkpoints figure: a fixed number of checkpoints was "
                "averaged (`average_last_k: auto` tries several on the dev set)"
            )
        found = sorted((run_dir / FIGURES_DIR).glob("**/*.png"))
        out.runs[name], out.notes[name], out.found[name] = files, notes, found
    by_pair: dict[str, list[str]] = {}
    for name in histories:
        info = experiments.get(name, {})
        if info.get("dataset") and info.get("pair"):
            by_pair.setdefault(f"{info['dataset']}_{info['pair']}", []).append(name)
    for pair, names in sorted(by_pair.items()):
        if len(names) < 2:
            continue
        png = pair_learning_curves({n: histories[n] for n in names},
                                   out_dir / "pairs" / pair / f"{LEARNING_CURVES}.png",
                                   f"{pair}: learning curves")  # fmt: skip
        out.pairs[pair] = FigureFile(png, png.with_suffix(".csv"), "learning curves", tuple(names))
    log.info("wrote %d figure(s) under %s", len(out.all()), out_dir)
    return out


def table3_delta_figure(
    entries: Sequence[Table3Entry], tests: Mapping[str, RowTest], png: Path
) -> Path:
    """Each tested Table 3 row's Δ test BLEU against the base with the 95% interval of that
    difference on the paired bootstrap's draws (``significance.difference_interval``: the
    interval its p-value goes with), the paper's Δ dev BLEU beside it; and a CSV of the
    numbers beside the PNG."""
    rows = [e.row for e in entries if e.row in tests]
    paper_base = TABLE3["base"].paper_dev_bleu
    points = []  # (row, Δ, interval low, interval high, the paper's Δ)
    for row in rows:
        test = tests[row]
        if test.row.difference_interval is None:
            raise ValueError(f"Table 3 row {row}: its bootstrap has no difference interval")
        low, high = test.row.difference_interval
        points.append((row, test.delta, low, high, TABLE3[row].paper_dev_bleu - paper_base))
    fig = _new_figure(1, 1, "Table 3: each variation against the base")
    fig.set_size_inches(max(6.0, 0.5 * len(rows) + 2), 4.0)  # room for all 19 rows
    ax = fig.add_subplot(1, 1, 1)
    x = list(range(len(rows)))
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.errorbar(
        [i - 0.15 for i in x], [p[1] for p in points],
        yerr=[[max(p[1] - p[2], 0) for p in points], [max(p[3] - p[1], 0) for p in points]],
        fmt="o", capsize=3, label=f"ours, Δ test BLEU ({tests[rows[0]].test_set}), paired 95% CI",
    )  # fmt: skip
    ax.plot([i + 0.15 for i in x], [p[4] for p in points], "s", label="paper, Δ dev BLEU")
    ax.set_xticks(x, rows)
    ax.set_ylabel("Δ BLEU against base")
    ax.legend(fontsize=8)
    png.parent.mkdir(parents=True, exist_ok=True)
    _save(fig, png)
    _write_csv(
        png.with_suffix(".csv"),
        ("row", "delta_bleu", "ci_low", "ci_high", "paper_delta_dev_bleu"),
        ((r, f"{d:.4f}", f"{lo:.4f}", f"{hi:.4f}", f"{p:.1f}") for r, d, lo, hi, p in points),
    )
    return png
