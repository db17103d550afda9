"""The Transformer of §3 (``Transformer``) and its configuration (``ModelConfig``, presets)."""

from transformer_nmt.model.config import (
    PRESETS,
    TABLE3,
    ModelConfig,
    apply_overrides,
    get_preset,
    table3_config,
)
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
