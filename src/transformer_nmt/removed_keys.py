"""Config keys of levers that were measured, not adopted and removed (CHANGELOG.md, "Removed").

Each lever's measurement stays in benchmarks/ (the record named here) and its code in the last
commit that had it. A config that sets one of these keys is refused in one line that says so
(``removed_key_message``: the model and train configs' own checks and the pipeline schema's
error line). A checkpoint written before the removal recorded the keys at the paper's value,
which is the model without the lever, so reading one drops them (``without_removed``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

RELEASE = "0.2.0"
LAST_COMMIT = "8bd38e2"


@dataclass(frozen=True)
class RemovedKey:
    section: str  # "model" (an experiment's model_overrides) or "train"
    paper: Any  # the value every run had without the lever
    lever: str
    record: str  # the measurement that did not adopt it


def _log(day: str, title: str) -> str:
    return f'benchmarks/log/{day}.md, section "{title}"'


_WORD_DROPOUT = RemovedKey(
    "model", 0.0, "word dropout", _log("2026-11-28", "Word dropout on the recipe, seeds 2 and 3")
)
REMOVED_KEYS: dict[str, RemovedKey] = {
    "softmax_vocab": RemovedKey(
        "model",
        "shared",
        "the §3.4 softmax over the training targets' pieces",
        "benchmarks/records/softmax_vocab_demo_epyc.json",
    ),
    "p_drop_layer": RemovedKey(
        "model", 0.0, "LayerDrop", _log("2026-11-28", "LayerDrop: built, and at 0.2 on the recipe")
    ),
    "p_drop_word_src": _WORD_DROPOUT,
    "p_drop_word_tgt": _WORD_DROPOUT,
    "rdrop_alpha": RemovedKey(
        "train", 0.0, "R-Drop", _log("2026-11-29", "R-Drop on the recipe, seed 1")
    ),
    "low_precision_residual": RemovedKey(
        "train",
        False,
        "the residual stream in 16 bits",
        "benchmarks/records/gpu_h200_residual.json",
    ),
}


def removed_key_message(section: str, keys: Iterable[str]) -> str | None:
    """The one-line refusal of the first of ``keys`` that ``section`` ("model" or "train") no
    longer has, or None when none was removed."""
    for key in keys:
        removed = REMOVED_KEYS.get(key)
        if removed is not None and removed.section == section:
            return (
                f"{section} config key {key!r} was removed in release {RELEASE} "
                f"({removed.lever}: measured and not adopted, {removed.record}; its code is in "
                f"commit {LAST_COMMIT}): delete the key"
            )
    return None


def without_removed(section: str, recorded: Mapping[str, Any]) -> dict[str, Any]:
    """``recorded`` (a checkpoint's model config or train settings) without the removed keys
    of ``section`` that hold the paper's value."""
    return {
        key: value
        for key, value in recorded.items()
        if not (
            key in REMOVED_KEYS
            and REMOVED_KEYS[key].section == section
            and value == REMOVED_KEYS[key].paper
        )
    }
