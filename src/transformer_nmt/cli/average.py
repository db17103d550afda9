"""``average``: average the last K checkpoints into one model file (§6.1: K = 5 for base models,
20 for big ones), or an explicit list of checkpoints. fp32 accumulation, identical weights
required, weights only (``checkpoints.MODEL_FILE_FORMAT``).

``--last auto`` chooses K on the dev set (``evaluation.selection``): it needs the pair's
SentencePiece model, the dev source and reference files and the target language, and writes the
table K -> dev BLEU to ``average_selection.json`` beside the model file."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from transformer_nmt import tracking
from transformer_nmt.cli import arguments
from transformer_nmt.errors import CheckpointError, ConfigError
from transformer_nmt.runs.layout import SELECTION_FILE

AUTO = "auto"

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint-dir", type=Path, help="a run's checkpoints/ directory")
    source.add_argument("--inputs", type=Path, nargs="+", help="explicit checkpoint files")
    parser.add_argument(
        "--last",
        default=None,
        help="average the newest K checkpoints (§6.1: 5 or 20), or 'auto': the K of "
        "{1, 5, 10, 20} with the best dev BLEU (with --spm-model, --dev-src/--dev-ref, --tgt-lang)",
    )
    parser.add_argument("--out", type=Path, required=True, help="model file to write")
    parser.add_argument(
        "--spm-model", type=Path, help="--last auto: the pair's SentencePiece model"
    )
    parser.add_argument("--dev-src", type=Path, help="--last auto: dev source sentences")
    parser.add_argument("--dev-ref", type=Path, help="--last auto: dev references")
    parser.add_argument("--tgt-lang", help="--last auto: target language (for scoring)")
    arguments.add_search_arguments(parser)  # --last auto: the search that scores the dev set
    arguments.add_tracking_arguments(parser)


def select(args: argparse.Namespace) -> list[Path]:
    from transformer_nmt.runs.checkpoints import list_checkpoints

    if args.inputs:
        if args.last is not None:
            raise ConfigError("--last applies to --checkpoint-dir, not to --inputs")
        return list(args.inputs)
    if args.last == AUTO:
        missing = [
            f"--{k.replace('_', '-')}"
            for k in ("spm_model", "dev_src", "dev_ref", "tgt_lang")
            if getattr(args, k) is None
        ]
        if missing:
            raise ConfigError(f"--last auto needs {', '.join(missing)}")
        found = list_checkpoints(args.checkpoint_dir)
        if not found:
            raise CheckpointError(f"{args.checkpoint_dir}: no checkpoints to average")
        return found
    try:
        args.last = int(args.last)
    except (TypeError, ValueError):
        args.last = None
    if args.last is None or args.last <= 0:
        raise ConfigError("--last must be a positive number of checkpoints or 'auto'")
    found = list_checkpoints(args.checkpoint_dir)
    if len(found) < args.last:
        raise CheckpointError(
            f"{args.checkpoint_dir}: only {len(found)} checkpoints, --last {args.last} needs "
            f"{args.last} (raise train keep_checkpoints to at least {args.last})"
        )
    return found[-args.last :]


def run(args: argparse.Namespace) -> int:
    from transformer_nmt.runs.checkpoints import (
        average_checkpoints,
        checkpoint_meta,
        experiment_mismatch,
        load_checkpoint,
        save_model_file,
    )

    paths = select(args)
    metas = [(p, checkpoint_meta(load_checkpoint(p, mmap=True), p)) for p in paths]
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
        run_dir=arguments.tracking_run_dir(args),
    ) as mlrun:
        if args.last == AUTO:
            num_averaged = _select_on_dev(args, paths, mlrun, max(steps))
        else:
            # a table from an earlier --last auto would describe another model: the report and
            # its figure must not show it beside this one
            (args.out.parent / SELECTION_FILE).unlink(missing_ok=True)
            state = average_checkpoints(paths)
            save_model_file(
                args.out,
                model_config=first["model_config"],
                state_dict=state,
                vocab=first["vocab"],
                step=max(steps),
                source_checkpoints=[p.name for p in paths],
            )
            num_averaged = len(paths)
        if mlrun is not None:
            mlrun.log_metrics({"average/num_checkpoints": num_averaged}, step=max(steps))
    log.info("wrote %s (step %d, %d checkpoint(s) averaged)", args.out, max(steps), num_averaged)
    return 0


def _select_on_dev(args: argparse.Namespace, paths: list[Path], mlrun, step: int) -> int:
    """``--last auto``: the best K on the dev set; writes the model and the selection table."""
    from transformer_nmt.evaluation.selection import select_average
    from transformer_nmt.io_utils import write_json

    settings = arguments.search_settings(args)
    selection = select_average(
        paths, args.out, spm_model=args.spm_model, dev_src=args.dev_src, dev_ref=args.dev_ref,
        tgt_lang=args.tgt_lang, settings=settings,
    )  # fmt: skip
    table = args.out.parent / SELECTION_FILE
    write_json(table, {**selection.to_dict(), "dev_src": str(args.dev_src), "step": step})
    log.info(
        "chose the last %d checkpoint(s): dev BLEU %s",
        selection.best_k,
        ", ".join(f"K={k}: {b:.2f}" for k, b in selection.dev_bleu.items()),
    )
    if mlrun is not None:
        mlrun.log_metrics(
            {f"average/dev_bleu_last{k}": b for k, b in selection.dev_bleu.items()}, step=step
        )
        mlrun.set_tags({"average.best_k": selection.best_k})
        mlrun.log_artifact(table)
    return selection.best_k
