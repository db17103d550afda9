"""``train``: train a Transformer with Lightning, resuming from the run's newest checkpoint.

Writes ``<run-dir>/checkpoints/step=*.ckpt`` while it runs (not a Snakemake output: a failed or
killed job keeps them and the next run resumes) and, once ``max_steps`` is reached,
``<run-dir>/train_summary.json`` (the declared output). With tracking flags it logs the
resolved model and train configs as ``train.*`` params, the data stages' settings as ``data.*``
params, metrics through Lightning, the SentencePiece model and the cleaning report as artifacts,
the sha256 of the vocabulary and of the token arrays as tags (the learning curves are drawn by
the report stage from ``metrics.csv``: ``evaluation/figures.py``). The run directory identifies
the MLflow run (``tracking.stage_run(run_dir=...)``); a failing store does not stop training
(one warning, the points lost counted in the summary). Each attempt also writes its own log,
``<run-dir>/logs/attempt-<n>-<UTC time>.log``: Snakemake deletes a job's log before running it
again, so the log of a killed attempt survives only there.
The experiment's settings come from ``--config-file`` (the file the pipeline's ``train_config``
rule writes, so that the command line stays short) or, by hand and in tests, from ``--model``
and ``--train``. The run itself is ``training.run.train_run``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from transformer_nmt import tracking
from transformer_nmt.cli import arguments
from transformer_nmt.errors import ConfigError, UserFacingError
from transformer_nmt.runs.layout import ATTEMPT_LOG_DIR

log = logging.getLogger(__name__)

_ATTEMPT = re.compile(r"attempt-(\d+)-")

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
        "--config-file",
        type=Path,
        default=None,
        help='JSON file {"model": {"preset": ..., "overrides": {...}}, "train": {...}} (the '
        "pipeline's results/runs/<experiment>/train_config.json); replaces --model and --train",
    )
    parser.add_argument(
        "--model",
        default=None,
        help='JSON: {"preset": "tiny", "overrides": {"p_drop": 0.3, ...}}',
    )
    parser.add_argument("--train", default=None, help="JSON of TrainConfig keys (default {})")
    parser.add_argument("--clean-report", type=Path, default=None, help="logged as an artifact")
    parser.add_argument("--train-split", default="train")
    parser.add_argument("--valid-split", default="valid")
    arguments.add_tracking_arguments(parser)
    arguments.add_fast_path_arguments(parser)


def experiment_settings(args: argparse.Namespace) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(where, model spec, train keys)`` from ``--config-file`` or from ``--model``/``--train``;
    ``where`` names the source in error messages."""
    if args.config_file is None:
        if args.model is None:
            raise ConfigError("give --config-file, or --model (and optionally --train)")
        return (
            "--model",
            arguments.json_object("--model", args.model),
            arguments.json_object("--train", args.train or "{}"),
        )
    if args.model is not None or args.train is not None:
        raise ConfigError("--config-file replaces --model and --train: give one or the other")
    where = f"--config-file {args.config_file}"
    try:
        text = args.config_file.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{where}: cannot read it ({err.strerror})") from err
    settings = arguments.json_object(where, text)
    unknown = sorted(set(settings) - {"model", "train"})
    if unknown or "model" not in settings:
        found = ", ".join(repr(k) for k in sorted(settings)) or "none"
        raise ConfigError(f"{where}: expected the keys 'model' and 'train', found {found}")
    model, train = settings["model"], settings.get("train", {})
    for key, value in (("model", model), ("train", train)):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: '{key}' must be an object, got {type(value).__name__}")
    return f"{where}: model", model, train


def run(args: argparse.Namespace) -> int:
    from lightning.pytorch.utilities import rank_zero_only

    from transformer_nmt.cpu_memory import keep_freed_memory
    from transformer_nmt.data.vocab import load_vocab_info
    from transformer_nmt.model.config import model_config_from_spec
    from transformer_nmt.runs.layout import SUMMARY_FILE
    from transformer_nmt.training.config import GEOMETRY_KEYS, TrainConfig
    from transformer_nmt.training.resolution import resolve_run
    from transformer_nmt.training.rules import check_devices_exist
    from transformer_nmt.training.run import (
        RunData,
        plan_start,
        run_dir_lock,
        sized_for,
        train_run,
    )

    fast = arguments.apply_fast_paths(args)  # before the allocator's settings (one of them)
    memory = keep_freed_memory()  # before the data and the model allocate
    where, model_spec, train_keys = experiment_settings(args)
    try:
        model_cfg = model_config_from_spec(model_spec)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from err
    train_cfg = TrainConfig.from_dict(train_keys)
    check_devices_exist(train_cfg)  # before tracking: no FAILED MLflow run for a wrong machine
    if args.mlflow_experiment is not None and args.mlflow_run is not None:
        # a tracking server that refuses our credentials: one line before the data and the
        # model, in every DDP rank (rank 0 alone tracks; the others would wait for it)
        tracking.check_access(tracking.tracking_uri(), args.mlflow_experiment)
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
    rank_zero = rank_zero_only.rank == 0
    lock = run_dir_lock(args.run_dir) if rank_zero else contextlib.nullcontext()
    attempt = attempt_log(args.run_dir) if rank_zero else contextlib.nullcontext()
    with lock, attempt:
        log.info("CPU fast paths: %s; memory: %s", fast, memory)
        resolved = resolve_run(model_cfg, train_cfg, vocab)  # every "auto", once
        train_cfg = sized_for(train_cfg, resolved.precision)  # train.by_precision
        start = plan_start(args.run_dir, model_cfg, train_cfg, vocab, resolved)
        # The batch geometry may change within a run (a resume after an out-of-memory error, on
        # fewer GPUs): tags, not params, so that the run goes on. max_tokens as configured
        # ("auto") and as sized for this job.
        settings = train_cfg.to_dict()
        params = {"model": model_cfg.to_dict()}
        params.update({k: v for k, v in settings.items() if k not in GEOMETRY_KEYS})
        geometry = {k: settings[k] for k in GEOMETRY_KEYS}
        geometry.update(resolved.chosen())  # micro_batch_tokens, precision_chosen, ...
        geometry["cpu_fast_paths"] = fast
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
            shared_params=data_params, run_dir=arguments.tracking_run_dir(args, args.run_dir),
            mutable_params=geometry,
        ) as mlrun:  # fmt: skip
            if mlrun is not None:
                _best_effort(mlrun, "the data artifacts", _log_data_artifacts, mlrun, args)
                _best_effort(mlrun, "the dataset inputs", _log_data_inputs, mlrun, args)
            # CPU, memory (GPU) while it trains: MLflow's system metrics (config system_metrics)
            with tracking.system_metrics(mlrun):
                summary = train_run(
                    data,
                    args.run_dir,
                    model_cfg,
                    train_cfg,
                    vocab,
                    resolved=resolved,
                    start=start,
                    tracker=mlrun,
                    callbacks=callbacks,
                    progress_bar=sys.stderr.isatty(),
                )
            if mlrun is not None and summary is not None:
                _best_effort(mlrun, SUMMARY_FILE, mlrun.log_artifact, args.run_dir / SUMMARY_FILE)
    return 0


def _log_data_artifacts(mlrun: tracking.StageRun, args: argparse.Namespace) -> None:
    mlrun.log_artifact(args.spm_model, "data")
    if args.clean_report is not None and args.clean_report.is_file():
        mlrun.log_artifact(args.clean_report, "data")


def _log_data_inputs(mlrun: tracking.StageRun, args: argparse.Namespace) -> None:
    """The raw corpus files as the run's MLflow dataset inputs (its page's "Datasets")."""
    if args.clean_report is not None and args.clean_report.is_file():
        contexts = {args.train_split: "training", args.valid_split: "validation"}
        mlrun.log_data_inputs(tracking.data_inputs(args.clean_report, contexts))


def _best_effort(mlrun: tracking.StageRun, what: str, fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)``; a failing MLflow store is a warning, not a failed training job."""
    try:
        fn(*args)
    except Exception as err:
        tracking.notice(
            f"MLflow: could not log {what} into run {mlrun.run_name!r} "
            f"({tracking.first_line(err)}); training goes on"
        )


@contextlib.contextmanager
def attempt_log(run_dir: Path) -> Iterator[Path]:
    """Copy this process's log records (the package's, Lightning's and Python warnings) into
    ``<run_dir>/logs/attempt-<n>-<UTC time>.log``, n = 1 + the highest attempt there, for the
    whole attempt; an error that ends it is written there too. Call under ``run_dir_lock``."""
    directory = run_dir / ATTEMPT_LOG_DIR
    directory.mkdir(parents=True, exist_ok=True)
    numbers = [int(m.group(1)) for p in directory.iterdir() if (m := _ATTEMPT.match(p.name))]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = directory / f"attempt-{max(numbers, default=0) + 1:03d}-{stamp}.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # Lightning's logger propagates to the root unless it was imported before logging was set
    # up; then it has its own handler, and the copy needs one there too.
    loggers = [logging.getLogger()]
    loggers += [
        logger
        for logger in (logging.getLogger("lightning.pytorch"), logging.getLogger("lightning"))
        if not logger.propagate
    ]
    for logger in loggers:
        logger.addHandler(handler)
    # warnings.warn (Lightning's hints) as log records, as long as the attempt lasts
    captured_before = getattr(logging, "_warnings_showwarning", None) is not None
    logging.captureWarnings(True)
    log.info("attempt log: %s", path)
    try:
        yield path
    except BaseException as err:
        if isinstance(err, UserFacingError):
            message, exc_info = f"error: {err}", None
        else:
            message, exc_info = f"attempt ended by {type(err).__name__}", err
        record = logging.LogRecord(
            log.name, logging.ERROR, __file__, 0, message, None,
            (type(err), err, err.__traceback__) if exc_info else None,
        )  # fmt: skip
        handler.handle(record)  # here only: the CLI prints the error line itself
        raise
    finally:
        logging.captureWarnings(captured_before)
        for logger in loggers:
            logger.removeHandler(handler)
        handler.close()
