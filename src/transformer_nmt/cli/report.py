"""``report``: aggregate every experiment's scores into ``results/report.md``."""

from __future__ import annotations

import argparse
import json
import logging

from transformer_nmt.errors import ConfigError
from transformer_nmt.evaluation.report import (
    EXPERIMENT_FILE,
    build_report,
    collect_score_files,
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
        "--mlflow",
        action="store_true",
        help="log the report as an artifact into the MLflow run of every experiment in "
        "--experiments (MLflow experiment <dataset>_<pair>, run <experiment>)",
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
    return 0
