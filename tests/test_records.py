"""Every figure README.md and config/ state as measured is checked against its record in
benchmarks/records/ (issue 33): a stale number, or a record nobody cites, fails here.

A record (``benchmarks/records/<name>.json``) holds the measured ``values``, ``derived`` values
computed from them (``[a, "/", b]``, ``[a, "-", b]``; a name or a number on each side), and
``claims``: per file, format strings over those values (Python's ``str.format``) that must
appear in that file's text, whitespace runs counted as one space. With them: what was
measured, the command, commit, machine (CPU model and flags), date, runs and spread, and the
RESULTS.md section. A document marks each cited figure with ``<!-- record: <name> -->``
(``# record: <name>`` in YAML); every marker names a record that claims text in that file.
"""

from __future__ import annotations

import json
import operator
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "benchmarks" / "records"
DOCUMENTS = ["README.md", "config/README.md", *(p.relative_to(REPO).as_posix()
             for p in sorted((REPO / "config").rglob("*.yaml")))]  # fmt: skip
REQUIRED = {"what", "values", "claims", "command", "commit", "machine", "date", "runs", "spread",
            "source"}  # fmt: skip
OPERATORS = {"/": operator.truediv, "-": operator.sub, "*": operator.mul}
MARKER = re.compile(r"(?:<!--|#)\s*record:\s*([\w.-]+)")


def load_records() -> dict[str, dict]:
    return {
        p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(RECORDS.glob("*.json"))
    }


def record_values(record: dict) -> dict[str, float]:
    """The record's values with its derived ones computed."""
    values = dict(record["values"])
    for name, (left, op, right) in record.get("derived", {}).items():
        operand = [values[x] if isinstance(x, str) else x for x in (left, right)]
        values[name] = OPERATORS[op](*operand)
    return values


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_there_are_records_and_each_is_complete() -> None:
    records = load_records()
    assert records, "benchmarks/records/ holds no record"
    for name, record in records.items():
        assert set(record) >= REQUIRED, f"{name}: missing {sorted(REQUIRED - set(record))}"
        assert {"cpu_model", "cpu_flags"} <= set(record["machine"]), name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["date"]), name


@pytest.mark.parametrize("name", sorted(load_records()))
def test_each_claim_of_a_record_is_what_its_document_says(name: str) -> None:
    record = load_records()[name]
    values = record_values(record)
    for document, claims in record["claims"].items():
        text = _flat((REPO / document).read_text(encoding="utf-8"))
        assert f"record: {name}" in text, f"{document} cites {name} without its marker"
        for claim in claims:
            expected = _flat(claim.format(**values))
            assert expected in text, f"{document}: expected {expected!r} (record {name})"


def test_every_marker_names_a_record_that_claims_text_there() -> None:
    records = load_records()
    seen = set()
    for document in DOCUMENTS:
        for name in MARKER.findall((REPO / document).read_text(encoding="utf-8")):
            assert name in records, f"{document}: marker names no record {name!r}"
            assert document in records[name]["claims"], f"{name} claims nothing in {document}"
            seen.add(name)
    assert seen == set(records), f"records no document cites: {sorted(set(records) - seen)}"
