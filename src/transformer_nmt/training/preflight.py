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
  ``[tokens x vocab]`` tensors (logits, log-probabilities and their gradients, fp32).

Expected speed comes from ``RECORDED_THROUGHPUT`` (target tokens/s per preset and device
kind, each with its source in ``benchmarks/RESULTS.md``), a throughput measured on the device,
or a number the user gives: never from an assumed utilisation.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_nmt.errors import ConfigError
from transformer_nmt.model.config import ModelConfig, get_preset
from transformer_nmt.model.transformer import count_parameters_of
from transformer_nmt.training.config import (
    TrainConfig,
    accumulation,
    resolve_devices,
    resolve_precision,
)

GIB = 1024**3


@dataclass(frozen=True)
class GpuKind:
    """A GPU model: its memory (GiB, as sold) and whether it computes in bf16 (``precision:
    auto`` picks bf16-mixed there and 16-mixed elsewhere, as ``training.config.resolve_precision``
    does on the device)."""

    memory_gib: float
    bf16: bool


# The one home of known GPU memory sizes (vendors' data sheets). "a100" and "v100" without a
# size mean the smaller card: a plan must not promise what the smaller variant cannot hold.
GPU_KINDS: dict[str, GpuKind] = {
    "h100": GpuKind(80, bf16=True),
    "h200": GpuKind(141, bf16=True),
    "a100-40": GpuKind(40, bf16=True),
    "a100-80": GpuKind(80, bf16=True),
    "a100": GpuKind(40, bf16=True),
    "v100-16": GpuKind(16, bf16=False),
    "v100-32": GpuKind(32, bf16=False),
    "v100": GpuKind(16, bf16=False),
}

# Fraction of a device's memory a step may use: the rest is for the CUDA context, the caching
# allocator's fragmentation and validation/search buffers (on a CPU: the data loader, MLflow).
USABLE_FRACTION = 0.9


@dataclass(frozen=True)
class Throughput:
    """Target tokens/s of one device training a preset, and where the number comes from;
    ``precision``: the one it was measured in (None: whatever the plan uses), a plan in another
    precision does not use it."""

    tgt_tokens_per_s: float
    source: str
    precision: str | None = None


# NVIDIA DeepLearningExamples, PyTorch/Translation/Transformer (fairseq's transformer-big,
# pre-LN, WMT14 EN-DE, tokens/s averaged over an epoch, pytorch-22.06 NGC container), one GPU.
_NVIDIA_DLE = "published: NVIDIA DeepLearningExamples PyTorch Transformer README, transformer-big"

# Training throughputs per (preset, device kind): target tokens per second of one device (a
# model reshaped from its preset by model_overrides is keyed "preset (field value, ...)"). Our
# own measurements (benchmarks/RESULTS.md) where we have them; published ones otherwise, each
# labelled with its source. No GPU of ours has measured yet (issue: a GPU run): `plan` on a GPU
# machine measures, or --tokens-per-s gives a number.
RECORDED_THROUGHPUT: dict[tuple[str, str], Throughput] = {
    ("tiny", "cpu"): Throughput(
        3183,
        "benchmarks/RESULTS.md, the default demo's 1,000 steps (pre-LN tiny, fp32, idle "
        "2-core EPYC VM, 2026-11-22)",
    ),
    # the demo's and the CPU recipe's narrow model (a plan names it so: model_name)
    ("tiny (d_model 128, d_ff 512, d_k 32, d_v 32)", "cpu"): Throughput(
        5473,
        "benchmarks/RESULTS.md, the demo's 1,600 steps of its narrow model (pre-LN, fp32, idle "
        "2-core EPYC VM, 2026-11-25; a 2-core Xeon with AMX ran ~7,800)",
    ),
    ("base", "cpu"): Throughput(
        233,
        "benchmarks/RESULTS.md, bench_training.py --steps 5 (fp32, 2-core EPYC VM, 2026-11-22)",
    ),
    # A100 40GB: AMP (fp16) 82,059 tokens/s at 10,240 tokens per GPU (TF32: 51,057). Our
    # precision there is bf16-mixed, which runs at the same tensor-core rate on Ampere; the
    # 80GB card has the same compute.
    **{
        ("big", kind): Throughput(82059, f"{_NVIDIA_DLE}, DGX A100 40GB, AMP", "bf16-mixed")
        for kind in ("a100", "a100-40", "a100-80")
    },
    # V100: no bf16, so `auto` trains in fp16 with loss scaling there: AMP 32,942 tokens/s (16GB,
    # 5,120 tokens per GPU) and 39,911 (32GB, DGX-2, 10,240); FP32 gives 8,742 / 9,827.
    **{
        ("big", kind): Throughput(32942, f"{_NVIDIA_DLE}, DGX-1 V100 16GB, AMP", "16-mixed")
        for kind in ("v100", "v100-16")
    },
    ("big", "v100-32"): Throughput(39911, f"{_NVIDIA_DLE}, DGX-2 V100 32GB, AMP", "16-mixed"),
}


# --- shapes --------------------------------------------------------------------------------


def width_limit(model_cfg: ModelConfig, train_cfg: TrainConfig) -> int:
    """The widest row the sampler keeps: ``min(max_tokens, max_positions)`` (BOS/EOS included)."""
    return min(train_cfg.max_tokens, train_cfg.max_positions, model_cfg.max_positions)


def precision_bytes(precision: str) -> int:
    """Bytes per activation element of a Lightning precision string."""
    if precision.startswith(("bf16", "16")):
        return 2
    return 8 if precision.startswith("64") else 4


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes of one training step, by part."""

    weights_and_optimizer: int  # fp32 weights + gradients + Adam m, v (+ bf16 weight copies)
    activations: int  # what the encoder/decoder layers save for backward
    loss: int  # [tokens x vocab] logits, log-probabilities and their gradients

    @property
    def total(self) -> int:
        return self.weights_and_optimizer + self.activations + self.loss


def estimate_peak_bytes(
    model_cfg: ModelConfig,
    vocab_size: int,
    batch: int,
    width: int,
    precision: str,
    n_params: int | None = None,
) -> MemoryEstimate:
    """Analytic peak memory of a training step on ``batch`` rows of ``width`` tokens a side.

    Per token (``d`` = d_model, ``a`` = h*d_k, ``v`` = h*d_v, ``f`` = d_ff), what backward
    needs, counted from the layers' code (``model/layers.py``, ``attention.py``):
    an attention sublayer saves its input (``d``), Q, K, V (``2a + v``), the fused SDPA output
    and its head-merged copy (``2v``) and the residual sum LayerNorm reads (``d``); the FFN saves
    its input (``d``), the ReLU output (``f``, twice with the ReLU-dropout flag) and the sum
    (``d``); each sublayer's dropout keeps a 1-byte mask of ``d``. An encoder layer has one
    attention sublayer, a decoder layer two (cross-attention's K, V come from the memory).
    Fused attention kernels keep only a per-row log-sum-exp, not ``[W x W]`` weights.
    """
    cfg = model_cfg
    params = count_parameters_of(cfg, vocab_size) if n_params is None else n_params
    act = precision_bytes(precision)
    mixed = precision.endswith("-mixed")
    # fp32 master weights, gradients, Adam's m and v; autocast caches a bf16/fp16 weight copy.
    static = params * (16 + (2 if mixed else 0))
    if precision.startswith("64"):
        static = params * 32
    tokens = batch * width
    d, a, v, f = cfg.d_model, cfg.h * cfg.d_k, cfg.h * cfg.d_v, cfg.d_ff
    attention = d + (2 * a + v) + 2 * v + d
    ffn = d + f * (2 if cfg.p_drop_relu > 0 else 1) + d
    lse = cfg.h * 4  # fp32 log-sum-exp per head and query of a fused attention kernel
    encoder_layer = tokens * ((attention + ffn) * act + 2 * d + lse)
    decoder_layer = tokens * ((2 * attention + ffn) * act + 3 * d + 2 * lse)
    embeddings = 2 * tokens * d  # dropout masks of the two embedding sums
    final = tokens * d * act  # the decoder output the pre-softmax projection reads
    # Backward also holds the gradients of the layer it is in: one decoder layer's worth more.
    activations = cfg.N * (encoder_layer + decoder_layer) + decoder_layer + embeddings + final
    # The loss runs in fp32 (objective.py): the log-probabilities stay for backward; at the
    # start of backward their gradient (two, from the NLL and the smoothing term) and the
    # logits' gradient join them: four [tokens x vocab] fp32 tensors at the peak.
    loss = 4 * tokens * vocab_size * 4
    return MemoryEstimate(static, activations, loss)


def worst_batch(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    vocab_size: int,
    precision: str,
    params: int | None = None,
) -> tuple[int, int, MemoryEstimate]:
    """``(B, W, estimate)`` of the allowed batch shape with the largest estimated peak."""
    if params is None:
        params = count_parameters_of(model_cfg, vocab_size)
    best: tuple[int, int, MemoryEstimate] | None = None
    for width in range(width_limit(model_cfg, train_cfg), 0, -1):  # longest first: wins ties
        rows = train_cfg.max_tokens // width
        est = estimate_peak_bytes(model_cfg, vocab_size, rows, width, precision, params)
        if best is None or est.total > best[2].total:
            best = (rows, width, est)
    assert best is not None  # width_limit >= 1
    return best


# --- measurement on a CUDA device -----------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    peak_bytes: int
    tgt_tokens_per_s: float  # on worst-case batches: a lower bound for real (shorter) batches


def measure_peak_bytes(
    model_cfg: ModelConfig,
    vocab_size: int,
    batch: int,
    width: int,
    precision: str,
    device: torch.device,
    timed_steps: int = 0,
) -> Measurement:
    """Peak CUDA memory of training steps on a random ``[batch, width]`` batch: two steps
    (the second in the steady state, with Adam's states), then ``timed_steps`` timed ones.
    The memory is freed afterwards; an out-of-memory error is returned as ``peak_bytes = -1``.
    """
    from transformer_nmt.model.transformer import Transformer
    from transformer_nmt.training.objective import build_optimizer, label_smoothed_cross_entropy

    if device.type != "cuda":
        raise ValueError(f"measure_peak_bytes needs a CUDA device, got {device}")
    dtype = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}.get(
        precision.split("-")[0], torch.float32
    )
    mixed = precision.endswith("-mixed") and dtype in (torch.bfloat16, torch.float16)
    generator = torch.Generator(device="cpu").manual_seed(0)
    model = optimizer = None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    try:
        model = Transformer(model_cfg, vocab_size=vocab_size).to(device).train()
        if not mixed:  # "-true" precisions train the model in that dtype (Lightning's)
            model = model.to(dtype)
        optimizer = build_optimizer(model.parameters())
        # ids >= 4 avoid the special ids: no padding, every row full width
        src, tgt_in, tgt_out = (
            torch.randint(4, vocab_size, (batch, width), generator=generator).to(device)
            for _ in range(3)
        )

        def step() -> None:
            with torch.autocast("cuda", dtype=dtype, enabled=mixed):
                logits = model(src, tgt_in)  # [B, W, V]
            loss = label_smoothed_cross_entropy(logits, tgt_out, eps=model_cfg.eps_ls).loss
            del logits
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        for _ in range(2):
            step()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        rate = 0.0
        if timed_steps > 0:
            start = time.perf_counter()
            for _ in range(timed_steps):
                step()
            torch.cuda.synchronize(device)
            rate = batch * width * timed_steps / (time.perf_counter() - start)
        return Measurement(peak, rate)
    except torch.OutOfMemoryError:
        return Measurement(-1, 0.0)
    finally:
        model = optimizer = None  # drop the references before emptying the cache
        gc.collect()
        torch.cuda.empty_cache()


# --- the plan of one experiment ---------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where the plan runs: ``kind`` ("cpu" or a ``GPU_KINDS`` name), devices per node and the
    memory of one device (bytes; None: unknown)."""

    kind: str
    devices: int
    memory_bytes: int | None
    memory_source: str


def gpu_target(kind: str, devices: int) -> Target:
    """A ``GPU_KINDS`` GPU; an unknown kind is a ConfigError listing the known ones."""
    key = kind.lower()
    if key not in GPU_KINDS:
        raise ConfigError(f"--gpu-kind: unknown GPU kind {kind!r}; known: {', '.join(GPU_KINDS)}")
    if devices <= 0:
        raise ConfigError(f"--gpus must be a positive integer, got {devices}")
    spec = GPU_KINDS[key]
    return Target(key, devices, int(spec.memory_gib * GIB), f"{key}: {spec.memory_gib:g} GiB")


def available_ram_bytes() -> int:
    """This machine's available memory (``MemAvailable`` of /proc/meminfo; else free pages)."""
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def total_ram_bytes() -> int:
    """This machine's memory (``MemTotal``): unlike the available RAM, the same in every process
    of a run, so that ``max_tokens: auto`` chooses one size for all of them."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cpu_target(processes: int = 1, ram: int | None = None) -> Target:
    """This machine's CPU: ``processes`` training processes sharing its RAM (``ram`` bytes;
    default: the available RAM now)."""
    what = "available RAM" if ram is None else "RAM"
    ram = (available_ram_bytes() if ram is None else ram) // processes
    share = f" / {processes} processes" if processes > 1 else ""
    return Target("cpu", processes, ram, f"this machine's {what}{share} ({ram / GIB:.1f} GiB)")


# ``max_tokens: auto`` fills this share of a device's usable memory with the *estimated*
# worst-case batch: room for the estimate's error (on a GPU the chosen size is then measured
# by ``check_fits``), and rounds down to a multiple of AUTO_STEP tokens (few distinct sizes).
AUTO_MARGIN = 0.8
AUTO_STEP = 64


def auto_max_tokens(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    vocab_size: int,
    precision: str,
    memory_bytes: int,
    world_size: int,
) -> int:
    """``max_tokens: auto`` on a device of ``memory_bytes``: the largest ``max_tokens`` whose
    estimated worst-case batch fills at most ``AUTO_MARGIN`` of its usable memory, and at most
    the device's share of an update, ``ceil(tokens_per_update / world_size)``: more would
    overshoot the §5.1 update, less is made up by gradient accumulation. 0: not one token fits.
    """
    share = -(-train_cfg.tokens_per_update // world_size)
    budget = int(memory_bytes * USABLE_FRACTION * AUTO_MARGIN)
    cfg = dataclasses.replace(train_cfg, max_tokens=share)
    fitting = largest_fitting_max_tokens(model_cfg, cfg, vocab_size, precision, budget)
    return fitting - fitting % AUTO_STEP if fitting >= AUTO_STEP else fitting


def _canonical(precision: str) -> str:
    """Lightning's short precision names as their long ones ("32" is "32-true")."""
    return {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}.get(precision, precision)


def resolve_plan_precision(train_cfg: TrainConfig, target: Target) -> str:
    """``precision: auto`` on the target, as ``training.config.resolve_precision`` decides on the
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
    if measure_on is not None:
        measured = measure_peak_bytes(
            model_cfg, vocab_size, rows, width, precision, measure_on,
            timed_steps if target.kind == "cuda" else 0,
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


def largest_fitting_max_tokens(
    model_cfg: ModelConfig, train_cfg: TrainConfig, vocab_size: int, precision: str, usable: int
) -> int:
    """The largest ``max_tokens`` whose estimated worst batch fits ``usable`` bytes (0: none)."""
    params = count_parameters_of(model_cfg, vocab_size)
    low, high = 0, train_cfg.max_tokens
    while low < high:  # bisection on a peak that grows with max_tokens
        mid = (low + high + 1) // 2
        cfg = dataclasses.replace(train_cfg, max_tokens=mid)
        if worst_batch(model_cfg, cfg, vocab_size, precision, params)[2].total <= usable:
            low = mid
        else:
            high = mid - 1
    return low


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
    device_index: int = 0,
) -> Plan:
    """The train stage's check before its first step: on a CUDA device (``device_index``: this
    rank's own GPU, ``cluster.local_rank()``), measure the worst batch against the device's
    memory; on a CPU, the estimate against the available RAM (shared by the run's processes on
    this node). Raises a one-line ConfigError naming ``train.max_tokens`` when it does not fit.
    ``max_tokens`` must be a number here: ``size_max_tokens`` sizes "auto" first."""
    processes = resolve_devices(train_cfg)
    cfg = dataclasses.replace(train_cfg, precision=precision, devices=processes)
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


def this_device(
    accelerator: str, device_index: int, processes: int, cpu_ram: int | None = None
) -> tuple[torch.device | None, Target]:
    """This process's device: the CUDA device ``device_index`` when training on a GPU, else the
    CPU with ``cpu_ram`` bytes (None: the available RAM) shared by ``processes``."""
    if accelerator in ("gpu", "cuda") and torch.cuda.is_available():
        device = torch.device("cuda", device_index)
        total = torch.cuda.get_device_properties(device).total_memory
        return device, Target("cuda", processes, total, f"{torch.cuda.get_device_name(device)}")
    return None, cpu_target(processes, cpu_ram)
