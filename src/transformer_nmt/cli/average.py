"""``average``: average the last K checkpoints into one model file (§6.1: K = 5 for base models,
20 for big ones), or an explicit list of checkpoints. fp32 accumulation, identical weights
required, weights only (``checkpoints.MODEL_FILE_FORMAT``)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from transformer_nmt import tracking
from transformer_nmt.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint-dir", type=Path, help="a run's checkpoints/ directory")
    source.add_argument("--inputs", type=Path, nargs="+", help="explicit checkpoint files")
    parser.add_argument(
        "--last", type=int, default=None, help="average the newest K checkpoints (§6.1: 5 or 20)"
    )
    parser.add_argument("--out", type=Path, required=True, help="model file to write")
    tracking.add_cli_arguments(parser)


def select(args: argparse.Namespace) -> list[Path]:
    from transformer_nmt.checkpoints import list_checkpoints

    if args.inputs:
        if args.last is not None:
            raise ConfigError("--last applies to --checkpoint-dir, not to --inputs")
        return list(args.inputs)
    if args.last is None or args.last <= 0:
        raise ConfigError(f"--last must be a positive number of checkpoints, got {args.last}")
    found = list_checkpoints(args.checkpoint_dir)
    if len(found) < args.last:
        raise CheckpointError(
            f"{args.checkpoint_dir}: only {len(found)} checkpoints, --last {args.last} needs "
            f"{args.last} (raise train keep_checkpoints to at least {args.last})"
        )
    return found[-args.last :]


def run(args: argparse.Namespace) -> int:
    from transformer_nmt.checkpoints import (
        average_checkpoints,
        checkpoint_meta,
        experiment_mismatch,
        load_checkpoint,
        save_model_file,
    )

    paths = select(args)
    metas = [(p, checkpoint_meta(load_checkpoint(p), p)) for p in paths]
    first_path, first = metas[0]
    for path, meta in metas[1:]:
        mismatch = experiment_mismatch(
            meta, model_config=first["model_config"], vocab_sha256=first["vocab"].get("sha256")
        )
        if mismatch:
            raise CheckpointError(f"{path}: trained with {mismatch} than {first_path}")
    steps = [int(m["step"] or 0) for _, m in metas]
    log.info("averaging %d checkpoints: %s", len(paths), ", ".join(p.name for p in paths))
    with tracking.stage_run(
        args.mlflow_experiment,
        args.mlflow_run,
        "average",
        params={"last": args.last if args.last is not None else len(paths)},
        tags={"average.sources": ",".join(p.name for p in paths)},
    ) as mlrun:
        state = average_checkpoints(paths)
        save_model_file(
            args.out,
            model_config=first["model_config"],
            state_dict=state,
            vocab=first["vocab"],
            step=max(steps),
            source_checkpoints=[p.name for p in paths],
        )
        if mlrun is not None:
            mlrun.log_metrics({"average/num_checkpoints": len(paths)}, step=max(steps))
    log.info("wrote %s (step %d)", args.out, max(steps))
    return 0
