"""Cleaning rules for training pairs, with counts of what each rule removed.

Rules apply to the training split only; validation and test sets are never filtered (they are
only checked: aligned, valid UTF-8). The paper does not describe its cleaning; these are the
usual Moses ``clean-corpus-n`` style rules, each a named key of the ``--clean`` JSON:

- ``strip`` (true): remove leading/trailing whitespace of each side.
- ``drop_control_chars`` (true): delete control characters (Unicode category Cc; a tab becomes a
  space); pairs changed this way are counted under ``modified.control_chars``.
- ``drop_empty`` (true): drop pairs with an empty side.
- ``max_length`` (250): drop pairs with a side longer than this many whitespace tokens; null = off.
- ``max_length_ratio`` (9.0): drop pairs whose longer side has more than this many times the
  whitespace tokens of the shorter side (Moses' default ratio); null = off.
- ``dedupe`` (true): drop exact duplicate (source, target) pairs after the rules above, keeping
  the first occurrence, across all training corpora.
- ``max_sentences`` (null): NOT a paper setting, a testing option for fast smoke runs of the
  whole DAG: read only the first N pairs of every split (train, valid and tests).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from transformer_nmt.errors import ConfigError

# Unicode category Cc = U+0000..U+001F and U+007F..U+009F.
_CONTROL = {c: None for c in (*range(0x00, 0x20), *range(0x7F, 0xA0))}
_CONTROL[ord("\t")] = " "
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")

DROP_REASONS = ("empty", "too_long", "length_ratio", "duplicate")


@dataclass(frozen=True)
class CleanConfig:
    strip: bool = True
    drop_control_chars: bool = True
    drop_empty: bool = True
    max_length: int | None = 250
    max_length_ratio: float | None = 9.0
    dedupe: bool = True
    max_sentences: int | None = None  # testing option, not the paper: first N pairs per split

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "--clean") -> CleanConfig:
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a JSON object of cleaning rules, got {raw!r}")
        known = {f.name for f in fields(cls)}
        for key, value in raw.items():
            if key not in known:
                raise ConfigError(
                    f"{where}: unknown cleaning rule {key!r} (known: {sorted(known)})"
                )
            _check_value(key, value, where)
        return cls(**raw)

    @classmethod
    def from_json(cls, text: str | None, where: str = "--clean") -> CleanConfig:
        if not text:
            return cls()
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where}: invalid JSON ({err})") from err
        return cls.from_dict(raw, where)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_value(key: str, value: Any, where: str) -> None:
    bools = {"strip", "drop_control_chars", "drop_empty", "dedupe"}
    if key in bools:
        ok = isinstance(value, bool)
    elif key in ("max_length", "max_sentences"):
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0)
    else:  # max_length_ratio
        ok = value is None or (
            isinstance(value, int | float) and not isinstance(value, bool) and value >= 1
        )
    if not ok:
        expected = (
            "true or false"
            if key in bools
            else "null or a number >= 1"
            if key == "max_length_ratio"
            else "null or a positive integer"
        )
        raise ConfigError(f"{where}: {key} must be {expected}, got {value!r}")


@dataclass
class CorpusCounts:
    """What happened to one corpus of one split."""

    read: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    modified: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "kept": self.kept,
            "dropped": {reason: self.dropped[reason] for reason in DROP_REASONS},
            "modified": {"control_chars": self.modified["control_chars"]},
        }


def clean_pair(
    src: str, tgt: str, rules: CleanConfig, counts: CorpusCounts
) -> tuple[str, str] | None:
    """Apply every rule but ``dedupe`` to one training pair; None (and a count) if dropped."""
    # the regex scan runs in C; str.translate (slow per character) only on the rare hits
    if rules.drop_control_chars and (_CONTROL_RE.search(src) or _CONTROL_RE.search(tgt)):
        src, tgt = src.translate(_CONTROL), tgt.translate(_CONTROL)
        counts.modified["control_chars"] += 1
    if rules.strip:
        src, tgt = src.strip(), tgt.strip()
    if rules.drop_empty and (not src.strip() or not tgt.strip()):
        counts.dropped["empty"] += 1
        return None
    if rules.max_length is not None or rules.max_length_ratio is not None:
        ls, lt = len(src.split()), len(tgt.split())
        if rules.max_length is not None and max(ls, lt) > rules.max_length:
            counts.dropped["too_long"] += 1
            return None
        if rules.max_length_ratio is not None and max(ls, lt) > rules.max_length_ratio * max(
            min(ls, lt), 1
        ):
            counts.dropped["length_ratio"] += 1
            return None
    return src, tgt
