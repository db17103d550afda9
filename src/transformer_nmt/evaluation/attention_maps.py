"""Attention maps: the encoder-decoder attention of a trained model for fixed test sentences.

For each sentence (a line of the test set, translated with the §6.1 beam search) one figure
shows every head of the chosen decoder layer (default the last) and their average, target
subwords down the rows and source subwords across the columns, as in the paper's appendix
(Figures 3-5 there show self-attention; these are the encoder-decoder heads). The attention is
recomputed by teacher forcing on the translation (``Translator.translate_with_attention``).

Beside each ``attention_<line>.png`` a ``attention_<line>.csv`` holds its numbers in long
format: ``panel`` (``head_1`` ... ``head_h``, ``mean``), ``target_position``, ``target_token``,
``source_position``, ``source_token``, ``weight`` (positions 0-based; ``</s>`` is EOS).

matplotlib is imported lazily, and through ``matplotlib.figure.Figure`` (the Agg canvas, no
pyplot state), so importing this module stays light and works without a display.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from transformer_nmt.errors import DataError
from transformer_nmt.io_utils import atomic_open, atomic_path

if TYPE_CHECKING:
    from transformer_nmt.inference.output import SentenceAttention

log = logging.getLogger(__name__)

FILE_STEM = "attention_{line}"  # + .png / .csv; ``line`` is the 1-based test-set line number
CSV_FIELDS = (
    "panel", "target_position", "target_token", "source_position", "source_token", "weight",
)  # fmt: skip


def map_paths(out_dir: str | Path, line: int) -> tuple[Path, Path]:
    """``(<out_dir>/attention_<line>.png, <out_dir>/attention_<line>.csv)``."""
    stem = Path(out_dir) / FILE_STEM.format(line=line)
    return stem.with_suffix(".png"), stem.with_suffix(".csv")


def select_lines(lines: Sequence[str], numbers: Sequence[int], name: str) -> list[str]:
    """Lines ``numbers`` (1-based) of ``lines`` read from ``name``; a DataError names the file
    when one is past the end or empty (an empty line has no attention to draw)."""
    chosen = []
    for n in numbers:
        if not 1 <= n <= len(lines):
            raise DataError(f"{name}: has {len(lines)} lines, no line {n} for an attention map")
        if not lines[n - 1].strip():
            raise DataError(f"{name}:{n}: empty line, no attention map to draw")
        chosen.append(lines[n - 1])
    return chosen


def panels(record: SentenceAttention) -> list[tuple[str, np.ndarray]]:
    """(name, [T, S] matrix) of every head, then their mean."""
    heads = [(f"head_{i + 1}", record.weights[i]) for i in range(record.weights.shape[0])]
    return [*heads, ("mean", record.averaged)]


def write_csv(record: SentenceAttention, path: str | Path) -> None:
    """The figure's numbers in long format (module docstring), atomically."""
    with atomic_open(path) as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(CSV_FIELDS)
        for name, matrix in panels(record):
            for t, tgt in enumerate(record.tgt_tokens):
                for s, src in enumerate(record.src_tokens):
                    writer.writerow((name, t, tgt, s, src, f"{float(matrix[t, s]):.6f}"))


def draw_figure(record: SentenceAttention, path: str | Path, layer_label: str, line: int) -> None:
    """One PNG: a heat map per head and the head average, subwords on the axes."""
    from matplotlib.figure import Figure

    named = panels(record)
    n_tgt, n_src = len(record.tgt_tokens), len(record.src_tokens)
    cols = min(len(named), 3)
    rows = math.ceil(len(named) / cols)
    # ~0.22 inch per token so that the tick labels stay readable; at least 2.8 inches a panel
    width, height = max(2.8, 0.22 * n_src + 1.2), max(2.8, 0.22 * n_tgt + 1.2)
    fig = Figure(figsize=(cols * width, rows * height + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    # one colour scale for every panel (comparable), from 0 to the figure's largest weight
    vmax = max(float(matrix.max()) for _, matrix in named) or 1.0
    image = None
    for ax, (name, matrix) in zip(axes.flat, named, strict=False):
        image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
        ax.set_title("head average" if name == "mean" else name.replace("_", " "), fontsize=9)
        ax.set_xticks(range(n_src), record.src_tokens, rotation=90, fontsize=7)
        ax.set_yticks(range(n_tgt), record.tgt_tokens, fontsize=7)
        ax.set_xlabel("source", fontsize=8)
        ax.set_ylabel("target", fontsize=8)
    for ax in list(axes.flat)[len(named) :]:
        ax.set_axis_off()
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="attention weight")
    fig.suptitle(f"encoder-decoder attention, {layer_label}, test line {line}", fontsize=10)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")


def write_attention_maps(
    records: Sequence[SentenceAttention],
    line_numbers: Sequence[int],
    out_dir: str | Path,
    layer_label: str = "last decoder layer",
) -> list[Path]:
    """Write ``attention_<line>.png`` and ``.csv`` for each record into ``out_dir``; returns
    the written paths (PNG, CSV per record)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for record, line in zip(records, line_numbers, strict=True):
        png, table = map_paths(out_dir, line)
        draw_figure(record, png, layer_label, line)
        write_csv(record, table)
        written += [png, table]
        log.info("wrote %s and %s", png, table)
    return written
