"""The records of measured figures (``benchmarks/records/<name>.json``) and the claims they
make in README.md and config/: one home for reading them, used by ``tests/test_records.py``
(a stale figure fails CI) and by ``bench_quick.py`` (``make bench`` rewrites the records and
lists the claims that no longer match).

A record holds the measured ``values``, ``derived`` values computed from them (``[a, "/", b]``,
``[a, "-", b]``, ``[a, "*", b]``; a name or a number on each side), and ``claims``: per file,
format strings over those values and the record's ``commit`` and ``date`` (Python's
``str.format``) that must appear in that file's text, whitespace runs counted as one space.
With them: what was measured, the command, commit, machine (CPU model and flags), date, runs
and spread, and where benchmarks/log/ tells the story.
"""

from __future__ import annotations

import json
import operator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECORDS = REPO / "benchmarks" / "records"
REQUIRED = {"what", "values", "claims", "command", "commit", "machine", "date", "runs", "spread",
            "source"}  # fmt: skip
OPERATORS = {"/": operator.truediv, "-": operator.sub, "*": operator.mul}


def load_records(directory: Path = RECORDS) -> dict[str, dict]:
    return {
        p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.json"))
    }


def record_values(record: dict) -> dict[str, float]:
    """The record's values with its derived ones computed."""
    values = dict(record["values"])
    for name, (left, op, right) in record.get("derived", {}).items():
        operand = [values[x] if isinstance(x, str) else x for x in (left, right)]
        values[name] = OPERATORS[op](*operand)
    return values


def flat(text: str) -> str:
    return " ".join(text.split())


def stale_claims(name: str, record: dict, repo: Path = REPO) -> list[str]:
    """Each claim of ``record`` its document does not state (``document: expected text``)."""
    values = {**record_values(record), "commit": record["commit"], "date": record["date"]}
    stale = []
    for document, claims in record["claims"].items():
        text = flat((repo / document).read_text(encoding="utf-8"))
        if f"record: {name}" not in text:
            stale.append(f"{document}: no marker 'record: {name}'")
        for claim in claims:
            expected = flat(claim.format(**values))
            if expected not in text:
                stale.append(f"{document}: {expected!r}")
    return stale
