"""§5.4 residual dropout: ``nn.Dropout`` with a faster way to draw its mask on a CPU.

On a CPU, ``torch.nn.functional.dropout`` draws its mask with ``bernoulli_``, about 5 ns per
element on a 2-core Xeon: 14 % of a ``base`` bf16 training step (benchmarks/RESULTS.md).
Drawing 31-bit random integers with ``random_`` and keeping those at or above ``p * 2^31`` is
the same Bernoulli(1 - p) mask at half the cost (``bernoulli_`` compares a float32 uniform
with 24 random bits; this compares 31). Kept elements are scaled by 1 / (1 - p) as in
``nn.Dropout``. On other devices, in eval mode, at p = 0 or 1 and in place, it is ``nn.Dropout``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# ``random_`` on an int32 tensor draws uniformly from [0, 2^31 - 1]
_RANDOM_LEVELS = 2**31


def bernoulli_keep_mask(shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """A boolean mask of ``shape``, each element True (kept) with probability 1 - ``p``, drawn
    from the default generator of ``device`` (so ``torch.manual_seed`` reproduces it)."""
    draws = torch.empty(shape, dtype=torch.int32, device=device).random_()
    return draws >= round(p * _RANDOM_LEVELS)


class Dropout(nn.Dropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p in (0.0, 1.0) or x.device.type != "cpu" or self.inplace:
            return F.dropout(x, self.p, self.training, self.inplace)
        # the kept elements' scale folded into the mask: [*x.shape] in x's dtype, 0 or 1/(1-p);
        # autograd saves it (not x) for the backward pass, grad * mask
        mask = bernoulli_keep_mask(x.shape, self.p, x.device).to(x.dtype).mul_(1 / (1 - self.p))
        return x * mask
