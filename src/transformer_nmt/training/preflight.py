"""Pre-flight check of a run: will its worst-case batch fit, and how long will it take?

A §5.1 batch holds at most ``max_tokens`` tokens *with padding* per device, as ``B`` rows of
width ``W`` (``B * W <= max_tokens``). The sampler (``data/sampler.py``) drops examples wider
than ``min(max_tokens, max_positions)``, so every width up to that limit can occur: the
worst-case batch is the ``(B, W) = (max_tokens // W, W)`` whose estimated peak memory is the
largest (ties go to the longest rows: attention grows with ``W``).

Peak memory of one training step (steady state: Adam's states exist, gradients are rebuilt):

- measured (``measure_peak_bytes``): two forward/backward/Adam steps of a random worst-case
  batch on a CUDA device, ``torch.cuda.max_memory_allocated``;
- estimated (``estimate_peak_bytes``) where there is no GPU: fp32 weights, gradients and
  Adam's two moments (16 bytes per parameter; + 2 for autocast's bf16 weight copies), the
  activations each layer saves for backward (from the shapes, below), and the loss's
  ``[tokens x vocab]`` logits and their gradient (in the activations' dtype) with its float32
  chunk buffer: within 2-5% of base's and big's peak on an H200 (benchmarks/records/gpu_h200.json).

Expected speed comes from ``RECORDED_THROUGHPUT`` (target tokens/s per model and device
kind, each with its machine, date and source: ``training/recorded_throughput.yaml``), a
throughput measured on the device, or a number the user gives: never from an assumed
utilisation.

This module is the plan; its parts live by concern: ``training/hardware.py`` (GPU kinds, this
machine, the device, recorded speeds) and ``training/memory.py`` (the worst batch, the peak
estimate and measurement, ``max_tokens: auto``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch

from transformer_nmt.errors import ConfigError
from transformer_nmt.model.config import ModelConfig, get_preset
from transformer_nmt.model.transformer import count_parameters_of
from transformer_nmt.training.config import TrainConfig
from transformer_nmt.training.hardware import (
    GIB,
    GPU_KINDS,
    RECORDED_THROUGHPUT,
    USABLE_FRACTION,
    Target,
    Throughput,
    this_device,
)
from transformer_nmt.training.memory import (
    auto_max_tokens,
    largest_fitting_max_tokens,
    measure_peak_bytes,
    worst_batch,
)
from transformer_nmt.training.objective import fused_loss_wanted
from transformer_nmt.training.rules import accumulation, resolve_precision

# --- the plan of one experiment ---------------------------------------------------------------


def _canonical(precision: str) -> str:
    """Lightning's short precision names as their long ones ("32" is "32-true")."""
    return {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}.get(precision, precision)


def resolve_plan_precision(train_cfg: TrainConfig, target: Target) -> str:
    """``precision: auto`` on the target, as ``rules.resolve_precision`` decides on the
    device: bf16-mixed on a GPU kind with bf16, 16-mixed on one without; on a CPU (this
    machine's) its ``CPU_AUTO_PRECISION``."""
    if train_cfg.precision != "auto":
        return train_cfg.precision
    if target.kind == "cpu":
        return resolve_precision(dataclasses.replace(train_cfg, accelerator="cpu"))
    kind = GPU_KINDS.get(target.kind)
    bf16 = kind.bf16 if kind else torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return "bf16-mixed" if bf16 else "16-mixed"


CHECKPOINT_FLOAT_BYTES = 4  # checkpoints hold fp32 weights and optimizer moments
ADAM_MOMENTS = 2  # exp_avg and exp_avg_sq, one of each per weight (§5.3 Adam)


@dataclass(frozen=True)
class Plan:
    """The plan of one experiment on one ``Target``."""

    name: str
    preset: str
    params: int
    precision: str
    max_tokens: int  # auto_max_tokens' choice when max_tokens_auto
    tokens_per_update: int  # the config's §5.1 target
    world_size: int
    accumulation: int
    batch: int  # worst-case rows
    width: int  # worst-case row width (BOS/EOS included)
    peak_bytes: int
    peak_source: str  # "measured" or "estimated"
    usable_bytes: int | None
    throughput: Throughput | None  # per device
    max_steps: int
    max_tokens_auto: bool = False  # the config said "auto"
    # the preset, or "preset (d_model 128, d_ff 512)" for a model reshaped from it: the key of
    # its recorded throughput (a preset's speed is not a reshaped model's)
    model: str = ""
    keep_checkpoints: int = 1

    @property
    def weights_bytes(self) -> int:
        """A weights-only checkpoint: the fp32 weights (bf16-mixed keeps fp32 masters)."""
        return self.params * CHECKPOINT_FLOAT_BYTES

    @property
    def full_checkpoint_bytes(self) -> int:
        """The newest checkpoint: the weights and Adam's two moments, each fp32."""
        return self.weights_bytes * (1 + ADAM_MOMENTS)

    @property
    def disk_bytes(self) -> int:
        """The most disk the run's checkpoints take: keep - 1 older ones weights-only and, while
        a new full one is written (training/callbacks/checkpoint.py), the previous full one."""
        return self.weights_bytes * (self.keep_checkpoints - 1) + 2 * self.full_checkpoint_bytes

    @property
    def update_tokens(self) -> int:
        """Tokens per update with full batches (an upper bound: real batches carry padding)."""
        return self.max_tokens * self.accumulation * self.world_size

    @property
    def fits(self) -> bool:
        return self.peak_bytes >= 0 and (
            self.usable_bytes is None or self.peak_bytes <= self.usable_bytes
        )

    @property
    def steps_per_hour(self) -> float | None:
        if self.throughput is None:
            return None
        return self.throughput.tgt_tokens_per_s * self.world_size * 3600 / self.update_tokens

    @property
    def hours(self) -> float | None:
        rate = self.steps_per_hour
        return None if rate is None else self.max_steps / rate

    @property
    def device_hours(self) -> float | None:
        hours = self.hours
        return None if hours is None else hours * self.world_size


def plan_experiment(
    name: str,
    preset: str,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    vocab_size: int,
    target: Target,
    *,
    measure_on: torch.device | None = None,
    timed_steps: int = 3,
    tokens_per_s: float | None = None,
) -> Plan:
    """The plan of one experiment: batch, accumulation on ``target.devices`` x ``num_nodes``
    processes, worst-case peak memory (measured on ``measure_on``, a CUDA device, else
    estimated), expected speed (``tokens_per_s`` > measured > ``RECORDED_THROUGHPUT``). A speed
    is measured only when the target is the local GPU itself (``target.kind == "cuda"``).
    ``max_tokens: auto`` is sized to ``target``'s memory first (``auto_max_tokens``)."""
    cfg = dataclasses.replace(train_cfg, devices=target.devices)
    precision = resolve_plan_precision(cfg, target)
    cfg = cfg.for_precision(precision)  # train.by_precision: the run's steps in that precision
    params = count_parameters_of(model_cfg, vocab_size)
    world = target.devices * cfg.num_nodes
    auto = cfg.max_tokens == "auto"
    if auto:
        if target.memory_bytes is None:
            raise ConfigError("train.max_tokens: auto needs the device's memory: give a number")
        chosen = auto_max_tokens(model_cfg, cfg, vocab_size, precision, target.memory_bytes, world)
        cfg = dataclasses.replace(cfg, max_tokens=max(chosen, 1))  # 1: the plan then refuses
    rows, width, est = worst_batch(model_cfg, cfg, vocab_size, precision, params)
    peak, source = est.total, "estimated"
    model = model_name(preset, model_cfg)
    throughput = RECORDED_THROUGHPUT.get((model, target.kind))
    if throughput is not None and throughput.precision not in (None, _canonical(precision)):
        throughput = None  # measured in another precision: not this plan's speed
    if throughput is None:
        throughput = scaled_throughput(params, vocab_size, target.kind, _canonical(precision))
    if measure_on is not None:
        measured = measure_peak_bytes(
            model_cfg, vocab_size, rows, width, precision, measure_on,
            timed_steps if target.kind == "cuda" else 0,
            fused_loss=fused_loss_wanted(cfg.fused_loss, measure_on),
        )  # fmt: skip
        peak, source = measured.peak_bytes, "measured"
        if measured.tgt_tokens_per_s > 0:
            throughput = Throughput(
                measured.tgt_tokens_per_s,
                f"measured on {rows}x{width} batches ({torch.cuda.get_device_name(measure_on)})",
            )
    if tokens_per_s is not None:
        throughput = Throughput(tokens_per_s, "--tokens-per-s")
    usable = None
    if target.memory_bytes is not None:
        usable = int(target.memory_bytes * USABLE_FRACTION)
    return Plan(
        name=name,
        preset=preset,
        params=params,
        precision=precision,
        max_tokens=cfg.max_tokens,
        tokens_per_update=cfg.tokens_per_update,
        world_size=world,
        accumulation=accumulation(cfg),
        batch=rows,
        width=width,
        peak_bytes=peak,
        peak_source=source,
        usable_bytes=usable,
        throughput=throughput,
        max_steps=cfg.max_steps,
        max_tokens_auto=auto,
        model=model,
        keep_checkpoints=cfg.keep_checkpoints,
    )


SHAPE_FIELDS = ("N", "d_model", "d_ff", "h", "d_k", "d_v")  # what a step's cost depends on


def model_from_name(name: str) -> ModelConfig | None:
    """The model a ``model_name`` names (``"tiny (d_model 128, d_ff 512)"``); None if unknown."""
    preset, _, fields_text = name.partition(" (")
    try:
        cfg = get_preset(preset)
        changes = dict(item.split(" ", 1) for item in fields_text.rstrip(")").split(", ") if item)
        return dataclasses.replace(cfg, **{k: int(v) for k, v in changes.items()})
    except (ConfigError, ValueError, TypeError):
        return None


@functools.cache
def _recorded_parameters(name: str, vocab_size: int) -> int | None:
    """The parameter count of a recorded model (one build per name and vocabulary, however many
    experiments a plan scales from it); None if the name is not a model's."""
    cfg = model_from_name(name)
    return None if cfg is None else count_parameters_of(cfg, vocab_size)


def scaled_throughput(params: int, vocab_size: int, kind: str, precision: str) -> Throughput | None:
    """A speed for a model with no recorded one on ``kind``: the recorded model on that device
    kind (and precision) nearest in parameter count, its tokens/s scaled by the ratio of the
    parameter counts (a step's work per token grows with them; attention over the sentence
    length is left out, so short-sentence data fits best). The source says so."""
    best: tuple[float, Throughput, str, int] | None = None
    for (name, recorded_kind), throughput in RECORDED_THROUGHPUT.items():
        if recorded_kind != kind or throughput.precision not in (None, precision):
            continue
        recorded_params = _recorded_parameters(name, vocab_size)
        if recorded_params is None:
            continue
        distance = abs(math.log(recorded_params / params))
        if best is None or distance < best[0]:
            best = (distance, throughput, name, recorded_params)
    if best is None:
        return None
    _, throughput, name, recorded_params = best
    return Throughput(
        throughput.tgt_tokens_per_s * recorded_params / params,
        f"scaled from {name}'s {throughput.tgt_tokens_per_s:,.0f} tokens/s by its parameter "
        f"count, {recorded_params / 1e6:.1f}M against {params / 1e6:.1f}M ({throughput.source})",
        throughput.precision,
    )


def model_name(preset: str, model_cfg: ModelConfig) -> str:
    """``preset``, or ``"preset (d_model 128, d_ff 512)"`` naming the shape fields in which
    ``model_cfg`` departs from its preset (a step's cost differs, so does its speed)."""
    try:
        base = get_preset(preset)
    except ConfigError:
        return preset
    changed = [
        f"{key} {getattr(model_cfg, key)}"
        for key in SHAPE_FIELDS
        if getattr(model_cfg, key) != getattr(base, key)
    ]
    return f"{preset} ({', '.join(changed)})" if changed else preset


def refusal(
    plan: Plan, key: str, model_cfg: ModelConfig, train_cfg: TrainConfig, vocab: int
) -> str:
    """One line: why ``plan`` does not fit, naming the config ``key`` and a max_tokens that does."""
    need = (
        "does not fit (out of memory)"
        if plan.peak_bytes < 0
        else (f"needs {plan.peak_bytes / GIB:.1f} GiB ({plan.peak_source})")
    )
    usable = plan.usable_bytes or 0
    cfg = dataclasses.replace(train_cfg, max_tokens=plan.max_tokens)
    fitting = largest_fitting_max_tokens(model_cfg, cfg, vocab, plan.precision, usable)
    if fitting >= plan.max_tokens:  # the estimate fits where the measurement did not
        fitting = plan.max_tokens * 3 // 4
    chose = f"auto chose {plan.max_tokens}: " if plan.max_tokens_auto else ""
    advice = f"{chose}lower it to at most ~{fitting}"
    if not fitting:
        advice = "no max_tokens fits: a smaller model"
    return (
        f"{key}: the worst-case batch of {plan.batch} x {plan.width} tokens ({plan.precision}) "
        f"{need} but one device has {usable / GIB:.1f} GiB usable "
        f"({USABLE_FRACTION:.0%}); {advice} (gradient accumulation keeps tokens_per_update)"
    )


def check_fits(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    vocab_size: int,
    accelerator: str,
    precision: str,
    *,
    processes: int = 1,
    device_index: int = 0,
) -> Plan:
    """The train stage's check before its first step: on a CUDA device (``device_index``: this
    rank's own GPU, ``cluster.local_rank()``), measure the worst batch against the device's
    memory; on a CPU, the estimate against the available RAM (shared by the run's processes on
    this node). Raises a one-line ConfigError naming ``train.max_tokens`` when it does not fit.
    ``max_tokens`` must be a number here: ``size_max_tokens`` sizes "auto" first. The run's
    settings come resolved (``training.resolution.resolve_run``): ``processes`` on this node."""
    cfg = dataclasses.replace(
        train_cfg, accelerator=accelerator, precision=precision, devices=processes
    )
    device, target = this_device(accelerator, device_index, processes)
    plan = plan_experiment(
        "train", "", model_cfg, cfg, vocab_size, target, measure_on=device, timed_steps=0
    )
    if not plan.fits:
        raise ConfigError(refusal(plan, "train.max_tokens", model_cfg, cfg, vocab_size))
    return plan


def size_max_tokens(
    model_cfg: ModelConfig, train_cfg: TrainConfig, vocab_size: int, precision: str, target: Target
) -> Plan:
    """``max_tokens: auto`` on ``target``, this process's device (``plan.max_tokens``), from the
    estimate alone: every process of a run computes the same size from the same numbers (a GPU's
    total memory; a CPU's total RAM shared by the node's processes: ``this_device(...,
    cpu_ram=total_ram_bytes())``), so DDP's ranks agree without talking. ``check_fits`` then
    measures the chosen size on a GPU."""
    if train_cfg.max_tokens != "auto":
        raise ValueError(f"size_max_tokens sizes max_tokens 'auto', got {train_cfg.max_tokens!r}")
    cfg = dataclasses.replace(train_cfg, precision=precision, devices=target.devices)
    return plan_experiment("train", "", model_cfg, cfg, vocab_size, target)
