"""The rules that turn a config's "auto" values into this machine's: accelerator, devices,
precision with the CPU's measured table, pad multiple and §5.1's gradient accumulation. A run
applies them once, into ``training.resolution.Resolved``; the planner (``training.preflight``)
applies them to the machine it plans for.
"""

from __future__ import annotations

import torch

from transformer_nmt.errors import ConfigError
from transformer_nmt.training.config import TrainConfig


def resolve_accelerator(cfg: TrainConfig) -> str:
    if cfg.accelerator != "auto":
        return cfg.accelerator
    return "gpu" if torch.cuda.is_available() else "cpu"


def check_devices_exist(cfg: TrainConfig) -> None:
    """A GPU config on a machine without one (or with too few) is a one-line ConfigError
    naming the key, raised before anything starts (no Lightning traceback, no MLflow run)."""
    if resolve_accelerator(cfg) not in ("gpu", "cuda"):
        return
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available == 0:
        raise ConfigError(
            f"train config key 'accelerator' is {cfg.accelerator!r} but this machine has no CUDA "
            "GPU: GPU recipes run with `snakemake --profile profiles/gpu` on a GPU machine; "
            "here use a CPU config (config/config.yaml) or set train.accelerator: cpu"
        )
    if cfg.devices != "auto" and int(cfg.devices) > available:
        raise ConfigError(
            f"train config key 'devices' is {cfg.devices} but this machine has {available} GPU(s)"
        )


def resolve_devices(cfg: TrainConfig) -> int:
    """Processes per node: ``devices``, or for "auto" every visible GPU (one CPU process)."""
    if cfg.devices != "auto":
        return int(cfg.devices)
    if resolve_accelerator(cfg) in ("gpu", "cuda"):
        return max(torch.cuda.device_count(), 1)
    return 1


def cpu_bf16_support() -> str:
    """How this CPU computes bf16: "amx" (AMX-BF16 tiles: Xeon Sapphire Rapids and newer),
    "avx512_bf16" (AVX512-BF16 dot products without AMX: AMD Zen 4, Xeon Cooper Lake), or "none"
    (oneDNN emulates bf16 with conversions)."""
    if torch.cpu._is_amx_tile_supported():
        return "amx"
    if torch.cpu._is_avx512_bf16_supported():
        return "avx512_bf16"
    return "none"


# ``precision: auto`` on a CPU, by ``cpu_bf16_support``: chosen by measurement of the demo's
# training (benchmarks/log/), with the reason the train log and MLflow give. bf16-mixed
# goes in where a measurement shows it paying in speed without the memory growth oneDNN's
# per-shape kernels bring.
CPU_AUTO_PRECISION: dict[str, tuple[str, str]] = {
    "amx": (
        "32-true",
        "AMX-BF16: bf16-mixed trained the demo 1.5x faster with batch widths rounded to 8, "
        "but 0.6-1.5 BLEU worse at the same steps (2-core Xeon, 2026-11-25); given "
        "the same minutes (2,400 steps against 1,600) +0.76 dev BLEU over 3 seeds, so fp32 "
        "where the config sizes no bf16-mixed run (train.by_precision) (2026-11-27)",
    ),
    "avx512_bf16": (
        "32-true",
        "AVX512-BF16 without AMX: bf16-mixed trains the demo 1.3x faster (real target "
        "tokens/s, widths rounded to 8) and, given the same minutes (2,400 steps against "
        "1,600), scored +0.8 dev BLEU (one seed); fp32 where the config sizes no "
        "bf16-mixed run (train.by_precision) (2-core EPYC, 2026-11-26, "
        "benchmarks/log/2026-11-26.md)",
    ),
    "none": (
        "32-true",
        "no bf16 instructions: bf16-mixed is emulated, a training step 3.3x slower with "
        "AVX512 (Xeon, 2026-11-30) and ~20x with AVX2 alone (2026-11-22; benchmarks/log/)",
    ),
}


def precision_choice(cfg: TrainConfig) -> tuple[str, str]:
    """The Lightning precision a run trains in, and why. "auto": bf16-mixed on a CUDA device
    with bf16 (Ampere and newer), 16-mixed (fp16 with dynamic loss scaling) on an older one
    (V100: ~3.8x its fp32 speed); on a CPU, ``CPU_AUTO_PRECISION`` for its bf16 support."""
    if cfg.precision != "auto":
        return cfg.precision, "set in the config"
    if resolve_accelerator(cfg) in ("gpu", "cuda") and torch.cuda.is_available():
        if torch.cuda.is_bf16_supported():
            return "bf16-mixed", "auto: the GPU computes in bf16 (Ampere or newer)"
        return "16-mixed", "auto: the GPU has no bf16 (pre-Ampere): fp16 with loss scaling"
    support = cpu_bf16_support()
    if support != "none" and BF16_SIZED in cfg.by_precision:
        # the config sizes a bf16 run (more steps for the same minutes): the CPU can run it
        sized = cfg.by_precision[BF16_SIZED]
        steps = ", ".join(f"{key} {value}" for key, value in sized.items()) or "as configured"
        return BF16_SIZED, (
            f"auto on this CPU: {support.upper().replace('_', '-')} computes bf16 and the config "
            f"sizes a {BF16_SIZED} run (train.by_precision: {steps})"
        )
    precision, why = CPU_AUTO_PRECISION[support]
    return precision, f"auto on this CPU: {why}"


# The precision a ``train.by_precision`` entry makes ``auto`` choose on a CPU with bf16.
BF16_SIZED = "bf16-mixed"


def resolve_precision(cfg: TrainConfig) -> str:
    """The precision of ``precision_choice``."""
    return precision_choice(cfg)[0]


# pad_multiple: auto in 16-bit training: kernels for bf16/fp16 are built per shape (the CPU's
# oneDNN primitives; cuBLAS plans and tensor cores like widths that are multiples of 8).
AUTO_PAD_MULTIPLE_16BIT = 8


def pad_multiple_choice(cfg: TrainConfig) -> tuple[int, str]:
    """The multiple batch widths are rounded up to, and why. "auto": 8 when the run trains in
    16 bits (``resolve_precision``), where each new batch shape builds kernels (on a CPU with
    AMX, bf16-mixed at widths as they come doubled the demo's peak memory to 2.0 GiB); 1 in
    fp32, where rounding only adds padding (0.84x the demo's speed;
    benchmarks/log/2026-11-25.md)."""
    if cfg.pad_multiple != "auto":
        return int(cfg.pad_multiple), "set in the config"
    precision = resolve_precision(cfg)
    if precision.startswith(("bf16", "16")):
        return AUTO_PAD_MULTIPLE_16BIT, f"auto: {precision} builds kernels per batch shape"
    return 1, f"auto: {precision} gains nothing from rounding widths up"


def accumulation_steps(
    tokens_per_update: int,
    max_tokens: int | str,
    world_size: int,
    tgt_tokens_per_batch: float | None = None,
) -> int:
    """§5.1 updates of ~``tokens_per_update`` real target tokens: micro-batches per update,
    ``round(tokens_per_update / (tgt_tokens_per_batch * world_size))``, at least 1.

    ``tgt_tokens_per_batch``: the real (non-padding) target tokens of an average batch of the
    training data (``TokenBatchSampler.real_tokens_per_batch``); without data, ``max_tokens``
    (its upper bound, which ``max_tokens: auto`` needs sized first).
    """
    if not tgt_tokens_per_batch and max_tokens == "auto":
        raise ValueError("max_tokens 'auto' is sized first (training.resolution.resolve_run)")
    per_batch = tgt_tokens_per_batch or float(max_tokens)
    return max(1, round(tokens_per_update / (per_batch * world_size)))


def accumulation(cfg: TrainConfig, tgt_tokens_per_batch: float | None = None) -> int:
    """``accumulation_steps`` of ``cfg`` on this machine's processes (``resolve_devices``)."""
    world = resolve_devices(cfg) * cfg.num_nodes
    return accumulation_steps(cfg.tokens_per_update, cfg.max_tokens, world, tgt_tokens_per_batch)
