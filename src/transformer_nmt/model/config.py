"""Model configuration: the paper's hyper-parameters as a typed dataclass, presets and Table 3.

Names follow the paper (Vaswani et al. 2017): ``N`` layers, model width ``d_model``, inner FFN
width ``d_ff``, ``h`` heads of query/key width ``d_k`` and value width ``d_v``, residual dropout
``p_drop`` (§5.4) and label smoothing ``eps_ls`` (§5.4). ``d_k`` and ``d_v`` are independent of
``d_model / h`` (Table 3 rows A and B vary them alone): the projections are
``d_model -> h * d_k`` (queries, keys), ``d_model -> h * d_v`` (values) and ``h * d_v -> d_model``.

Every field that departs from the paper is documented at its definition and defaults to the paper.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from transformer_nmt.errors import ConfigError
from transformer_nmt.removed_keys import removed_key_message, without_removed

POSITIONAL_KINDS = ("sinusoidal", "learned")


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the encoder-decoder Transformer (§3, Table 3)."""

    N: int = 6  # §3.1: identical layers in the encoder and in the decoder
    d_model: int = 512  # §3.1: width of every sublayer output and of the embeddings
    d_ff: int = 2048  # §3.3: inner width of the position-wise feed-forward network
    h: int = 8  # §3.2.2: parallel attention heads
    d_k: int = 64  # §3.2.2: per-head query/key width
    d_v: int = 64  # §3.2.2: per-head value width
    p_drop: float = 0.1  # §5.4: dropout on sublayer outputs and on embedding + position sums
    eps_ls: float = 0.1  # §5.4: label smoothing (used by the loss, stored with the model)
    # Flag (not in the paper, which uses none): dropout on the attention weights.
    p_drop_attn: float = 0.0
    # Flag (not in the paper, which uses none): dropout after the FFN's ReLU.
    p_drop_relu: float = 0.0
    # Flag (not in the paper, whose W^Q, W^K, W^V, W^O are bias-free matrices, §3.2.2, as in
    # tensor2tensor): True adds a bias to each of the four attention projections.
    attention_bias: bool = False
    # §3.5 sinusoids; "learned" = Table 3 row (E), learned positional embeddings.
    positional: str = "sinusoidal"
    # Longest sequence of learned positions (row E). Sinusoids work for any length.
    max_positions: int = 1024
    # Flag: False = the paper's post-LN, LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4);
    # True = pre-LN, x + Dropout(Sublayer(LayerNorm(x))) with a final LayerNorm after the encoder
    # and the decoder stacks (more stable for deep models, not what the paper trained).
    norm_first: bool = False
    # §3.4: True = one matrix for source and target embeddings and the pre-softmax projection.
    # False (flag, for separate vocabularies) = three separate matrices.
    tie_embeddings: bool = True
    # LayerNorm epsilon (the paper does not say; 1e-6 as in tensor2tensor).
    ln_eps: float = 1e-6

    def __post_init__(self) -> None:
        validate(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build a config from ``to_dict()`` output (a run's record: a removed key at the paper's
        value is left out, ``removed_keys.without_removed``); unknown keys are a ConfigError."""
        if not isinstance(data, dict):
            raise ConfigError(f"model config must be a mapping, got {type(data).__name__}")
        data = without_removed("model", data)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            message = f"unknown model config key(s) {unknown}; known keys: {sorted(names)}"
            raise ConfigError(removed_key_message("model", unknown) or message)
        values = {key: _coerce(key, value) for key, value in data.items()}
        return cls(**values)


# the fields that are probabilities, each in [0, 1)
PROBABILITY_KEYS = (
    "p_drop",
    "eps_ls",
    "p_drop_attn",
    "p_drop_relu",
)


def validate(cfg: ModelConfig) -> None:
    """Raise ConfigError naming the key when a value is out of range."""
    for key in ("N", "d_model", "d_ff", "h", "d_k", "d_v", "max_positions"):
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"model config key {key!r} must be a positive integer, got {value!r}")
    for key in PROBABILITY_KEYS:
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
            raise ConfigError(f"model config key {key!r} must be a number in [0, 1), got {value!r}")
    if isinstance(cfg.ln_eps, bool) or not isinstance(cfg.ln_eps, int | float) or cfg.ln_eps <= 0:
        raise ConfigError(f"model config key 'ln_eps' must be positive, got {cfg.ln_eps!r}")
    if cfg.positional not in POSITIONAL_KINDS:
        raise ConfigError(
            f"model config key 'positional' must be one of {list(POSITIONAL_KINDS)}, "
            f"got {cfg.positional!r}"
        )
    for key in ("norm_first", "tie_embeddings", "attention_bias"):
        if not isinstance(getattr(cfg, key), bool):
            raise ConfigError(f"model config key {key!r} must be true or false")


# --- presets -----------------------------------------------------------------------------------

PRESETS: dict[str, ModelConfig] = {
    # Table 3 "base": 65M parameters with a 37k shared vocabulary.
    "base": ModelConfig(),
    # Table 3 "big": 213M parameters; P_drop 0.3 (EN-DE; §6.1 uses 0.1 for EN-FR).
    "big": ModelConfig(d_model=1024, d_ff=4096, h=16, d_k=64, d_v=64, p_drop=0.3),
    # Not in the paper: a small model that trains a usable Multi30k system on a 2-core CPU in
    # minutes (N=3, d_model=256, h=4 of d_k=d_v=64).
    "tiny": ModelConfig(N=3, d_model=256, d_ff=1024, h=4, d_k=64, d_v=64, p_drop=0.1),
}


def get_preset(name: str) -> ModelConfig:
    """The named preset (``tiny``, ``base``, ``big``); ConfigError for an unknown name."""
    try:
        return PRESETS[name]
    except KeyError:
        known = sorted(PRESETS)
        raise ConfigError(f"unknown model preset {name!r}; choose one of {known}") from None


# --- Table 3: variations of the base model ----------------------------------------------------


@dataclass(frozen=True)
class Table3Row:
    """One row of Table 3: overrides of ``base`` and what the paper reports for it.

    The paper's numbers are on the EN-DE development set newstest2013 (beam search as §6.1, no
    checkpoint averaging, §6.2); perplexity is per word-piece. ``paper_params_m`` is in millions
    (the table leaves it blank where it equals base's 65). ``paper_train_steps``: every row trains
    100k steps except big (300k).
    """

    name: str
    overrides: tuple[str, ...]
    paper_params_m: float
    paper_dev_ppl: float
    paper_dev_bleu: float
    paper_train_steps: int = 100_000

    def overrides_dict(self) -> dict[str, Any]:
        """The overrides as typed ``{key: value}`` (what an experiment's model_overrides holds)."""
        items = (item.split("=", 1) for item in self.overrides)
        return {key: _coerce(key, value) for key, value in items}


TABLE3: dict[str, Table3Row] = {
    row.name: row
    for row in (
        # Table3Row(name, overrides of base, params x 10^6, dev PPL, dev BLEU[, train steps])
        Table3Row("base", (), 65, 4.92, 25.8),
        # (A) number of heads with constant computation: h * d_k = d_model.
        Table3Row("A1", ("h=1", "d_k=512", "d_v=512"), 65, 5.29, 24.9),
        Table3Row("A2", ("h=4", "d_k=128", "d_v=128"), 65, 5.00, 25.5),
        Table3Row("A3", ("h=16", "d_k=32", "d_v=32"), 65, 4.91, 25.8),
        Table3Row("A4", ("h=32", "d_k=16", "d_v=16"), 65, 5.01, 25.4),
        # (B) smaller attention key size d_k (d_v stays 64).
        Table3Row("B1", ("d_k=16",), 58, 5.16, 25.1),
        Table3Row("B2", ("d_k=32",), 60, 5.01, 25.4),
        # (C) model size.
        Table3Row("C1", ("N=2",), 36, 6.11, 23.7),
        Table3Row("C2", ("N=4",), 50, 5.19, 25.3),
        Table3Row("C3", ("N=8",), 80, 4.88, 25.5),
        Table3Row("C4", ("d_model=256", "d_k=32", "d_v=32"), 28, 5.75, 24.5),
        Table3Row("C5", ("d_model=1024", "d_k=128", "d_v=128"), 168, 4.66, 26.0),
        Table3Row("C6", ("d_ff=1024",), 53, 5.12, 25.4),
        Table3Row("C7", ("d_ff=4096",), 90, 4.75, 26.2),
        # (D) dropout and label smoothing.
        Table3Row("D1", ("p_drop=0.0",), 65, 5.77, 24.6),
        Table3Row("D2", ("p_drop=0.2",), 65, 4.95, 25.5),
        Table3Row("D3", ("eps_ls=0.0",), 65, 4.67, 25.3),
        Table3Row("D4", ("eps_ls=0.2",), 65, 5.47, 25.7),
        # (E) learned positional embeddings instead of sinusoids.
        Table3Row("E", ("positional=learned",), 65, 4.92, 25.7),
        Table3Row(
            "big", ("d_model=1024", "d_ff=4096", "h=16", "p_drop=0.3"), 213, 4.33, 26.4, 300_000
        ),
    )
}


def table3_config(name: str) -> ModelConfig:
    """The config of a Table 3 row (overrides applied to ``base``)."""
    try:
        row = TABLE3[name]
    except KeyError:
        raise ConfigError(f"unknown Table 3 row {name!r}; choose one of {list(TABLE3)}") from None
    return apply_overrides(PRESETS["base"], row.overrides)


# Table 3's rows change these sizes; at another scale a row changes them by the paper's factor.
TABLE3_SIZES = ("N", "d_model", "d_ff", "h", "d_k", "d_v")
TABLE3_SCALES = ("paper", "relative")


def table3_overrides(name: str, base: ModelConfig, scale: str = "paper") -> dict[str, Any]:
    """Row ``name``'s overrides of a base model. ``scale="paper"``: the paper's values as
    they are (for a base of the paper's size). ``"relative"``: each size the row changes is
    ``base``'s times the paper's factor (row value / the paper's base value: A1's h=1, d_k=512
    on a base with h=8, d_k=16 gives h=1, d_k=128, so h*d_k stays base's, as the paper keeps
    it; "big" doubles d_model, d_ff and h, as the paper's big does its base); the other keys
    (dropout, label smoothing, positions) keep the paper's values. A size that would not be a
    whole number is a ConfigError naming the row."""
    if scale not in TABLE3_SCALES:
        raise ConfigError(f"table3.scale: {scale!r} is not one of {TABLE3_SCALES}")
    try:
        row = TABLE3[name]
    except KeyError:
        raise ConfigError(f"unknown Table 3 row {name!r}; choose one of {list(TABLE3)}") from None
    overrides = row.overrides_dict()
    if scale == "paper":
        return overrides
    paper_base = PRESETS["base"]
    scaled: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in TABLE3_SIZES:
            scaled[key] = value
            continue
        size = getattr(base, key) * value / getattr(paper_base, key)
        if size != int(size) or size < 1:
            raise ConfigError(
                f"table3: row {name}'s {key}={value} (the paper's base: "
                f"{getattr(paper_base, key)}) scales the base's {key}={getattr(base, key)} to "
                f"{size:g}, not a whole size: choose a base whose {key} the paper's factors divide"
            )
        scaled[key] = int(size)
    return scaled


# --- overrides ---------------------------------------------------------------------------------

_FIELD_TYPES: dict[str, type] = {
    f.name: {"int": int, "float": float, "str": str, "bool": bool}[str(f.type)]
    for f in fields(ModelConfig)
}


def _coerce(key: str, value: Any) -> Any:
    """Convert ``value`` (a string from ``--set`` or a JSON value) to the type of field ``key``."""
    kind = _FIELD_TYPES[key]
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"):
                return True
            if isinstance(value, str) and value.strip().lower() in ("false", "0", "no"):
                return False
            raise ValueError(value)
        if kind is int:
            if isinstance(value, bool):
                raise ValueError(value)
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"model config key {key!r} expects {kind.__name__}, got {value!r}"
        ) from None


def apply_overrides(
    cfg: ModelConfig, overrides: list[str] | tuple[str, ...] | dict[str, Any]
) -> ModelConfig:
    """Return ``cfg`` with ``["key=value", ...]`` (or a ``{key: value}`` mapping) applied.

    Values are parsed by the field's type; an unknown key, a malformed item or an invalid value
    raises ConfigError naming the key.
    """
    if isinstance(overrides, dict):
        items = list(overrides.items())
    else:
        items = []
        for item in overrides:
            if not isinstance(item, str) or "=" not in item:
                raise ConfigError(f"model override {item!r} is not of the form key=value")
            key, value = item.split("=", 1)
            items.append((key.strip(), value.strip()))
    values = cfg.to_dict()
    for key, value in items:
        if key not in _FIELD_TYPES:
            known = sorted(_FIELD_TYPES)
            message = f"unknown model config key {key!r} in overrides; known keys: {known}"
            raise ConfigError(removed_key_message("model", [key]) or message)
        values[key] = _coerce(key, value)
    return ModelConfig(**values)


def model_config_from_spec(spec: Mapping[str, Any]) -> ModelConfig:
    """An experiment's ``{"preset": name, "overrides": {...}}`` -> ``ModelConfig``; an unknown
    key or a bad value is a ConfigError naming it."""
    unknown = sorted(set(spec) - {"preset", "overrides"})
    if unknown:
        raise ConfigError(f"model spec: unknown key(s) {unknown}; expected 'preset', 'overrides'")
    overrides = spec.get("overrides") or {}
    if not isinstance(overrides, Mapping):
        raise ConfigError("model spec: 'overrides' must be a mapping of model config keys")
    return apply_overrides(get_preset(str(spec.get("preset", "base"))), dict(overrides))
