"""Learning curves of several runs on shared axes: dev BLEU (§6.1 beam search), dev perplexity
and loss against optimizer steps and against wall-clock minutes of training, one colour per run.

Each curve is a run's ``metrics.csv`` (``results/runs/<experiment>/metrics.csv``, the history
the train stage writes; ``runs.metrics_history``), so runs from different DAGs, machines or
commits can be compared, e.g. a recipe against its previous version. The figure is the report's
pair figure (``evaluation.figures.pair_learning_curves``): a PNG and, beside it, a CSV with
every plotted point and its run's label.

Usage:

    python benchmarks/plot_learning_curves.py --title "CPU recipe" \\
        --curve "bf16, 9,500 steps=results/runs/multi30k_en_de_cpu/metrics.csv" \\
        --curve "fp32, 7,000 steps=benchmarks/records/curves/cpu_recipe_02060fb.csv" \\
        --out benchmarks/figures/learning_curves_cpu_recipe.png

``benchmarks/records/curves/`` holds curves of runs whose run directories are gone, written
from their tables in benchmarks/log/ (minutes to 0.1, so seconds there are rounded).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from transformer_nmt.evaluation.figures import pair_learning_curves
from transformer_nmt.runs.metrics_history import read_metrics


def labelled_path(text: str) -> tuple[str, Path]:
    label, sep, path = text.rpartition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"--curve {text!r}: expected LABEL=PATH/metrics.csv")
    return label, Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--curve",
        type=labelled_path,
        action="append",
        required=True,
        metavar="LABEL=METRICS_CSV",
        help="a run's metrics.csv and its legend label",
    )
    parser.add_argument("--title", default="learning curves")
    parser.add_argument("--out", type=Path, required=True, help="the PNG (its CSV goes beside)")
    args = parser.parse_args()
    histories = {}
    for label, path in args.curve:
        if not path.is_file():
            raise SystemExit(f"--curve {label}: no file {path}")
        rows = read_metrics(path)
        if not rows:
            raise SystemExit(f"--curve {label}: {path} has no rows")
        histories[label] = rows
    png = pair_learning_curves(histories, args.out, args.title)
    print(f"wrote {png} and {png.with_suffix('.csv')}")
    for label, rows in histories.items():
        scored = [(r.elapsed_s / 60, r.values["val_bleu_beam"]) for r in rows
                  if "val_bleu_beam" in r.values]  # fmt: skip
        points = ", ".join(f"{m:.1f} min {b:.2f}" for m, b in scored)
        print(f"{label}: dev BLEU (beam) {points or 'not measured'}")


if __name__ == "__main__":
    main()
