"""§5.3 optimiser and learning-rate schedule, §5.4 label-smoothed cross-entropy.

No Lightning here: plain functions the LightningModule calls.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.checkpoint import checkpoint

from transformer_nmt import fast_paths


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


# Rows of logits the loss converts to float32 at a time, into one reused buffer. On a CPU
# 4.5 MB at a 37k vocabulary, 1 MB at 8k: cache-sized pieces (loss forward and backward of
# [4,096 x 37,000] bf16 logits, 2 threads, AMX Xeon: 247 ms at 32 rows, 260 at 256; of
# [2,048 x 8,000]: 18 ms at 32, 23-32 at 256); on a GPU larger chunks (fewer kernel launches,
# ~600 MB of buffer).
CPU_LOSS_ROWS = 32
GPU_LOSS_ROWS = 4096


def _loss_rows(device: torch.device) -> int:
    return CPU_LOSS_ROWS if device.type == "cpu" else GPU_LOSS_ROWS


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Summed §5.4 label-smoothed cross-entropy of logits [n, V] against target [n], with the
    gradient written out instead of differentiated through log_softmax.

    With lse = logsumexp(x) and q = (1 - eps) * one_hot(y) + eps / V:
        -log p_y = lse - x_y,   mean_k(-log p_k) = lse - mean_k(x_k),
        d loss / d x = softmax(x) - q   (per kept row, times the incoming gradient).
    Forward keeps only lse [n]; backward reads the logits once and writes their gradient once,
    where autograd through log_softmax materialises [n, V] float32 log-probabilities and
    fills / scatters / divides several [n, V] tensors (benchmarks/profile_training_step.py).
    Rows are processed ``_loss_rows`` at a time in float32 (at least), or with ``fused`` all at
    once by torch.compile'd kernels that keep no float32 copy (``_row_statistics``,
    ``_row_gradient``).
    """

    @staticmethod
    def forward(ctx, logits, target, keep, eps, fused):  # type: ignore[no-untyped-def]
        statistics = _run_compiled(_row_statistics, logits, target) if fused else None
        if statistics is None:
            statistics = _chunked_row_statistics(logits, target)
        lse, nll_rows, smooth_rows = statistics
        nll = nll_rows.masked_fill(~keep, 0.0).sum()
        smooth = smooth_rows.masked_fill(~keep, 0.0).sum()
        ctx.save_for_backward(logits, target, keep, lse)
        ctx.eps, ctx.fused = eps, fused
        ctx.mark_non_differentiable(nll)
        return (1.0 - eps) * nll + eps * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):  # type: ignore[no-untyped-def]
        logits, target, keep, lse = ctx.saved_tensors
        eps, vocab = ctx.eps, logits.shape[-1]
        # per row: grad_loss * keep, the incoming gradient of the summed loss
        scale = keep.to(lse.dtype) * grad_loss.to(lse.dtype)  # [n]
        if ctx.fused:  # one compiled pass: reads the logits once, writes their gradient once
            fused_grad = _run_compiled(_row_gradient, logits, target, lse, scale, eps)
            if fused_grad is not None:
                return fused_grad, None, None, None, None
        grad = torch.empty_like(logits)
        buffer = _chunk_buffer(logits, lse.dtype)
        for rows, g in _chunks(logits, buffer):
            g.sub_(lse[rows, None]).exp_()  # softmax [r, V]
            g.sub_(eps / vocab)
            g.scatter_add_(1, target[rows, None], g.new_full((g.shape[0], 1), eps - 1.0))
            g.mul_(scale[rows, None])
            grad[rows] = g
        return grad, None, None, None, None


def _chunked_row_statistics(
    logits: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lse, -log p_y and mean_k(-log p_k) per row of ``logits`` [n, V], each [n], in eager
    torch: ``_loss_rows`` rows at a time through one reused float32 buffer."""
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    n = logits.shape[0]
    lse = torch.empty(n, dtype=compute, device=logits.device)
    nll_rows = torch.empty(n, dtype=compute, device=logits.device)
    smooth_rows = torch.empty(n, dtype=compute, device=logits.device)
    buffer = _chunk_buffer(logits, compute)
    for rows, x in _chunks(logits, buffer):  # x: a float32 copy of the rows [r, V]
        nll_rows[rows] = -x.gather(1, target[rows, None])[:, 0]  # -x_y
        smooth_rows[rows] = -x.mean(dim=-1)  # -mean_k(x_k)
        top = x.amax(dim=-1, keepdim=True)  # [r, 1]
        x.sub_(top).exp_()  # exp(x - max), in place: no [r, V] temporaries
        lse[rows] = top[:, 0] + x.sum(dim=-1).log()
    return lse, nll_rows + lse, smooth_rows + lse


def _row_statistics(
    logits: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_chunked_row_statistics`` written for torch.compile: all rows at once, the float32
    view and exp(x - max) fused into the row reductions instead of materialised."""
    x = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)  # [n, V]
    top = x.amax(dim=-1, keepdim=True)  # [n, 1]
    lse = top[:, 0] + (x - top).exp().sum(dim=-1).log()  # [n]
    return lse, lse - x.gather(1, target[:, None])[:, 0], lse - x.mean(dim=-1)


def _row_gradient(
    logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, scale: torch.Tensor, eps: float
) -> torch.Tensor:
    """d loss / d logits = (softmax(x) - q) * scale per row, q = (1 - eps) * one_hot(y) + eps / V,
    in the logits' dtype: the backward pass of ``_SmoothedCrossEntropy`` for torch.compile."""
    vocab = logits.shape[-1]
    x = logits.to(lse.dtype)  # [n, V]
    is_target = torch.arange(vocab, device=logits.device) == target[:, None]  # [n, V]
    grad = (x - lse[:, None]).exp() - eps / vocab - (1.0 - eps) * is_target.to(x.dtype)
    return (grad * scale[:, None]).to(logits.dtype)


# Logits per chunk of the projected loss (rows = this // V): [rows, d_model] x [d_model, V] GEMMs
# near the GEMM library's best, and a float32 buffer under glibc's 32 MiB mmap threshold, so that
# it is reused memory rather than pages faulted in anew each step (1,000 rows at V = 8,000). The
# demo's fp32 step on a 2-core EPYC with AVX2, 2 rounds, target tokens/s: 64 rows 4,152-4,409;
# 256 rows 4,900-5,292; 1,024 rows 5,334-5,622; 4,096 rows (one chunk) 4,907-5,553.
PROJECTED_LOSS_ELEMENTS = 8_000_000
# Under bf16 autocast the projected loss pads its rows with zeros to a multiple of this, and its
# chunks are multiples of it: oneDNN keeps each bf16 product shape it has seen, a few MB each,
# and a step's real-token count is new nearly every step (the recipe's train stage, 120 bf16
# updates: peak RSS 2,987 MB with exact shapes against 1,524 on the logits path; at most
# 1,000 / 64 shapes a pass this way; benchmarks/RESULTS.md).
BF16_PROJECTED_ROWS = 64


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """§3.4's pre-softmax projection x = h W^T and ``_SmoothedCrossEntropy``'s summed §5.4 loss
    in one pass over chunks of rows, with the gradient computed in that pass:

        d loss / d h = (softmax(x) - q) W,    d loss / d W = (softmax(x) - q)^T h,

    kept and multiplied in backward by the incoming gradient (a scalar: the loss is a sum). The
    [n, V] logits never exist: each chunk's logits are written into one reused buffer, turned
    into softmax(x) - q in place and multiplied out, where the logits path allocates [n, V]
    logits and their gradient per step (on a CPU, memory the kernel first faults in page by page)
    and copies them chunk by chunk through the loss. ``hidden`` [n, d_model] (real tokens only),
    ``weight`` [V, d_model], ``target`` [n]; ``want_grad`` False (no autograd) skips the gradient.

    ``gemm_dtype``: the products' dtype, bf16 where the step runs under bf16 autocast, which
    gives the logits path bf16 logits and a bf16 logits gradient. Then each chunk's logits are
    computed in bf16 and read into a float32 buffer, softmax(x) - q is rounded to bf16 for the
    two gradient products, and d loss / d W adds each chunk's product in float32 (autocast: one
    product, rounded to bf16 once). The softmax and the sums stay float32 as on that path.
    """

    @staticmethod
    def forward(ctx, hidden, weight, target, eps, want_grad, gemm_dtype):  # type: ignore[no-untyped-def]
        n, vocab = hidden.shape[0], weight.shape[0]
        compute = torch.promote_types(weight.dtype, torch.float32)  # the softmax's dtype
        multiple = 1 if gemm_dtype == compute else BF16_PROJECTED_ROWS
        padded = -(-n // multiple) * multiple  # rows, the real n first
        chunk = max(multiple, min(PROJECTED_LOSS_ELEMENTS // vocab, padded) // multiple * multiple)
        w = weight.to(gemm_dtype)  # [V, d_model]
        h_all, y_all = hidden.to(gemm_dtype), target  # [padded, d_model], [padded]
        if padded > n:  # zero rows: left out of the sums; h = 0 adds nothing to d loss / d W
            h_all = torch.cat([h_all, h_all.new_zeros(padded - n, h_all.shape[1])])
            y_all = torch.cat([target, target.new_zeros(padded - n)])
        buffer = hidden.new_empty(chunk, vocab, dtype=compute)
        # bf16 products write into their own buffer, read into (and back from) the float32 one
        gemm_buffer = (
            buffer if gemm_dtype == compute else buffer.new_empty(buffer.shape, dtype=gemm_dtype)
        )
        nll = buffer.new_zeros(())
        smooth = buffer.new_zeros(())
        grad_hidden = torch.empty_like(h_all) if want_grad else None
        grad_weight = torch.zeros_like(w, dtype=compute) if want_grad else None
        for start in range(0, padded, chunk):
            rows = slice(start, start + chunk)
            h, y = h_all[rows], y_all[rows, None]  # [r, d_model], [r, 1]
            r, real = h.shape[0], min(h.shape[0], n - start)  # real: rows that are tokens
            x_gemm = torch.mm(h, w.t(), out=gemm_buffer[:r])  # logits [r, V]
            x = x_gemm if gemm_dtype == compute else buffer[:r].copy_(x_gemm)
            x_y = x.gather(1, y)[:, 0]
            mean = x.mean(dim=-1)
            top = x.amax(dim=-1, keepdim=True)  # [r, 1]
            x.sub_(top).exp_()  # exp(x - max), in place
            total = x.sum(dim=-1)
            lse = top[:, 0] + total.log()  # [r]
            nll += (lse - x_y)[:real].sum()  # -log p_y
            smooth += (lse - mean)[:real].sum()  # mean_k(-log p_k)
            if want_grad:
                x.div_(total[:, None]).sub_(eps / vocab)  # softmax(x) - eps / V
                x.scatter_add_(1, y, x.new_full((r, 1), eps - 1.0))  # - (1-eps) 1_y
                if gemm_dtype == compute:
                    torch.mm(x, w, out=grad_hidden[rows])  # [r, d_model]
                    grad_weight.addmm_(x.t(), h)  # [V, d_model]
                else:
                    g = x_gemm.copy_(x)  # softmax(x) - q, rounded as autocast rounds it
                    torch.mm(g, w, out=grad_hidden[rows])  # [r, d_model]
                    grad_weight += torch.mm(g.t(), h)  # [V, d_model], summed in float32
        if want_grad:
            grad_hidden = grad_hidden[:n]
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = hidden.dtype, weight.dtype
        ctx.mark_non_differentiable(nll)
        return (1.0 - eps) * nll + eps * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):  # type: ignore[no-untyped-def]
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        return (
            (grad_hidden * grad_loss).to(hidden_dtype),
            (grad_weight * grad_loss).to(weight_dtype),
            None,
            None,
            None,
            None,
        )


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
    loss, nll = _ProjectedSmoothedCrossEntropy.apply(
        hidden, weight, target[keep], eps, want_grad, _projection_dtype(weight)
    )
    return LossOutput(loss=loss, nll=nll, ntokens=keep.sum())


def _projection_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype of the projection's products where ``F.linear`` would run now: autocast's for
    float32 weights while it is on (it leaves float64 alone), else the weights'."""
    device = weight.device.type
    if torch.is_autocast_enabled(device) and weight.dtype == torch.float32:
        return torch.get_autocast_dtype(device)
    return weight.dtype


def loss_path(
    device: torch.device,
    *,
    fused: bool,
    compiled: bool,
    autocast: bool | torch.dtype | None = None,
    dtype: torch.dtype = torch.float32,
) -> str:
    """How ``model_loss`` computes the loss: ``fused`` (``train.fused_loss``: compiled passes
    over the logits), ``projected`` (the ``projected_loss`` CPU fast path: on a CPU, with
    float32 or float64 weights (``dtype``), not compiled, with no autocast or bf16 autocast
    (whose bf16 products it computes too; fp16 autocast is not measured on a CPU); bf16-true
    weights would make its softmax bf16) or ``logits`` (eager passes over the [B, T, V]
    logits, the softmax in float32 at least). ``autocast``: the dtype of the autocast the step
    runs under, or False for none (default: the autocast on now)."""
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
) -> LossOutput:
    """§5.4's summed loss of ``model`` (a ``Transformer``) on ``batch`` (src, tgt_in, tgt_out),
    by ``loss_path``: ``forward`` is the model's torch.compile wrapper when training compiles
    it (the logits path), ``fused`` is ``train.fused_loss``."""
    src, tgt_in, tgt_out = batch["src"], batch["tgt_in"], batch["tgt_out"]
    weight = model.projection_weight
    compiled = forward is not None
    if loss_path(src.device, fused=fused, compiled=compiled, dtype=weight.dtype) == "projected":
        hidden, _ = model.decode(tgt_in, model.encode(src), project_output=False)
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


@functools.cache
def _compiled(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` under torch.compile, built once per process; dynamic shapes, so that every
    batch's row count reuses one compiled kernel."""
    return torch.compile(function, dynamic=True)


_COMPILE_FAILED: list[str] = []  # the first torch.compile error of this process, if any


def _run_compiled(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` torch.compile'd, or None (the caller runs the eager loss) when
    compiling failed in this process (e.g. no C compiler for Triton's launcher on a node):
    one warning, and the eager loss from then on; the same numbers either way."""
    if _COMPILE_FAILED:
        return None
    try:
        return _compiled(function)(*args)
    except Exception as error:  # noqa: BLE001 - any compiler failure: the eager loss serves
        # inductor's message: "backend='inductor' raised:" then the cause on the next line
        cause = " ".join([line.strip() for line in str(error).splitlines() if line.strip()][:2])
        _COMPILE_FAILED.append(f"{type(error).__name__}: {cause[:300]}")
        warnings.warn(
            f"train.fused_loss: torch.compile of the loss failed ({_COMPILE_FAILED[0]}); "
            "the eager loss is used from now on (same numbers, slower); set "
            "train.fused_loss: false to skip the attempt",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def _chunk_buffer(logits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One [rows, V] buffer that every chunk of a loss pass reuses: on a CPU a new tensor of
    that size per chunk and per operation is memory the kernel first faults in page by page
    (the base model's loss, V = 37,000: 1.0 s per step with a 36 MB temporary per chunk and
    operation, 0.3 s with this buffer; benchmarks/RESULTS.md)."""
    rows = min(_loss_rows(logits.device), logits.shape[0])
    return logits.new_empty(rows, logits.shape[-1], dtype=dtype)


def _chunks(logits: torch.Tensor, buffer: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
    """(rows, a copy of ``logits[rows]`` in ``buffer``'s dtype) for consecutive chunks of
    ``buffer``'s row count; the copy is the buffer's first rows, overwritten by the next."""
    chunk = buffer.shape[0]
    for start in range(0, logits.shape[0], chunk):
        rows = slice(start, start + chunk)
        x = buffer[: logits[rows].shape[0]]
        x.copy_(logits[rows])
        yield rows, x


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
    and write [B*T, V] float32 about a dozen times per step (benchmarks/RESULTS.md).
    """
    logits = logits.reshape(-1, logits.shape[-1])  # [B*T, V]
    target = target.reshape(-1)  # [B*T]
    keep = target != pad_id  # [B*T]
    loss, nll = _SmoothedCrossEntropy.apply(logits, target.clamp(min=0), keep, eps, fused)
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
    return _SmoothedCrossEntropy.apply(logits, target, keep, eps, False)


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


def paper_lr(step: int, d_model: int, warmup: int = 4000, scale: float = 1.0) -> float:
    """§5.3 eq. (3): lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    ``step`` counts optimiser updates from 1; step <= 0 gives 0.0 (no division by zero).
    ``scale`` (flag, default 1 = the paper) multiplies the whole schedule.
    """
    if step <= 0:
        return 0.0
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def cooldown_factor(step: int, max_steps: int | None, cooldown_steps: int | None) -> float:
    """Flag (paper: none): the last ``cooldown_steps`` updates before ``max_steps`` scale the
    §5.3 learning rate down linearly, update k by (max_steps - k + 1) / cooldown_steps, so the
    last update takes 1/cooldown_steps of it. Annealing the rate at the end of a short run
    gives the low-noise weights that checkpoint averaging (§6.1) otherwise approximates.
    ``cooldown_steps`` None (the paper) = 1.0 everywhere."""
    if cooldown_steps is None or max_steps is None:
        return 1.0
    return min(1.0, max(0.0, (max_steps - step + 1) / cooldown_steps))


def build_optimizer(
    parameters: Iterable[torch.nn.Parameter] | Iterable[dict],
    *,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    fused: bool | None = None,
) -> torch.optim.Adam:
    """§5.3 Adam with beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9.

    The base learning rate is 1.0: ``build_scheduler`` multiplies it by ``paper_lr``.
    ``fused`` is passed to ``torch.optim.Adam`` (speed only; None = PyTorch's default, the
    multi-tensor "foreach" path): ``FUSED_ADAM_DEVICES`` lists where the trainer fuses it.
    """
    return torch.optim.Adam(parameters, lr=1.0, betas=tuple(betas), eps=eps, fused=fused)


# Devices whose parameters get torch's fused Adam kernel (one kernel over all parameters). On
# CPU it is ~4x faster than the default foreach path for the tiny model's 7.6M parameters
# (benchmarks/RESULTS.md), the same update to rounding (tests/test_objective.py).
FUSED_ADAM_DEVICES = ("cuda", "cpu")


class PaperSchedule:
    """The LambdaLR factor for scheduler epoch e (= updates done so far): ``paper_lr(e + 1)``,
    times ``cooldown_factor(e + 1, max_steps, cooldown_steps)``.

    A callable object rather than a lambda so that LambdaLR saves its settings in checkpoints.
    ``max_steps`` may change on a resume: ``follow_max_steps`` sets it after the state loads.
    """

    def __init__(
        self,
        d_model: int,
        warmup: int = 4000,
        scale: float = 1.0,
        cooldown_steps: int | None = None,
        max_steps: int | None = None,
    ) -> None:
        self.d_model, self.warmup, self.scale = d_model, warmup, scale
        self.cooldown_steps, self.max_steps = cooldown_steps, max_steps

    def __call__(self, epoch: int) -> float:
        # A checkpoint from before the cooldown existed loads fine: LambdaLR updates this
        # freshly built object's attributes with the saved ones, and these two keep their values.
        factor = cooldown_factor(epoch + 1, self.max_steps, self.cooldown_steps)
        return paper_lr(epoch + 1, self.d_model, self.warmup, self.scale) * factor


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    d_model: int,
    warmup: int = 4000,
    scale: float = 1.0,
    cooldown_steps: int | None = None,
    max_steps: int | None = None,
) -> LambdaLR:
    """A ``LambdaLR`` stepped once per optimiser update: update k (k = 1, 2, ...) uses
    ``paper_lr(k, d_model, warmup, scale) * cooldown_factor(k, max_steps, cooldown_steps)``.
    Needs an optimiser whose base lr is 1.0 (``build_optimizer``)."""
    for group in optimizer.param_groups:
        base = group.get("initial_lr", group["lr"])
        if base != 1.0:
            raise ValueError(
                f"build_scheduler needs optimizer lr 1.0 (the schedule is absolute), got {base}"
            )
    if warmup <= 0:
        raise ValueError(f"warmup must be a positive number of steps, got {warmup}")
    if cooldown_steps is not None and max_steps is None:
        raise ValueError("a learning-rate cooldown needs max_steps (where it ends)")
    return LambdaLR(optimizer, PaperSchedule(d_model, warmup, scale, cooldown_steps, max_steps))


def follow_max_steps(scheduler: LambdaLR, max_steps: int) -> None:
    """After a resume with another ``max_steps``: the cooldown ends there, and the coming
    update's learning rate (restored with the optimizer state) is recomputed for it."""
    groups = scheduler.optimizer.param_groups
    for schedule, group in zip(scheduler.lr_lambdas, groups, strict=True):
        if isinstance(schedule, PaperSchedule) and schedule.max_steps != max_steps:
            schedule.max_steps = max_steps
            group["lr"] = group.get("initial_lr", 1.0) * schedule(scheduler.last_epoch)
