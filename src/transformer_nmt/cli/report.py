"""``report``: aggregate every experiment's scores into ``results/report.md``; with
``--figures-dir``, also draw the figures (``evaluation.figures``: learning curves, dev BLEU
against averaged checkpoints) and embed them, with every PNG found in
``results/runs/<experiment>/figures/``."""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformer_nmt.cli import arguments
from transformer_nmt.errors import ConfigError
from transformer_nmt.evaluation.report import (
    SCORES_SUFFIX,
    collect_score_files,
    known_experiments,
    read_report,
    render_figures,
)
from transformer_nmt.evaluation.studies import study_sections
from transformer_nmt.io_utils import atomic_open, write_json
from transformer_nmt.runs.layout import EXPERIMENT_FILE

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
        "--table-csv",
        type=Path,
        default=None,
        help="also write the results table (scores with their 95%% bootstrap intervals) as CSV, "
        "e.g. results/report_table.csv (the Snakemake report's landing page shows it)",
    )
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
        "--studies",
        default="{}",
        help='JSON (experiments.Pipeline.report_studies): {"groups": {"<experiment>": '
        '[<runs, one per seed>]}, "table3": {"<row>": "<experiment>"}, "significance": '
        '{"baseline": "<experiment>", "resamples": 1000, "runs": {"<experiment>": [<runs>]}}}; '
        "adds the Table 3, seeds and significance sections",
    )
    parser.add_argument(
        "--mlflow",
        action="store_true",
        help="log the report (and the figures of each experiment) as artifacts into the MLflow "
        "run of every experiment in --experiments (MLflow experiment <dataset>_<pair>, run "
        "<experiment>)",
    )


def _parse_experiments(text: str) -> dict[str, dict[str, str]]:
    value = arguments.json_object("--experiments", text)
    if not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError("--experiments: expected a JSON object of objects, one per experiment")
    for name, info in value.items():
        for key in ("dataset", "pair"):
            if not isinstance(info.get(key), str):
                raise ConfigError(f"--experiments: {name!r} has no {key!r}")
    return value


def _parse_studies(text: str) -> dict[str, Any]:
    value = arguments.json_object("--studies", text)
    unknown = sorted(set(value) - {"groups", "table3", "significance"})
    if unknown:
        raise ConfigError(f"--studies: unknown key(s) {unknown}")
    return value


def _read_scores(paths: list[Path]) -> dict[tuple[str, str], dict[str, Any]]:
    """(run, test set) -> the scores file's JSON (validated by ``read_report`` already)."""
    return {
        (p.parent.name, p.name[: -len(SCORES_SUFFIX)]): json.loads(p.read_text(encoding="utf-8"))
        for p in paths
    }


def run(args: argparse.Namespace) -> int:
    experiments = _parse_experiments(args.experiments)
    studies = _parse_studies(args.studies)
    paths = collect_score_files(args.scores, args.runs_dir)
    # What each experiment of this config is, beside its scores: later reports of other configs
    # (which do not know it) still put the paper's number and the preset on its rows.
    for path in paths:
        if path.parent.name in experiments:
            write_json(path.parent / EXPERIMENT_FILE, experiments[path.parent.name])
    report = read_report(paths, experiments)
    text = report.markdown()
    figures = None
    if args.figures_dir is not None:
        figures = _figures(paths, experiments, args.figures_dir)
        text += render_figures(figures, Path(args.out).parent)
    runs_dir = Path(args.runs_dir) if args.runs_dir else Path(args.scores[0]).parent.parent
    sections, metrics = study_sections(
        studies, _read_scores(paths), runs_dir, experiments, args.figures_dir, Path(args.out).parent
    )
    text += "".join(f"\n{section}" for section in sections.values())
    with atomic_open(args.out) as handle:
        handle.write(text)
    if args.table_csv is not None:
        with atomic_open(args.table_csv) as handle:
            handle.write(report.table_csv())
    log.info("wrote %s (%d score files)", args.out, len(paths))
    if args.mlflow:
        run_dirs = {path.parent.name: path.parent for path in paths}  # results/runs/<name>
        groups = studies.get("groups") or {}
        _log_to_mlflow(args.out, experiments, groups, sections, metrics, run_dirs, figures)
    return 0


def _log_to_mlflow(
    report: str,
    experiments: Mapping[str, Mapping[str, Any]],
    groups: Mapping[str, list[str]],
    sections: Mapping[str, str],
    metrics: Mapping[str, Mapping[str, float]],
    run_dirs: Mapping[str, Path],
    figures: Any,
) -> None:
    """The report and its study tables (``tables/<name>.md``) into every experiment's run; an
    experiment with seeds also gets a parent run (its name) holding its runs as nested runs,
    the tables and the seed statistics. ``figures`` (``evaluation.figures``, or None): each
    experiment's figures too. ``run_dirs``: each experiment's run directory (its MLflow run)."""
    from transformer_nmt import tracking

    with tempfile.TemporaryDirectory(prefix="transformer_nmt-tables-") as tmp:
        tables = Path(tmp) / "tables"
        tables.mkdir()
        for name, section in sections.items():
            (tables / f"{name}.md").write_text(section, encoding="utf-8")
        for name, info in sorted(experiments.items()):
            mlflow_experiment = f"{info['dataset']}_{info['pair']}"
            with tracking.stage_run(
                mlflow_experiment, name, "report", run_dir=run_dirs.get(name)
            ) as tracked:
                tracked.log_artifact(report)
                if figures is not None:
                    _log_figures(tracked, figures, name)
                if sections:
                    tracked.log_artifact(tables, "tables")
                if metrics.get(name):
                    tracked.log_metrics(metrics[name])
        for group, runs in sorted(groups.items()):
            info = experiments.get(runs[0])
            if info is None:
                continue
            mlflow_experiment = f"{info['dataset']}_{info['pair']}"
            with tracking.stage_run(
                mlflow_experiment, group, "report", tags={"transformer_nmt.seed_runs": len(runs)}
            ) as parent:
                tracking.nest_runs(parent, list(runs))
                parent.log_artifact(report)
                if sections:
                    parent.log_artifact(tables, "tables")
                if metrics.get(group):
                    parent.log_metrics(metrics[group])


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
