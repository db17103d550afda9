"""§5.4's label-smoothed cross-entropy as autograd functions with the gradient written out:
the kernels behind ``training.objective``'s entry points.

``SmoothedCrossEntropy`` reads [n, V] logits (eager float32 chunks, or torch.compile'd passes
with ``fused``); ``ProjectedSmoothedCrossEntropy`` computes §3.4's projection and the loss
together by chunks of rows, so the [n, V] logits never exist (the ``projected_loss`` CPU fast
path). Both return the summed loss and NLL of the rows they are given.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

# Rows of logits the loss converts to float32 at a time, into one reused buffer. On a CPU
# 4.5 MB at a 37k vocabulary, 1 MB at 8k: cache-sized pieces (loss forward and backward of
# [4,096 x 37,000] bf16 logits, 2 threads, AMX Xeon: 247 ms at 32 rows, 260 at 256; of
# [2,048 x 8,000]: 18 ms at 32, 23-32 at 256); on a GPU larger chunks (fewer kernel launches,
# ~600 MB of buffer).
CPU_LOSS_ROWS = 32
GPU_LOSS_ROWS = 4096


def _loss_rows(device: torch.device) -> int:
    return CPU_LOSS_ROWS if device.type == "cpu" else GPU_LOSS_ROWS


class SmoothedCrossEntropy(torch.autograd.Function):
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
    in the logits' dtype: the backward pass of ``SmoothedCrossEntropy`` for torch.compile."""
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
# 1,000 / 64 shapes a pass this way; benchmarks/log/2026-11-29.md).
BF16_PROJECTED_ROWS = 64


class ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """§3.4's pre-softmax projection x = h W^T and ``SmoothedCrossEntropy``'s summed §5.4 loss
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


def projection_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype of the projection's products where ``F.linear`` would run now: autocast's for
    float32 weights while it is on (it leaves float64 alone), else the weights'."""
    device = weight.device.type
    if torch.is_autocast_enabled(device) and weight.dtype == torch.float32:
        return torch.get_autocast_dtype(device)
    return weight.dtype


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
    operation, 0.3 s with this buffer; benchmarks/log/2026-11-25.md)."""
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
