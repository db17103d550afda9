"""§5.4 residual dropout: ``nn.Dropout`` with a faster way to draw its mask on a CPU.

On a CPU, ``torch.nn.functional.dropout`` draws its mask with ``bernoulli_``, one float per
element, about 5 ns each on a 2-core Xeon: 14 % of a ``base`` bf16 training step
(benchmarks/RESULTS.md). Here each 64-bit draw of ``random_`` over the whole int64 range (64
uniform bits, ~3 ns) is read as four 16-bit integers, and an element is kept when its integer is
at or above ``p * 2^16`` (counted from the lowest int16): the same Bernoulli mask at a quarter
of the draws, with p rounded to a multiple of 2^-16 (0.1 -> 0.1000061). Kept elements are
scaled by 1 / (1 - p) of that rounded p, so the expectation of each output is its input exactly,
as in ``nn.Dropout``. On other devices, in eval mode, in place, and where p rounds to 0 or 1
(p < 2^-17 or p > 1 - 2^-17, where that scale would be 1 or undefined), it is ``nn.Dropout``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

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


class Dropout(nn.Dropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = rounded_p(self.p)
        if not self.training or p in (0.0, 1.0) or x.device.type != "cpu" or self.inplace:
            return F.dropout(x, self.p, self.training, self.inplace)
        # the kept elements' scale folded into the mask: [*x.shape] in x's dtype, 0 or 1/(1-p);
        # autograd saves it (not x) for the backward pass, grad * mask
        scale = 1 / (1 - p)
        mask = bernoulli_keep_mask(x.shape, self.p, x.device).to(x.dtype).mul_(scale)
        return x * mask
