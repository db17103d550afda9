"""§5.4 residual dropout: ``nn.Dropout`` with a faster way to draw its mask on a CPU.

On a CPU, ``torch.nn.functional.dropout`` draws its mask with ``bernoulli_``, one float per
element, about 5 ns each on a 2-core Xeon: 14 % of a ``base`` bf16 training step
(benchmarks/log/2026-11-25.md). Here each 64-bit draw of ``random_`` over the whole int64 range (64
uniform bits, ~3 ns) is read as four 16-bit integers, and an element is kept when its integer is
at or above ``p * 2^16`` (counted from the lowest int16): the same Bernoulli mask at a quarter
of the draws, with p rounded to a multiple of 2^-16 (0.1 -> 0.1000061). Kept elements are
scaled by 1 / (1 - p) of that rounded p, so the expectation of each output is its input exactly,
as in ``nn.Dropout``; the mask is kept for the backward pass as 0/1 bytes (uint8), not in x's dtype.
On other devices, in eval mode, in place, where p rounds to 0 or 1 (p < 2^-17 or
p > 1 - 2^-17, where that scale would be 1 or undefined), and with the fast path off
(``fast_paths``: ``dropout_mask``), it is ``nn.Dropout``; under torch.compile too, whose
compiler draws and fuses the mask itself (``random_`` in place would split its graph).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer_nmt import fast_paths

# each element's draw: a uniform int16, one of 2^16 levels from -2^15 up
_LEVELS = 2**16
_LOWEST = -(2**15)
_LANES = 4  # int16 lanes per int64 draw


def rounded_p(p: float) -> float:
    """The drop probability the mask realises: ``p`` rounded to a multiple of 2^-16."""
    return round(p * _LEVELS) / _LEVELS


def bernoulli_keep_mask(shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """A boolean mask of ``shape``, each element True (kept) with probability 1 - ``rounded_p(p)``,
    drawn from the default generator of ``device`` (so ``torch.manual_seed`` reproduces it)."""
    n = shape.numel()
    # [ceil(n / 4)] int64 of 64 random bits each (random_'s default range has 63) ...
    draws = torch.empty(-(-n // _LANES), dtype=torch.int64, device=device)
    draws.random_(-(2**63), None)
    # ... read as [4 * ceil(n / 4)] uniform int16, of which the first n make the mask
    return kept_levels(draws.view(torch.int16)[:n].view(shape), p)


def kept_levels(levels: torch.Tensor, p: float) -> torch.Tensor:
    """Which int16 ``levels`` keep their element: the highest 2^16 * (1 - ``rounded_p(p)``)
    of the 2^16 levels, so that a uniform level is kept with probability 1 - rounded_p(p)."""
    return levels >= _LOWEST + round(p * _LEVELS)


class _KeepAndScale(torch.autograd.Function):
    """``x * keep * scale`` for a 0/1 ``keep`` of dtype uint8, which is all the backward pass
    keeps (1 byte per element, not one of x's dtype): grad * keep * scale. uint8, not bool:
    torch multiplies a float tensor by a uint8 one in one vectorised pass, and converts bool
    ~3.5x slower (2-core EPYC, one thread, a [64, 30, 256] fp32 tensor: 92 against 312 us)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return (x * keep).mul_(scale)  # the scale applied once, to the kept elements' product

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None, None


class Dropout(nn.Dropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = rounded_p(self.p)
        if (
            not self.training
            or torch.compiler.is_compiling()  # first: the compiler then traces none of the rest
            or p in (0.0, 1.0)
            or x.device.type != "cpu"
            or self.inplace
            or not fast_paths.enabled("dropout_mask")
        ):
            return F.dropout(x, self.p, self.training, self.inplace)
        keep = bernoulli_keep_mask(x.shape, self.p, x.device).view(torch.uint8)  # [*x.shape] 0/1
        return _KeepAndScale.apply(x, keep, 1 / (1 - p))
