"""``train``: train a Transformer with Lightning, resuming from the run's newest checkpoint.

Writes ``<run-dir>/checkpoints/step=*.ckpt`` while it runs (not a Snakemake output: a failed or
killed job keeps them and the next run resumes) and, once ``max_steps`` is reached,
``<run-dir>/train_summary.json`` (the declared output). With tracking flags it logs the
resolved model and train configs as ``train.*`` params, metrics through Lightning, the
SentencePiece model and the cleaning report as artifacts, and the vocabulary's sha256 as a tag.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from transformer_nmt import tracking
from transformer_nmt.errors import ConfigError, UserFacingError

log = logging.getLogger(__name__)

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


def resolve_model_config(spec: dict[str, Any]) -> Any:
    """``{"preset": name, "overrides": {...}}`` -> ``ModelConfig`` (unknown keys: ConfigError)."""
    from transformer_nmt.model.config import apply_overrides, get_preset

    unknown = sorted(set(spec) - {"preset", "overrides"})
    if unknown:
        raise ConfigError(f"--model: unknown key(s) {unknown}; expected 'preset' and 'overrides'")
    overrides = spec.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ConfigError("--model: 'overrides' must be a JSON object of model config keys")
    return apply_overrides(get_preset(str(spec.get("preset", "base"))), overrides)


def run(args: argparse.Namespace) -> int:
    from lightning.pytorch.utilities import rank_zero_only

    from transformer_nmt.data.vocab import load_vocab_info
    from transformer_nmt.training.trainer import TrainConfig

    model_cfg = resolve_model_config(parse_json("--model", args.model))
    train_cfg = TrainConfig.from_dict(parse_json("--train", args.train))
    vocab = load_vocab_info(args.spm_model)
    is_rank_zero = rank_zero_only.rank == 0

    params = {"model": model_cfg.to_dict(), **train_cfg.to_dict()}
    tags = {"data.spm_sha256": vocab.sha256, "data.vocab_size": vocab.size}
    experiment = args.mlflow_experiment if is_rank_zero else None
    with tracking.stage_run(experiment, args.mlflow_run, "train", params, tags) as mlrun:
        if mlrun is not None:
            mlrun.log_artifact(args.spm_model, "data")
            if args.clean_report is not None and args.clean_report.is_file():
                mlrun.log_artifact(args.clean_report, "data")
        summary = train(args, model_cfg, train_cfg, vocab, mlrun)
        if mlrun is not None and summary is not None:
            mlrun.log_artifact(args.run_dir / "train_summary.json")
    return 0


def train(args, model_cfg, train_cfg, vocab, mlrun) -> dict[str, Any] | None:
    """Fit (or resume) and write the summary; returns it on rank 0."""
    import lightning as L

    from transformer_nmt.io_utils import write_json
    from transformer_nmt.training.callbacks import StageRunLogger, Throughput
    from transformer_nmt.training.module import NonFiniteLossError, TranslationModule
    from transformer_nmt.training.trainer import (
        CHECKPOINT_DIR,
        ResumableTranslationDataModule,
        Stopwatch,
        accumulation,
        build_trainer,
        find_resume_point,
        prune_checkpoints,
        resolve_precision,
        world_size,
    )

    watch = Stopwatch()
    run_dir: Path = args.run_dir
    ckpt_dir = run_dir / CHECKPOINT_DIR
    resume = find_resume_point(
        ckpt_dir,
        model_config=model_cfg.to_dict(),
        vocab_sha256=vocab.sha256,
        max_steps=train_cfg.max_steps,
    )
    base_summary = {
        "model_config": model_cfg.to_dict(),
        "train_config": train_cfg.to_dict(),
        "vocab": vocab.to_dict(),
        "accumulate_grad_batches": accumulation(train_cfg),
        "world_size": world_size(train_cfg),
        "precision": resolve_precision(train_cfg),
    }
    summary_path = run_dir / "train_summary.json"
    if resume.step >= train_cfg.max_steps:
        log.info("%s is at max_steps=%d: only writing the summary", resume.path, resume.step)
        if rank_zero():
            summary = {
                **base_summary,
                "final_step": resume.step,
                "checkpoints": [p.name for p in resume.checkpoints],
                "resumed_from": resume.path.name if resume.path else None,
                "trained_this_job": False,
                "wall_seconds": watch.seconds(),
                "metrics": _previous_metrics(summary_path),
            }
            write_json(summary_path, summary)
            return summary
        return None
    if resume.path is not None:
        log.info("resuming from %s at step %d", resume.path, resume.step)
    else:
        log.info("no checkpoint in %s: starting at step 0", ckpt_dir)

    L.seed_everything(train_cfg.seed, workers=True, verbose=False)
    module = TranslationModule(
        model_cfg.to_dict(),
        vocab.to_dict(),
        train_cfg.to_dict(),
        spm_model=str(args.spm_model),
        valid_split=args.valid_split,
    )
    data = ResumableTranslationDataModule(
        args.bin_dir,
        args.src,
        args.tgt,
        max_tokens=train_cfg.max_tokens,
        seed=train_cfg.seed,
        train_split=args.train_split,
        valid_split=args.valid_split,
        num_workers=train_cfg.num_workers,
        max_positions=min(train_cfg.max_positions, model_cfg.max_positions),
    )
    callbacks = []
    trace_dir = os.environ.get(BATCH_TRACE_ENV)
    if trace_dir:
        from transformer_nmt.training.callbacks import BatchTrace

        callbacks.append(BatchTrace(Path(trace_dir)))
    trainer = build_trainer(
        train_cfg,
        run_dir,
        logger=StageRunLogger(mlrun) if mlrun is not None else False,
        callbacks=callbacks,
        enable_progress_bar=sys.stderr.isatty(),
    )
    try:
        trainer.fit(module, datamodule=data, ckpt_path=resume.path, weights_only=True)
    except NonFiniteLossError as err:
        kept = [p.name for p in _list(ckpt_dir)]
        last = kept[-1] if kept else "none (no checkpoint was written yet)"
        raise NonFiniteLossError(f"{err}; last good checkpoint: {last}") from err
    if trainer.global_step < train_cfg.max_steps:  # e.g. Ctrl-C: Lightning returns from fit
        kept = [p.name for p in _list(ckpt_dir)]
        raise TrainingInterrupted(
            f"training stopped at step {trainer.global_step} before max_steps="
            f"{train_cfg.max_steps} (interrupted); newest checkpoint: "
            f"{kept[-1] if kept else 'none'}; run the same command again to resume"
        )
    if not trainer.is_global_zero:
        return None
    kept = prune_checkpoints(ckpt_dir, train_cfg.keep_checkpoints)
    # The last logged value of every train/ and val/ metric (no per-step host copies needed).
    metrics = {
        key: float(value)
        for key, value in trainer.callback_metrics.items()
        if key.startswith(("train/", "val/"))
    }
    (throughput,) = [cb for cb in trainer.callbacks if isinstance(cb, Throughput)]
    metrics["train/tgt_tokens_per_s"] = throughput.last_rate
    metrics["train/tgt_tokens_per_s_mean"] = throughput.mean_tgt_tokens_per_s()
    summary = {
        **base_summary,
        "final_step": int(trainer.global_step),
        "checkpoints": [p.name for p in kept],
        "resumed_from": resume.path.name if resume.path else None,
        "trained_this_job": True,
        "train_tokens_this_job": dict(throughput.total_tokens),
        "wall_seconds": watch.seconds(),
        "metrics": metrics,
    }
    write_json(summary_path, summary)
    log.info("wrote %s (final step %d)", summary_path, trainer.global_step)
    return summary


class TrainingInterrupted(UserFacingError):
    """Training ended before max_steps without an error (interrupted): no summary is written."""


def rank_zero() -> bool:
    from lightning.pytorch.utilities import rank_zero_only

    return rank_zero_only.rank == 0


def _list(ckpt_dir: Path) -> list[Path]:
    from transformer_nmt.checkpoints import list_checkpoints

    return list_checkpoints(ckpt_dir)


def _previous_metrics(summary_path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(summary_path.read_text(encoding="utf-8")).get("metrics", {}))
    except (OSError, ValueError, AttributeError):
        return {}
