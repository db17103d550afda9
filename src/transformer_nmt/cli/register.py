"""``register``: log a trained experiment as an MLflow model and register it (optional stage).

The model is a pyfunc (``serving.TranslatorModel``) around ``Translator`` with the run's
``averaged.pt``, the pair's SentencePiece model and the search settings as artifacts, logged
into the experiment's MLflow run and registered under ``--name`` (default: the experiment,
``--mlflow-run``), so that ``mlflow models serve -m models:/<name>/<version> --env-manager
local`` answers translation requests. ``--out`` records the model URIs as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from transformer_nmt import tracking
from transformer_nmt.cli import arguments
from transformer_nmt.errors import ConfigError
from transformer_nmt.io_utils import write_json

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-dir", required=True, type=Path, help="results/runs/<experiment> (averaged.pt)"
    )
    parser.add_argument(
        "--spm-model",
        type=Path,
        default=None,
        help="the pair's SentencePiece model (default: found by the run's vocabulary sha256)",
    )
    parser.add_argument(
        "--name", default=None, help="registered model name (default: --mlflow-run)"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON record of the model URIs")
    arguments.add_search_arguments(parser)
    arguments.add_tracking_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from transformer_nmt.inference import serving
    from transformer_nmt.inference.translator import Translator

    if args.mlflow_experiment is None or args.mlflow_run is None:
        raise ConfigError("register logs into MLflow: give --mlflow-experiment and --mlflow-run")
    settings = arguments.search_settings(args)
    # Check the model and find its vocabulary now: a clear error before anything is logged.
    translator = Translator.from_run(args.run_dir, settings, "cpu", args.spm_model)
    model_path, spm_model = translator.model_path, translator.spm_model_path
    del translator
    name = args.name or args.mlflow_run
    params = {**dataclasses.asdict(settings), "name": name}
    run_dir = arguments.tracking_run_dir(args, args.run_dir)
    with tracking.stage_run(
        args.mlflow_experiment, args.mlflow_run, "register", params, run_dir=run_dir
    ) as mlrun:
        assert mlrun is not None
        record = serving.log_translator_model(mlrun, model_path, spm_model, settings, name)
        mlrun.set_tags({"register.model_uri": record["registered_uri"]})
    log.info("logged %s, registered as %s", record["model_uri"], record["registered_uri"])
    if args.out is not None:
        write_json(args.out, record)
    return 0
