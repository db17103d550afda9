"""``plan``: a pre-flight table of a config's experiments before a long run.

    python -m transformer_nmt plan --configfile config/experiments/wmt14_en_de_base.yaml \\
        --gpus 8 --gpu-kind h100

For each experiment: model and parameters, tokens per batch and per update, the gradient
accumulation on the given GPUs, the worst-case batch and its peak memory per device (measured
on a local CUDA device, else estimated: ``training/preflight.py``), expected steps/hour and the
hours and GPU-hours to ``max_steps``. A worst-case batch that does not fit is refused with one
line naming the experiment's ``max_tokens``. Offline and data-free: the vocabulary size comes
from the config's ``data:`` settings.

The config is read and checked exactly as the Snakefile does (``experiments.load_pipeline``:
its JSON schema with ``snakemake.utils.validate``, then ``Pipeline``), also from an installed
package without a checkout (the schema and the registry are package data).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_nmt.errors import ConfigError
from transformer_nmt.experiments import load_pipeline
from transformer_nmt.training import preflight as pf
from transformer_nmt.training.hardware import (
    GIB,
    GPU_KINDS,
    USABLE_FRACTION,
    Target,
    cpu_target,
    gpu_target,
)
from transformer_nmt.training.memory import AUTO_MARGIN, AUTO_STEP


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--configfile", type=Path, required=True, help="a config (as for snakemake --configfile)"
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs per node for GPU experiments (default: train.devices, 1 for 'auto')",
    )
    parser.add_argument(
        "--gpu-kind",
        default=None,
        help=f"GPU model ({', '.join(GPU_KINDS)}); default: the local GPU (measured), else "
        "h100; a named model is planned from its data sheet memory and recorded speed, never "
        "measured on this machine's GPU",
    )
    parser.add_argument(
        "--estimate-only",
        action="store_true",
        help="never measure on a local GPU (the analytic estimate only: fast)",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=Path("results"),
        help="where the runs' checkpoints will be written (default: results/ here): its free "
        "disk is checked against what the checkpoints need",
    )
    parser.add_argument(
        "--tokens-per-s",
        type=float,
        default=None,
        help="assume this training speed (target tokens/s per device) instead of the recorded",
    )


def _local_gpu() -> torch.device | None:
    return torch.device("cuda", 0) if torch.cuda.is_available() else None


def _target(args: argparse.Namespace, accelerator: str, devices: int | str) -> Target:
    """Where an experiment trains: the CPU (this machine's RAM) or ``--gpus`` GPUs."""
    local = _local_gpu()
    wants_gpu = accelerator in ("gpu", "cuda") or (
        accelerator == "auto" and (args.gpu_kind is not None or local is not None)
    )
    if not wants_gpu:
        return cpu_target()
    gpus = args.gpus if args.gpus is not None else (devices if isinstance(devices, int) else 1)
    if args.gpu_kind is None and local is not None:
        if gpus <= 0:
            raise ConfigError(f"--gpus must be a positive integer, got {gpus}")
        props = torch.cuda.get_device_properties(local)
        name = torch.cuda.get_device_name(local)
        return Target("cuda", gpus, props.total_memory, f"{name} (this machine)")
    if args.gpu_kind is None:  # no GPU here and none named
        default = gpu_target("h100", gpus)
        return dataclasses.replace(
            default, memory_source=f"{default.memory_source} (the default --gpu-kind)"
        )
    return gpu_target(args.gpu_kind, gpus)


@dataclass(frozen=True)
class Entry:
    """One experiment's plan and what a refusal needs to name and advise."""

    plan: pf.Plan
    target: Target
    key: str  # the config key of its max_tokens
    model_cfg: Any  # ModelConfig
    train_cfg: Any  # TrainConfig
    vocab_size: int


def plan_config(args: argparse.Namespace) -> list[Entry]:
    """The plan of every experiment of ``args.configfile`` (sorted by name)."""
    from transformer_nmt.model.config import model_config_from_spec
    from transformer_nmt.training.config import TrainConfig

    pipeline = load_pipeline(args.configfile)
    if args.gpu_kind is not None:
        gpu_target(args.gpu_kind, 1)  # an unknown kind fails before any work
    plans = []
    for name in pipeline.experiments():
        exp = pipeline.experiment(name)
        spec = pipeline.train_config(name)
        try:
            model_cfg = model_config_from_spec(spec["model"])
            train_cfg = TrainConfig.from_dict(spec["train"])
        except ConfigError as err:
            raise ConfigError(f"{args.configfile}: experiments.{name}: {err}") from None
        vocab = int(pipeline.data_settings(exp["dataset"], exp["pair"])["vocab_size"])
        target = _target(args, train_cfg.accelerator, train_cfg.devices)
        measure = None
        # Measure only on the GPU the plan is for: with --gpu-kind naming a model, this
        # machine's GPU (maybe another model) would give that plan its own memory and speed.
        if not args.estimate_only and target.kind != "cpu" and args.gpu_kind is None:
            measure = _local_gpu()
        plan = pf.plan_experiment(
            name, exp["preset"], model_cfg, train_cfg, vocab, target,
            measure_on=measure, tokens_per_s=args.tokens_per_s,
        )  # fmt: skip
        key = f"experiments.{name}.train.max_tokens"
        plans.append(Entry(plan, target, key, model_cfg, train_cfg, vocab))
    return plans


def _number(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def format_table(plans: list[Entry]) -> str:
    header = (
        "experiment", "model", "precision", "tokens/batch", "tokens/update (target)",
        "devices x accum", "worst batch", "peak/device", "usable/device", "fits",
        "steps/h", "hours", "device-hours", "disk (checkpoints)",
    )  # fmt: skip
    rows = []
    for entry in plans:
        plan, target = entry.plan, entry.target
        usable = plan.usable_bytes
        rows.append((
            plan.name,
            f"{plan.preset} ({plan.params / 1e6:.1f}M)",
            plan.precision,
            f"auto: {plan.max_tokens:,}" if plan.max_tokens_auto else f"{plan.max_tokens:,}",
            f"{plan.update_tokens:,} ({plan.tokens_per_update:,})",
            f"{plan.world_size} {target.kind} x {plan.accumulation}",
            f"{plan.batch} x {plan.width}",
            "OOM" if plan.peak_bytes < 0
            else f"{plan.peak_bytes / GIB:.2f} GiB {plan.peak_source}",
            "n/a" if usable is None else f"{usable / GIB:.1f} GiB",
            "yes" if plan.fits else "NO",
            _number(plan.steps_per_hour),
            _number(plan.hours, 1),
            _number(plan.device_hours, 1),
            f"{plan.disk_bytes / GIB:.1f} GiB",
        ))  # fmt: skip
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    notes = [
        "tokens/update = max_tokens x devices x accumulation with full batches (an upper bound: "
        "real batches carry padding); the accumulation is training.rules.accumulation's",
        "worst batch = rows x width (BOS/EOS included) of the allowed shape with the largest peak;"
        " 'estimated' = training/preflight.py's analytic count, 'measured' = a local CUDA step",
        f"usable = {USABLE_FRACTION:.0%} of a device's memory",
        "disk = the checkpoints at their most: keep_checkpoints - 1 older ones with the fp32 "
        "weights only (kept for averaging) and, while one is written, two full ones (weights "
        f"and Adam's {pf.ADAM_MOMENTS} moments)",
    ]
    if any(entry.plan.max_tokens_auto for entry in plans):
        notes.append(
            f"auto: the largest max_tokens whose estimated worst batch fills at most "
            f"{AUTO_MARGIN:.0%} of the usable memory, at most tokens_per_update / devices, "
            f"in steps of {AUTO_STEP}; the train job sizes it on its own device and logs it"
        )
    seen: set[str] = set()
    for entry in plans:
        plan, target = entry.plan, entry.target
        if target.memory_source not in seen:
            seen.add(target.memory_source)
            notes.append(f"memory: {target.memory_source}")
        if plan.update_tokens > 1.5 * plan.tokens_per_update:
            notes.append(
                f"{plan.name}: {plan.world_size} devices x max_tokens {plan.max_tokens:,} "
                f"overshoot tokens_per_update {plan.tokens_per_update:,}: fewer devices or a "
                "smaller max_tokens keep the §5.1 batch"
            )
        if plan.throughput is None:
            notes.append(
                f"{plan.name}: no recorded throughput for {plan.model} on {target.kind} "
                "(measure with plan on that device, or pass --tokens-per-s)"
            )
        elif plan.throughput.source not in seen:
            seen.add(plan.throughput.source)
            notes.append(
                f"speed of {plan.model} on {target.kind}: "
                f"{plan.throughput.tgt_tokens_per_s:,.0f} target tokens/s per device "
                f"({plan.throughput.source}); assumes linear scaling over devices"
            )
    hours = [entry.plan.hours for entry in plans]
    if len(plans) > 1 and None not in hours:
        notes.append(
            f"total: {len(plans)} experiments, {sum(hours):.1f} hours ({60 * sum(hours):.0f} "
            "minutes) of training one after "
            f"another ({sum(e.plan.device_hours for e in plans):.1f} device-hours), data stages, "
            "averaging and decoding not included"
        )  # fmt: skip
    return "\n".join([*out, "", *(f"- {n}" for n in notes)])


def free_disk_bytes(path: Path) -> tuple[Path, int]:
    """The free bytes of the filesystem ``path`` will be on (its nearest existing ancestor's)."""
    where = path.absolute()
    while not where.exists():
        where = where.parent
    return where, shutil.disk_usage(where).free


def run(args: argparse.Namespace) -> int:
    plans = plan_config(args)
    print(format_table(plans))
    for e in plans:
        if not e.plan.fits:
            raise ConfigError(pf.refusal(e.plan, e.key, e.model_cfg, e.train_cfg, e.vocab_size))
    where, free = free_disk_bytes(args.results_dir)
    need = sum(e.plan.disk_bytes for e in plans)
    print(f"\ncheckpoints: up to {need / GIB:.1f} GiB; {args.results_dir}: {free / GIB:.1f} "
          f"GiB free (on {where})")  # fmt: skip
    if need > free:
        largest = max(plans, key=lambda e: e.plan.disk_bytes)
        raise ConfigError(
            f"{args.results_dir}: {free / GIB:.1f} GiB free, but the checkpoints of these "
            f"runs need up to {need / GIB:.1f} GiB ({largest.plan.name}: "
            f"{largest.plan.disk_bytes / GIB:.1f} GiB with keep_checkpoints "
            f"{largest.plan.keep_checkpoints}): free space, write results/ to a larger disk "
            f"(--results-dir), or lower train.keep_checkpoints"
        )
    return 0
