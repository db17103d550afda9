"""``report``: aggregate every experiment's scores into ``results/report.md``; with
``--figures-dir``, also draw the figures (``evaluation.figures``: learning curves, dev BLEU
against averaged checkpoints) and embed them, with every PNG found in
``results/runs/<experiment>/figures/``."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from transformer_nmt.errors import ConfigError
from transformer_nmt.evaluation.report import (
    EXPERIMENT_FILE,
    build_report,
    collect_score_files,
    known_experiments,
    render_figures,
)
from transformer_nmt.io_utils import atomic_open, write_json

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scores",
        nargs="+",
        required=True,
        help="results/runs/{experiment}/{test_set}.scores.json",
    )
    parser.add_argument("--out", required=True, help="the Markdown report to write")
    parser.add_argument(
        "--experiments",
        default="{}",
        help='JSON: {"<experiment>": {"dataset": ..., "pair": "en-de", "preset": "base"}}; '
        "puts the paper's Table 2 number beside WMT14 base/big rows",
    )
    parser.add_argument(
        "--runs-dir",
        default=None,
        help="also report every <runs-dir>/<experiment>/*.scores.json (experiments of other "
        "configs, e.g. results/runs): a recipe's report keeps the demo's rows",
    )
    parser.add_argument(
        "--figures-dir",
        type=Path,
        default=None,
        help="draw the figures here (e.g. results/figures: runs/<experiment>/*.png and "
        "pairs/<dataset>_<pair>/*.png, each with its data as .csv) and embed them in the report",
    )
    parser.add_argument(
        "--mlflow",
        action="store_true",
        help="log the report (and the figures of each experiment) as artifacts into the MLflow "
        "run of every experiment in --experiments (MLflow experiment <dataset>_<pair>, run "
        "<experiment>)",
    )


def _parse_experiments(text: str) -> dict[str, dict[str, str]]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--experiments: not valid JSON ({err})") from err
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError("--experiments: expected a JSON object of objects, one per experiment")
    for name, info in value.items():
        for key in ("dataset", "pair"):
            if not isinstance(info.get(key), str):
                raise ConfigError(f"--experiments: {name!r} has no {key!r}")
    return value


def run(args: argparse.Namespace) -> int:
    experiments = _parse_experiments(args.experiments)
    paths = collect_score_files(args.scores, args.runs_dir)
    # What each experiment of this config is, beside its scores: later reports of other configs
    # (which do not know it) still put the paper's number and the preset on its rows.
    for path in paths:
        if path.parent.name in experiments:
            write_json(path.parent / EXPERIMENT_FILE, experiments[path.parent.name])
    text = build_report(paths, experiments)
    figures = None
    if args.figures_dir is not None:
        figures = _figures(paths, experiments, args.figures_dir)
        text += render_figures(figures, Path(args.out).parent)
    with atomic_open(args.out) as handle:
        handle.write(text)
    log.info("wrote %s (%d score files)", args.out, len(paths))
    if args.mlflow:
        from transformer_nmt import tracking

        run_dirs = {path.parent.name: path.parent for path in paths}  # results/runs/<name>
        for name, info in sorted(experiments.items()):
            mlflow_experiment = f"{info['dataset']}_{info['pair']}"
            with tracking.stage_run(
                mlflow_experiment, name, "report", run_dir=run_dirs.get(name)
            ) as tracked:
                tracked.log_artifact(args.out)
                if figures is not None:
                    _log_figures(tracked, figures, name)
    return 0


def _figures(paths: list[Path], experiments: dict, figures_dir: Path):
    """The figures of every experiment with scores (its run directory: the scores' folder)."""
    from transformer_nmt.evaluation.figures import make_figures

    run_dirs = {p.parent.name: p.parent for p in paths}
    return make_figures(run_dirs, known_experiments(paths, experiments), figures_dir)


def _log_figures(tracked, figures, name: str) -> None:
    """Experiment ``name``'s figures (PNG and CSV) under ``figures/``, the other stages' PNGs
    found beside its run too, and its pair's figures under ``figures/<dataset>_<pair>/``."""
    for fig in figures.runs.get(name, []):
        for path in (fig.png, fig.csv):
            if path is not None:
                tracked.log_artifact(path, "figures")
    for png in figures.found.get(name, []):
        tracked.log_artifact(png, "figures")
    for pair, fig in figures.pairs.items():
        if name in fig.experiments:
            for path in (fig.png, fig.csv):
                if path is not None:
                    tracked.log_artifact(path, f"figures/{pair}")
