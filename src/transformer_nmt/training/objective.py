"""§5.4 label-smoothed cross-entropy: what a training step minimises (``model_loss``, by
``loss_path``), and the loss of given logits (``label_smoothed_cross_entropy``). The autograd
kernels are ``training.loss_kernels``; §5.3's optimiser and schedule ``training.optimizer``.

No Lightning here: plain functions the LightningModule calls.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from transformer_nmt import fast_paths
from transformer_nmt.training.loss_kernels import (
    ProjectedSmoothedCrossEntropy,
    SmoothedCrossEntropy,
    projection_dtype,
)


@dataclass
class LossOutput:
    """Sums over the non-padding target tokens of a batch.

    ``loss``: label-smoothed cross-entropy (what is optimised); ``nll``: plain negative
    log-likelihood of the references (exp(nll / ntokens) is the perplexity); ``ntokens``: the
    number of non-padding target tokens.
    """

    loss: torch.Tensor
    nll: torch.Tensor
    ntokens: torch.Tensor


def label_smoothed_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    eps: float = 0.1,
    pad_id: int = 0,
    *,
    fused: bool = False,
) -> LossOutput:
    """§5.4 label smoothing of value eps (Szegedy et al. 2016, the paper's reference [36]).

    The target distribution is q = (1 - eps) * one_hot(y) + eps / V (uniform over all V classes),
    the same definition as ``torch.nn.functional.cross_entropy(label_smoothing=eps)``:
        loss = (1 - eps) * nll(y) + eps * mean_k(-log p_k).
    Positions whose target is ``pad_id`` contribute nothing. ``logits`` [B, T, V] (any float
    dtype; the softmax runs in float32 at least), ``target`` [B, T] long.

    ``fused`` (``train.fused_loss``; speed only): each pass over the logits runs as one
    torch.compile'd kernel instead of eager passes over float32 chunks, which on a GPU read
    and write [B*T, V] float32 about a dozen times per step
    (benchmarks/log/2026-11-27.md).
    """
    logits = logits.reshape(-1, logits.shape[-1])  # [B*T, V]
    target = target.reshape(-1)  # [B*T]
    keep = target != pad_id  # [B*T]
    loss, nll = SmoothedCrossEntropy.apply(logits, target.clamp(min=0), keep, eps, fused)
    return LossOutput(loss=loss, nll=nll, ntokens=keep.sum())


def projected_label_smoothed_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    eps: float = 0.1,
    pad_id: int = 0,
) -> LossOutput:
    """``label_smoothed_cross_entropy(hidden @ weight.T, target, eps, pad_id)`` without the
    logits (the ``projected_loss`` CPU fast path, ``loss_path``): ``hidden``
    [B, T, d_model] is the decoder output, ``weight`` [V, d_model] the §3.4 projection's
    (``Transformer.projection_weight``). Padding positions are dropped before the projection.
    Under bf16 autocast the products run in bf16, as the logits path's projection would. The
    same loss and gradients up to floating-point rounding (summation order; under autocast,
    also the bf16 rounding of values that the two paths sum in a different order)."""
    target = target.reshape(-1)  # [B*T]
    keep = target != pad_id
    hidden = hidden.reshape(-1, hidden.shape[-1])[keep]  # [n, d_model], real tokens only
    want_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    loss, nll = ProjectedSmoothedCrossEntropy.apply(
        hidden, weight, target[keep], eps, want_grad, projection_dtype(weight)
    )
    return LossOutput(loss=loss, nll=nll, ntokens=keep.sum())


def _chunk_sums(
    hidden: torch.Tensor,
    target: torch.Tensor,
    project: Callable[[torch.Tensor], torch.Tensor],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed smoothed loss and NLL of ``hidden`` [n, d_model] rows whose targets are
    ``target`` [n] (no padding)."""
    logits = project(hidden)  # [n, V]
    keep = torch.ones_like(target, dtype=torch.bool)
    return SmoothedCrossEntropy.apply(logits, target, keep, eps, False)


def chunked_label_smoothed_cross_entropy(
    hidden: torch.Tensor,
    project: Callable[[torch.Tensor], torch.Tensor],
    target: torch.Tensor,
    *,
    chunk_tokens: int,
    eps: float = 0.1,
    pad_id: int = 0,
) -> LossOutput:
    """``label_smoothed_cross_entropy(project(hidden), target, eps, pad_id)`` computed
    ``chunk_tokens`` target tokens at a time (the ``train.loss_chunk_tokens`` flag): memory only.

    ``hidden`` [B, T, d_model] is the decoder output and ``project`` the §3.4 pre-softmax
    projection (``Transformer.project``). The [tokens x V] logits (at the paper's 25k-token
    batches and 37k vocabulary 3.7 GB per fp32 copy, and autograd keeps several) never exist
    at once: each chunk runs under activation checkpointing, which keeps only its input and
    recomputes its logits during the backward pass (one more projection GEMM per chunk).
    Padding positions are dropped before the projection. The same loss and gradients as the
    unchunked function up to floating-point summation order.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    target = target.reshape(-1)  # [B*T]
    keep = target != pad_id
    hidden = hidden.reshape(-1, hidden.shape[-1])[keep]  # [n, d_model], real tokens only
    target = target[keep]  # [n]
    dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    loss = nll = hidden.new_zeros((), dtype=dtype)
    for start in range(0, target.shape[0], chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        chunk_loss, chunk_nll = checkpoint(
            _chunk_sums, hidden[rows], target[rows], project, eps, use_reentrant=False
        )
        loss = loss + chunk_loss
        nll = nll + chunk_nll
    return LossOutput(loss=loss, nll=nll, ntokens=keep.sum())


def loss_path(
    device: torch.device,
    *,
    fused: bool,
    compiled: bool,
    autocast: bool | torch.dtype | None = None,
    dtype: torch.dtype = torch.float32,
    chunked: bool = False,
) -> str:
    """How ``model_loss`` computes the loss: ``chunked`` (``train.loss_chunk_tokens``: the
    projection and loss a chunk of target tokens at a time), ``fused`` (``train.fused_loss``:
    compiled passes over the logits), ``projected`` (the ``projected_loss`` CPU fast path: on a
    CPU, with float32 or float64 weights (``dtype``), not compiled, with no autocast or bf16
    autocast (whose bf16 products it computes too; fp16 autocast is not measured on a CPU);
    bf16-true weights would make its softmax bf16) or ``logits`` (eager passes over the [B, T, V]
    logits, the softmax in float32 at least). ``autocast``: the dtype of the autocast the step
    runs under, or False for none (default: the autocast on now)."""
    if chunked:
        return "chunked"
    if fused:
        return "fused"
    if autocast is None:
        enabled = torch.is_autocast_enabled(device.type)
        autocast = torch.get_autocast_dtype(device.type) if enabled else False
    if autocast is True:
        raise ValueError("loss_path: pass autocast's dtype (torch.bfloat16), not True")
    full_precision = dtype in (torch.float32, torch.float64)
    supported = autocast is False or autocast == torch.bfloat16
    if device.type == "cpu" and full_precision and supported and not compiled:
        return "projected" if fast_paths.enabled("projected_loss") else "logits"
    return "logits"


def model_loss(
    model: Any,
    batch: dict[str, torch.Tensor],
    *,
    eps: float,
    pad_id: int,
    fused: bool = False,
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    chunk_tokens: int | None = None,
) -> LossOutput:
    """§5.4's summed loss of ``model`` (a ``Transformer``) on ``batch`` (src, tgt_in, tgt_out),
    by ``loss_path``: what a training or validation step calls. ``forward`` is the model's
    torch.compile wrapper when training compiles it (the logits path), ``fused`` is
    ``train.fused_loss``, ``chunk_tokens`` is ``train.loss_chunk_tokens``."""
    src, tgt_in, tgt_out = batch["src"], batch["tgt_in"], batch["tgt_out"]
    weight = model.projection_weight
    path = loss_path(
        src.device, fused=fused, compiled=forward is not None, dtype=weight.dtype,
        chunked=bool(chunk_tokens),
    )  # fmt: skip
    if path in ("projected", "chunked"):
        hidden, _ = model.decode(tgt_in, model.encode(src), project_output=False)
        if path == "chunked":
            return chunked_label_smoothed_cross_entropy(
                hidden, model.project, tgt_out, chunk_tokens=chunk_tokens, eps=eps, pad_id=pad_id
            )
        return projected_label_smoothed_cross_entropy(
            hidden, weight, tgt_out, eps=eps, pad_id=pad_id
        )
    logits = (model if forward is None else forward)(src, tgt_in)  # [B, T, V]
    return label_smoothed_cross_entropy(logits, tgt_out, eps=eps, pad_id=pad_id, fused=fused)


def fused_loss_wanted(setting: bool | str, device: torch.device) -> bool:
    """``train.fused_loss``: true / false, or "auto" = on a CUDA device where Triton (inductor's
    GPU backend) is installed."""
    if setting == "auto":
        return device.type == "cuda" and _triton_installed()
    return bool(setting)


@functools.cache
def _triton_installed() -> bool:  # asked every step: look it up once
    return importlib.util.find_spec("triton") is not None
