"""The Transformer of §3 (``Transformer``) and its configuration (``ModelConfig``, presets).

The configuration is torch-free; the model's classes load on first use
(``transformer_nmt._lazy``), so that reading ``TABLE3`` or a preset (``report``'s figures)
does not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformer_nmt._lazy import lazy_attributes
from transformer_nmt.model.config import (
    PRESETS,
    TABLE3,
    ModelConfig,
    apply_overrides,
    get_preset,
    table3_config,
)

if TYPE_CHECKING:
    from transformer_nmt.model.transformer import (
        DecoderState,
        EncoderOutput,
        Transformer,
        count_parameters,
    )

__all__ = [
    "PRESETS",
    "TABLE3",
    "DecoderState",
    "EncoderOutput",
    "ModelConfig",
    "Transformer",
    "apply_overrides",
    "count_parameters",
    "get_preset",
    "table3_config",
]

__getattr__ = lazy_attributes(
    __name__,
    {
        name: "transformer"
        for name in ("DecoderState", "EncoderOutput", "Transformer", "count_parameters")
    },
)
