"""``train``: train a Transformer with Lightning, resuming from the run's newest checkpoint.

Writes ``<run-dir>/checkpoints/step=*.ckpt`` while it runs (not a Snakemake output: a failed or
killed job keeps them and the next run resumes) and, once ``max_steps`` is reached,
``<run-dir>/train_summary.json`` (the declared output). With tracking flags it logs the
resolved model and train configs as ``train.*`` params, the data stages' settings as ``data.*``
params, metrics through Lightning, the SentencePiece model and the cleaning report as artifacts,
the sha256 of the vocabulary and of the token arrays as tags and, at the end, the learning curve
(``figures/learning_curve.png``).
The run itself is ``training.run.train_run``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from transformer_nmt import tracking
from transformer_nmt.errors import ConfigError

# Debug aid used by the tests: when set to a directory, every rank appends the example indices
# of each training batch it sees to <dir>/rank<R>.jsonl.
BATCH_TRACE_ENV = "TRANSFORMER_NMT_TRACE_BATCHES"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bin-dir", required=True, type=Path, help="token arrays of the pair")
    parser.add_argument("--spm-model", required=True, type=Path, help="SentencePiece model")
    parser.add_argument("--src", required=True, help="source language, e.g. en")
    parser.add_argument("--tgt", required=True, help="target language, e.g. de")
    parser.add_argument("--run-dir", required=True, type=Path, help="results/runs/<experiment>")
    parser.add_argument(
        "--model",
        required=True,
        help='JSON: {"preset": "tiny", "overrides": {"p_drop": 0.3, ...}}',
    )
    parser.add_argument("--train", default="{}", help="JSON of TrainConfig keys")
    parser.add_argument("--clean-report", type=Path, default=None, help="logged as an artifact")
    parser.add_argument("--train-split", default="train")
    parser.add_argument("--valid-split", default="valid")
    tracking.add_cli_arguments(parser)


def parse_json(flag: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{flag}: invalid JSON ({err})") from err
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: expected a JSON object, got {type(value).__name__}")
    return value


def run(args: argparse.Namespace) -> int:
    from lightning.pytorch.utilities import rank_zero_only

    from transformer_nmt.data.vocab import load_vocab_info
    from transformer_nmt.model.config import model_config_from_spec
    from transformer_nmt.training.config import TrainConfig, check_devices_exist
    from transformer_nmt.training.run import (
        SUMMARY_FILE,
        RunData,
        plan_start,
        run_dir_lock,
        train_run,
    )

    try:
        model_cfg = model_config_from_spec(parse_json("--model", args.model))
    except ConfigError as err:
        raise ConfigError(f"--model: {err}") from err
    train_cfg = TrainConfig.from_dict(parse_json("--train", args.train))
    check_devices_exist(train_cfg)  # before tracking: no FAILED MLflow run for a wrong machine
    vocab = load_vocab_info(args.spm_model)
    data = RunData(
        args.bin_dir, args.spm_model, args.src, args.tgt, args.train_split, args.valid_split
    )
    callbacks = []
    trace_dir = os.environ.get(BATCH_TRACE_ENV)
    if trace_dir:
        from transformer_nmt.training.callbacks import BatchTrace

        callbacks.append(BatchTrace(Path(trace_dir)))

    # one trainer per run directory (rank 0 holds the lock; DDP ranks are its children)
    lock = run_dir_lock(args.run_dir) if rank_zero_only.rank == 0 else contextlib.nullcontext()
    with lock:
        start = plan_start(args.run_dir, model_cfg, train_cfg, vocab)
        params = {"model": model_cfg.to_dict(), **train_cfg.to_dict()}
        experiment = args.mlflow_experiment if rank_zero_only.rank == 0 else None
        data_params, tags = {}, {}
        if experiment is not None and args.mlflow_run is not None:  # data settings, checksums
            langs = (args.src, args.tgt)
            data_params, tags = tracking.data_record(
                args.spm_model, vocab.size, args.clean_report, args.bin_dir,
                {args.train_split: langs, args.valid_split: langs},
            )  # fmt: skip
        with tracking.stage_run(
            experiment, args.mlflow_run, "train", params, tags, new_run_reason=start.reason,
            shared_params=data_params,
        ) as mlrun:  # fmt: skip
            if mlrun is not None:
                mlrun.log_artifact(args.spm_model, "data")
                if args.clean_report is not None and args.clean_report.is_file():
                    mlrun.log_artifact(args.clean_report, "data")
            summary = train_run(
                data,
                args.run_dir,
                model_cfg,
                train_cfg,
                vocab,
                start=start,
                tracker=mlrun,
                callbacks=callbacks,
                progress_bar=sys.stderr.isatty(),
            )
            if mlrun is not None and summary is not None:
                mlrun.log_artifact(args.run_dir / SUMMARY_FILE)
                tracking.log_learning_curve(mlrun)  # figures/learning_curve.png
    return 0
