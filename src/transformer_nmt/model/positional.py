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
    """Nothing learnable: returns ``PE[offset : offset + length]`` for any length.

    The table is cached per device and dtype as a plain attribute, not a buffer, so that it is
    neither saved in checkpoints nor broadcast by DDP at every step; it grows on demand.
    """

    def __init__(self, d_model: int, initial_length: int = 1024) -> None:
        super().__init__()
        self.d_model = d_model
        self.initial_length = initial_length
        self._tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def forward(
        self,
        length: int,
        offset: int = 0,
        *,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        device = torch.device("cpu") if device is None else torch.device(device)
        end = offset + length
        table = self._tables.get((device, dtype))
        if table is None or end > table.shape[0]:
            size = max(end, self.initial_length, 0 if table is None else 2 * table.shape[0])
            # float64 on the CPU (every backend has it), then cast and move once
            table = sinusoidal_encoding(size, self.d_model, dtype=torch.float64).to(device, dtype)
            self._tables[(device, dtype)] = table
        return table[offset:end]  # [length, d_model]


class LearnedPositions(nn.Module):
    """Table 3 row (E): one learned vector per position, up to ``max_positions``."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))
        # Same scale as the token embeddings (N(0, d_model^-0.5)), as fairseq does.
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, length: int, offset: int = 0, **_: object) -> torch.Tensor:
        end = offset + length
        if end > self.max_positions:
            raise ValueError(
                f"sequence of {end} positions exceeds max_positions={self.max_positions} "
                "of the learned positional embeddings"
            )
        return self.weight[offset:end]  # [length, d_model]
