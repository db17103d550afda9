"""Cleaning rules for training pairs, with counts of what each rule removed.

Rules apply to the training split only; validation and test sets are never filtered (they are
only checked: aligned, valid UTF-8). The paper does not describe its cleaning; these are the
usual Moses ``clean-corpus-n`` style rules, each a named key of the ``--clean`` JSON:

- ``strip`` (true): remove leading/trailing whitespace of each side.
- ``drop_control_chars`` (true): drop pairs holding a control character (Unicode category Cc,
  as crawled text has from broken encodings) under ``dropped.control_chars``; a tab is no
  reason to drop a pair: it becomes a space, and pairs changed so are counted under
  ``modified.tabs``.
- Lines that are not valid UTF-8 (only training corpora are read leniently, see
  ``data/readers.py``) drop their pair under ``dropped.invalid_utf8``.
- ``max_invalid_share`` (0.01): if more than this share of a corpus's pairs were dropped as
  ``invalid_utf8`` or ``control_chars``, the file is likely damaged and the stage stops, naming
  it; null = no limit.
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

from transformer_nmt.data.readers import InvalidLine
from transformer_nmt.errors import ConfigError

# Unicode category Cc = U+0000..U+001F and U+007F..U+009F; the tab is not a reason to drop.
_CONTROL_RE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")

DROP_REASONS = ("invalid_utf8", "control_chars", "empty", "too_long", "length_ratio", "duplicate")
BROKEN_REASONS = ("invalid_utf8", "control_chars")  # what max_invalid_share limits


@dataclass(frozen=True)
class CleanConfig:
    strip: bool = True
    drop_control_chars: bool = True
    drop_empty: bool = True
    max_length: int | None = 250
    max_length_ratio: float | None = 9.0
    dedupe: bool = True
    max_invalid_share: float | None = 0.01
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
    elif key == "max_invalid_share":
        ok = value is None or (
            isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1
        )
    else:  # max_length_ratio
        ok = value is None or (
            isinstance(value, int | float) and not isinstance(value, bool) and value >= 1
        )
    if not ok:
        expected = {
            "max_length_ratio": "null or a number >= 1",
            "max_invalid_share": "null or a number from 0 to 1",
        }.get(key, "true or false" if key in bools else "null or a positive integer")
        raise ConfigError(f"{where}: {key} must be {expected}, got {value!r}")


@dataclass
class CorpusCounts:
    """What happened to one corpus of one split. ``broken``: pairs dropped for one of the
    ``BROKEN_REASONS`` per side ("src", "tgt") at fault."""

    read: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    modified: Counter[str] = field(default_factory=Counter)
    broken: Counter[str] = field(default_factory=Counter)

    def add(self, other: CorpusCounts) -> None:
        """Count ``other``'s pairs too (a chunk cleaned in a worker process)."""
        self.read += other.read
        self.kept += other.kept
        self.dropped.update(other.dropped)
        self.modified.update(other.modified)
        self.broken.update(other.broken)

    def to_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "kept": self.kept,
            "dropped": {reason: self.dropped[reason] for reason in DROP_REASONS},
            "modified": {"tabs": self.modified["tabs"]},
        }


def _broken(counts: CorpusCounts, reason: str, src_at_fault: bool) -> None:
    counts.dropped[reason] += 1
    counts.broken["src" if src_at_fault else "tgt"] += 1


def clean_pair(
    src: str, tgt: str, rules: CleanConfig, counts: CorpusCounts
) -> tuple[str, str] | None:
    """Apply every rule but ``dedupe`` to one training pair; None (and a count) if dropped.
    A side read as an ``InvalidLine`` (not UTF-8) drops the pair under ``invalid_utf8``."""
    if isinstance(src, InvalidLine) or isinstance(tgt, InvalidLine):
        return _broken(counts, "invalid_utf8", isinstance(src, InvalidLine))
    # the regex scan runs in C
    if rules.drop_control_chars and (_CONTROL_RE.search(src) or _CONTROL_RE.search(tgt)):
        return _broken(counts, "control_chars", _CONTROL_RE.search(src) is not None)
    if rules.drop_control_chars and ("\t" in src or "\t" in tgt):
        src, tgt = src.replace("\t", " "), tgt.replace("\t", " ")
        counts.modified["tabs"] += 1
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
