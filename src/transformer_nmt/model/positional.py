"""§3.5 Positional encoding: fixed sinusoids, or learned embeddings (Table 3 row E)."""

from __future__ import annotations

import torch
from torch import nn


def sinusoidal_encoding(length: int, d_model: int, *, dtype=torch.float32, device=None):
    """The §3.5 table ``PE[pos, i]`` of shape ``[length, d_model]``.

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))
    Computed in float64, then cast, so long tables stay exact to the dtype's precision.
    """
    pos = torch.arange(length, dtype=torch.float64, device=device)[:, None]  # [L, 1]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=device)  # [ceil(d/2)]
    angle = pos / torch.pow(10000.0, two_i / d_model)  # [L, ceil(d/2)]
    pe = torch.zeros(length, d_model, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.to(dtype)


class SinusoidalPositions(nn.Module):
    """Adds nothing learnable; returns ``PE[offset : offset + length]`` for any length.

    The table is cached in a non-persistent buffer (not in the state dict) and grown on demand.
    """

    def __init__(self, d_model: int, initial_length: int = 1024) -> None:
        super().__init__()
        self.d_model = d_model
        table = sinusoidal_encoding(initial_length, d_model)  # [initial_length, d_model]
        self.register_buffer("table", table, persistent=False)

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        end = offset + length
        if end > self.table.shape[0]:
            grown = max(end, 2 * self.table.shape[0])
            self.table = sinusoidal_encoding(grown, self.d_model, device=self.table.device).to(
                self.table.dtype
            )
        return self.table[offset:end]  # [length, d_model]


class LearnedPositions(nn.Module):
    """Table 3 row (E): one learned vector per position, up to ``max_positions``."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))
        # Same scale as the token embeddings (N(0, d_model^-0.5)), as fairseq does.
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        end = offset + length
        if end > self.max_positions:
            raise ValueError(
                f"sequence of {end} positions exceeds max_positions={self.max_positions} "
                "of the learned positional embeddings"
            )
        return self.weight[offset:end]  # [length, d_model]
