"""Training settings (the twin of ``model/config.py``): ``TrainConfig``, its validation, the
keys a resume compares, and the fingerprint of the settings that shape learning. What its
"auto" values become on a machine is ``training/rules.py``, applied once by
``training/resolution.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transformer_nmt.errors import ConfigError
from transformer_nmt.removed_keys import removed_key_message

# The strategies that are tested (tests/test_train_ddp.py trains two DDP processes with each):
# "auto" (DDP with gloo on CPU / NCCL on GPU when several processes train) and Lightning's "ddp".
# Sharded strategies (fsdp, deepspeed) would need the gradient rescaling reworked and are not
# offered.
STRATEGIES = ("auto", "ddp")
PRECISIONS = ("auto", "32-true", "32", "bf16-mixed", "16-mixed", "bf16-true", "64-true")
PRECISION_ALIASES = {"32": "32-true", "32-true": "32"}  # Lightning's two names of fp32


@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters (keys as in docs/interfaces.md). Defaults = the paper's base."""

    max_steps: int = 100_000  # §5.2: base 100k steps, big 300k
    # Tokens (with padding) per device per batch, or "auto": the largest whose worst-case batch
    # fits the device's memory with a margin, at most the device's share of tokens_per_update
    # (training/memory.py, auto_max_tokens); gradient accumulation fills the §5.1 update.
    max_tokens: int | str = 4096
    # §5.1: ~25k source + ~25k target tokens per optimizer step. Counted as *real* target
    # tokens (y EOS, no padding): the gradient accumulation is the number of micro-batches,
    # over all devices, whose real target tokens come closest to this (``accumulation``).
    tokens_per_update: int = 25_000
    # Speed only (1 = widths as they come): batch widths are rounded up to a multiple of this,
    # so that an epoch has few distinct shapes (kernels, compiled graphs and the CPU's oneDNN
    # primitives are reused); padding is masked, and max_tokens counts the rounded widths.
    # "auto": ``pad_multiple_choice`` (8 where the run trains in 16 bits, else 1).
    pad_multiple: int | str = 1
    warmup: int = 4000  # §5.3 warmup_steps
    # Flag (paper: 1.0): multiplies the §5.3 learning-rate schedule.
    lr_scale: float = 1.0
    # Flag (paper: null = none): the last N updates before max_steps scale the §5.3 rate down
    # linearly towards 0 (optimizer.cooldown_factor); for short runs, where the rate is still high
    # at the end.
    lr_cooldown_steps: int | None = None
    adam_betas: tuple[float, float] = (0.9, 0.98)  # §5.3
    adam_eps: float = 1e-9  # §5.3
    # Flag (paper: none): clip the gradient norm to this value; null = off.
    clip_grad_norm: float | None = None
    # Flag (memory only, same numbers): compute the output projection and loss this many
    # target tokens at a time (objective.chunked_label_smoothed_cross_entropy); null = at once.
    loss_chunk_tokens: int | None = None
    # Flag (speed only, off = the eager model): torch.compile the Transformer for the training
    # and validation loss. Not combined with loss_chunk_tokens.
    compile: bool = False
    # Flag (speed only, same numbers up to rounding): the loss's passes over the [tokens x V]
    # logits as torch.compile'd kernels. "auto" = on a CUDA device with Triton (one H100,
    # bf16: big +26%, base +54% target tokens/s; benchmarks/log/2026-11-27.md), off on a CPU, whose
    # eager loss in cache-sized chunks is the measured fast path; true / false force it.
    fused_loss: bool | str = "auto"
    seed: int = 1
    # Flag (none by default): train keys whose value depends on the precision the run trains in,
    # e.g. {"bf16-mixed": {"max_steps": 2400, "lr_cooldown_steps": 750}}: a 16-bit run that
    # computes faster can take more steps in the same minutes. Applied once the precision is
    # resolved (``for_precision``); with a "bf16-mixed" entry, precision: auto on a CPU with bf16
    # instructions trains in bf16-mixed (training/rules.py, precision_choice).
    by_precision: dict[str, dict[str, Any]] = field(default_factory=dict)
    # "auto" = bf16-mixed on GPUs with bf16 (a speed departure from the paper's fp32 P100
    # training, numerically benign), else 32-true; or any Lightning precision string.
    precision: str = "auto"
    accelerator: str = "auto"
    devices: int | str = 1  # int, or "auto" (all visible GPUs / 1 CPU process)
    num_nodes: int = 1
    strategy: str = "auto"  # "auto" = DDP when devices x num_nodes > 1
    checkpoint_every_minutes: float = 10.0  # §6.1: checkpoints at 10-minute intervals
    checkpoint_every_steps: int | None = None  # overrides minutes when set (reproducible)
    keep_checkpoints: int = 5  # must be >= the number averaged (§6.1: 5 base, 20 big)
    val_every_steps: int = 1000
    val_bleu_sentences: int = 0  # greedy validation BLEU on this many sentences; 0 = off
    # §6.1 beam-search BLEU on the whole dev set at this interval (a multiple of
    # val_every_steps; also at max_steps); null = off. Costly on CPUs.
    val_beam_bleu_every_steps: int | None = None
    log_every_steps: int = 100
    num_workers: int = 0
    max_positions: int = 1024

    def __post_init__(self) -> None:
        _validate(self)

    def for_precision(self, precision: str) -> TrainConfig:
        """This config with ``by_precision[precision]``'s values (the run's sizing in that
        precision); unchanged where ``by_precision`` names none."""
        values = self.by_precision.get(precision) or self.by_precision.get(
            PRECISION_ALIASES.get(precision, "")
        )
        return dataclasses.replace(self, **values) if values else self

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build from a JSON mapping; an unknown key is a ConfigError naming it."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"train config must be a mapping, got {type(data).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            message = f"unknown train config key(s) {unknown}; known keys: {sorted(names)}"
            raise ConfigError(removed_key_message("train", unknown) or message)
        values = dict(data)
        if "adam_betas" in values:
            betas = values["adam_betas"]
            if not isinstance(betas, (list, tuple)) or len(betas) != 2:
                raise ConfigError(f"train config key 'adam_betas' must be [b1, b2], got {betas!r}")
            values["adam_betas"] = tuple(betas)
        return cls(**values)


# The keys ``by_precision`` may set: how long a run trains and how often it checkpoints,
# validates and logs (its length in steps), not what or how it learns.
BY_PRECISION_KEYS = (
    "max_steps",
    "lr_cooldown_steps",
    "warmup",
    "checkpoint_every_steps",
    "val_every_steps",
    "val_beam_bleu_every_steps",
    "log_every_steps",
)


# The batch geometry: how one update's tokens are cut into micro-batches and computed. A change
# (after an out-of-memory error, or moving from eight GPUs to one) keeps the update's token
# budget (tokens_per_update, by gradient accumulation), the §5.3 schedule and Adam's state, so a
# run resumes from its newest checkpoint with a notice, as fairseq resumes with a new
# --max-tokens.
GEOMETRY_KEYS = ("max_tokens", "pad_multiple", "devices", "num_nodes", "precision")

# Keys a resumed run may change: they decide how long, where, in what batch geometry and how
# visibly a run trains, not what it learns. Every other key (and the model config and
# vocabulary) is part of the run's ``learning_fingerprint``: a change there trains from scratch.
RESUMABLE_KEYS = frozenset(
    {
        *GEOMETRY_KEYS,
        "max_steps",
        "checkpoint_every_minutes",
        "checkpoint_every_steps",
        "keep_checkpoints",
        "val_every_steps",
        "val_bleu_sentences",
        "val_beam_bleu_every_steps",
        "log_every_steps",
        "num_workers",
        "accelerator",
        "devices",
        "num_nodes",
        "strategy",
        "loss_chunk_tokens",
        "compile",
        "fused_loss",
        # what it sizes is compared as sized (the run's own warmup, cooldown...), not the table
        "by_precision",
    }
)


def learning_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The train settings that change what is learned (all but ``RESUMABLE_KEYS``)."""
    return {k: v for k, v in cfg.to_dict().items() if k not in RESUMABLE_KEYS}


def learning_fingerprint(
    model_config: Mapping[str, Any], vocab_sha256: str, cfg: TrainConfig
) -> str:
    """sha256 of what a run learns from: model config, vocabulary and ``learning_settings``.
    Stored in every checkpoint; a resume needs the same fingerprint."""
    identity = {
        "model": dict(model_config),
        "vocab_sha256": vocab_sha256,
        "train": learning_settings(cfg),
    }
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _validate(cfg: TrainConfig) -> None:
    def positive_int(key: str, allow_none: bool = False, allow_auto: bool = False) -> None:
        value = getattr(cfg, key)
        if (allow_none and value is None) or (allow_auto and value == "auto"):
            return
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            also = " or 'auto'" if allow_auto else ""
            raise ConfigError(
                f"train config key {key!r} must be a positive integer{also}, got {value!r}"
            )

    def number(key: str, low: float, high: float, allow_none: bool = False) -> None:
        value = getattr(cfg, key)
        if allow_none and value is None:
            return
        ok = not isinstance(value, bool) and isinstance(value, int | float)
        if not ok or not (low < value < high):
            raise ConfigError(
                f"train config key {key!r} must be a number in ({low}, {high}), got {value!r}"
            )

    for key in ("max_steps", "tokens_per_update", "warmup", "num_nodes"):
        positive_int(key)
    for key in ("pad_multiple", "max_tokens", "devices"):
        positive_int(key, allow_auto=True)
    for key in ("keep_checkpoints", "val_every_steps", "log_every_steps", "max_positions"):
        positive_int(key)
    positive_int("checkpoint_every_steps", allow_none=True)
    positive_int("lr_cooldown_steps", allow_none=True)
    positive_int("loss_chunk_tokens", allow_none=True)
    positive_int("val_beam_bleu_every_steps", allow_none=True)
    every = cfg.val_beam_bleu_every_steps
    if isinstance(every, int) and not isinstance(every, bool) and every % cfg.val_every_steps:
        raise ConfigError(
            f"train config key 'val_beam_bleu_every_steps' ({every}) must be a multiple of "
            f"'val_every_steps' ({cfg.val_every_steps}): it runs at validations"
        )
    for key in ("seed", "val_bleu_sentences", "num_workers"):
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"train config key {key!r} must be an integer >= 0, got {value!r}")
    number("lr_scale", 0.0, math.inf)
    number("adam_eps", 0.0, 1.0)
    number("clip_grad_norm", 0.0, math.inf, allow_none=True)
    number("checkpoint_every_minutes", 0.0, math.inf)
    for i, beta in enumerate(cfg.adam_betas):
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not 0.0 <= beta < 1.0:
            raise ConfigError(f"train config key 'adam_betas'[{i}] must be in [0, 1), got {beta!r}")
    if not isinstance(cfg.compile, bool):
        raise ConfigError(f"train config key 'compile' must be true or false, got {cfg.compile!r}")
    if cfg.fused_loss not in (True, False, "auto"):
        raise ConfigError(
            f"train config key 'fused_loss' must be auto, true or false, got {cfg.fused_loss!r}"
        )
    if cfg.compile and cfg.loss_chunk_tokens:
        raise ConfigError(
            "train config keys 'compile' and 'loss_chunk_tokens' cannot be combined: "
            "compile covers the unchunked loss only"
        )
    _validate_by_precision(cfg)
    if cfg.precision not in PRECISIONS:
        raise ConfigError(
            f"train config key 'precision' must be one of {list(PRECISIONS)}, got {cfg.precision!r}"
        )
    for key in ("accelerator", "strategy"):
        if not isinstance(getattr(cfg, key), str):
            raise ConfigError(f"train config key {key!r} must be a string")
    if cfg.strategy not in STRATEGIES:
        raise ConfigError(
            f"train config key 'strategy' must be one of {list(STRATEGIES)}, got "
            f"{cfg.strategy!r} (sharded strategies such as fsdp/deepspeed are not supported: the "
            "per-token gradient rescaling assumes whole gradients on every rank)"
        )


def _validate_by_precision(cfg: TrainConfig) -> None:
    """``by_precision``: {precision: {key: value}} over Lightning precisions and
    ``BY_PRECISION_KEYS``, each sized config valid (its error names the entry)."""
    if not isinstance(cfg.by_precision, Mapping):
        raise ConfigError(
            "train config key 'by_precision' must map a precision to train keys, e.g. "
            f"{{bf16-mixed: {{max_steps: 2400}}}}, got {cfg.by_precision!r}"
        )
    for precision, values in cfg.by_precision.items():
        where = f"train config key 'by_precision.{precision}'"
        if precision not in PRECISIONS or precision == "auto":
            known = [p for p in PRECISIONS if p != "auto"]
            raise ConfigError(f"{where}: not a precision; one of {known}")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where} must map train keys to values, got {values!r}")
        unknown = sorted(set(values) - set(BY_PRECISION_KEYS))
        if unknown:
            raise ConfigError(
                f"{where}: key(s) {unknown} cannot depend on the precision; these can: "
                f"{list(BY_PRECISION_KEYS)}"
            )
        try:
            dataclasses.replace(cfg, by_precision={}, **values)
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None
