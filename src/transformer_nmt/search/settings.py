"""The settings of a search, with the paper's values as defaults: the one source of them for
the search functions, the translator, the translate CLI and its logged params."""

from __future__ import annotations

from dataclasses import dataclass

from transformer_nmt.errors import ConfigError

EARLY_STOP = ("exact", "best")  # search.beam's stopping rules


@dataclass(frozen=True)
class SearchSettings:
    """§6.1: beam 4, length penalty α = 0.6, output length at most input length + 50."""

    beam: int = 4
    alpha: float = 0.6
    max_len_b: int = 50
    nbest: int = 1
    max_tokens: int = 4096  # source tokens per batch, counting padding and the EOS
    # When a sentence's beam search stops (search.beam): "exact" (no live hypothesis can
    # still win) or "best" (its best candidate of a step ended: OpenNMT-py/eole, CTranslate2).
    early_stop: str = "exact"

    def __post_init__(self) -> None:
        if self.beam < 1:
            raise ConfigError(f"--beam must be >= 1, got {self.beam}")
        if not 1 <= self.nbest <= self.beam:
            raise ConfigError(f"--nbest must be between 1 and --beam={self.beam}, got {self.nbest}")
        if self.alpha < 0:
            raise ConfigError(f"--alpha must be >= 0, got {self.alpha}")
        if self.max_len_b < 0:
            raise ConfigError(f"--max-len-b must be >= 0, got {self.max_len_b}")
        if self.max_tokens < 1:
            raise ConfigError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.early_stop not in EARLY_STOP:
            raise ConfigError(
                f"--early-stop must be one of {list(EARLY_STOP)}, got {self.early_stop!r}"
            )
