"""The memory of a training step: the worst-case batch a config allows, its analytic peak
(``estimate_peak_bytes``), its measured peak on a CUDA device (``measure_peak_bytes``), and the
largest ``max_tokens`` that fits a device (``max_tokens: auto``). The model of the estimate is
``training/preflight.py``'s docstring.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass

import torch

from transformer_nmt.model.config import ModelConfig
from transformer_nmt.model.transformer import count_parameters_of
from transformer_nmt.training.config import TrainConfig
from transformer_nmt.training.hardware import USABLE_FRACTION
from transformer_nmt.training.loss_kernels import GPU_LOSS_ROWS

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
    loss: int  # the [tokens x vocab] logits, their gradient and the loss's chunk buffer

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
    # The loss (loss_kernels.SmoothedCrossEntropy) keeps only the logits for backward, in the
    # projection's dtype, and writes their gradient once: two [tokens x vocab] tensors at the
    # peak, plus one float32 buffer of GPU_LOSS_ROWS rows that its chunks reuse (the larger of
    # the devices' row counts). Counting four fp32 copies (autograd through log_softmax) put
    # the estimate at 1.95x / 1.59x the peak measured on an H200 for base / big at 24,948
    # tokens; this count is within 2% / 5% of it (benchmarks/log/2026-11-26.md).
    loss = 2 * tokens * vocab_size * act + min(GPU_LOSS_ROWS, tokens) * vocab_size * 4
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
    fused_loss: bool = False,
) -> Measurement:
    """Peak CUDA memory of training steps on a random ``[batch, width]`` batch: two steps
    (the second in the steady state, with Adam's states), then ``timed_steps`` timed ones;
    ``fused_loss`` as the run's ``train.fused_loss`` resolves on that device.
    The memory is freed afterwards; an out-of-memory error is returned as ``peak_bytes = -1``.
    """
    from transformer_nmt.model.transformer import Transformer
    from transformer_nmt.training.objective import label_smoothed_cross_entropy
    from transformer_nmt.training.optimizer import build_optimizer

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
            loss = label_smoothed_cross_entropy(
                logits, tgt_out, eps=model_cfg.eps_ls, pad_id=0, fused=fused_loss
            ).loss
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
