"""Every measured figure is checked against its record in benchmarks/records/: a stale number,
a table edited by hand, or a record nothing cites fails here.

README.md and docs/*.md show measured figures only in tables that ``benchmarks/render_tables.py``
renders from the records (``benchmarks/tables.yaml``). config/ states figures in its text: the
records' format and that claim check live in ``benchmarks/record_claims.py`` (``make bench``
uses both). config/ marks each cited figure with ``<!-- record: <name> -->`` (``# record:
<name>`` in YAML); every marker names a record that claims text in that file.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from record_claims import REQUIRED, load_records, stale_claims  # noqa: E402
from render_tables import (  # noqa: E402
    BLOCK,
    documents,
    load_tables,
    placed_tables,
    render_table,
    render_text,
)

DOCUMENTS = ["config/README.md", *(p.relative_to(REPO).as_posix()
             for p in sorted((REPO / "config").rglob("*.yaml")))]  # fmt: skip
MARKER = re.compile(r"(?:<!--|#)\s*record:\s*([\w.-]+)")


def test_there_are_records_and_each_is_complete() -> None:
    records = load_records()
    assert records, "benchmarks/records/ holds no record"
    for name, record in records.items():
        assert set(record) >= REQUIRED, f"{name}: missing {sorted(REQUIRED - set(record))}"
        assert {"cpu_model", "cpu_flags"} <= set(record["machine"]), name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["date"]), name


@pytest.mark.parametrize("name", sorted(load_records()))
def test_each_claim_of_a_record_is_what_its_document_says(name: str) -> None:
    assert stale_claims(name, load_records()[name]) == []


def test_every_marker_names_a_record_that_claims_text_there() -> None:
    records = load_records()
    seen = set()
    for document in DOCUMENTS:
        for name in MARKER.findall((REPO / document).read_text(encoding="utf-8")):
            assert name in records, f"{document}: marker names no record {name!r}"
            assert document in records[name]["claims"], f"{name} claims nothing in {document}"
            seen.add(name)
    seen |= {row["record"] for table in load_tables().values() for row in table["rows"]}
    assert seen == set(records), f"records nothing cites: {sorted(set(records) - seen)}"


# --- the rendered tables of README.md and docs/ -----------------------------------------------


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_each_table_of_a_document_is_its_records_rendered(path: Path) -> None:
    text, where = path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix()
    assert render_text(text, where, load_tables(), load_records()) == text, (
        f"{where}: a table differs from its records; run python benchmarks/render_tables.py"
    )


def test_every_table_is_placed_and_every_row_names_a_record_with_its_figures() -> None:
    tables, records = load_tables(), load_records()
    assert set(placed_tables()) == set(tables), "tables.yaml and the documents' blocks differ"
    for name, table in tables.items():
        for row in table["rows"]:
            assert row["record"] in records, f"table {name}: no record {row['record']!r}"
        rendered = render_table(name, table, records, "")
        assert rendered.count("\n|") == len(table["rows"]) + 1, name  # header rule + rows


def test_a_figure_edited_by_hand_in_a_table_fails_the_check() -> None:
    """The README's first table with one figure changed is no longer its rendering; with the
    figure back, it is."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    body = BLOCK.search(readme).group(3)
    figure = re.search(r"\| (\d+\.\d+) \|", body)
    edited = body.replace(figure.group(0), f"| {float(figure.group(1)) + 0.1:.1f} |", 1)
    tables, records = load_tables(), load_records()
    assert render_text(readme.replace(body, edited), "README.md", tables, records) == readme
    assert readme.replace(body, edited) != readme


def test_a_row_names_the_machine_class_from_the_record() -> None:
    from render_tables import machine_class

    xeon = {"cpu_model": "Intel(R) Xeon(R) Processor", "cores": 2}
    assert machine_class({**xeon, "cpu_flags": "amx_bf16 avx512_bf16 avx2"}) == (
        "2-core Intel Xeon, AMX"
    )
    assert (
        machine_class({**xeon, "cpu_flags": "avx2 avx512f"}) == "2-core Intel Xeon, AVX512, no bf16"
    )
    assert machine_class({"cpu_model": "AMD EPYC", "cpu_flags": "avx2", "cores": 2}) == (
        "2-core AMD EPYC, AVX2 only"
    )
    assert machine_class({"gpu": "NVIDIA H200 (one, lent VM)", "cpu_flags": "n/a"}) == "NVIDIA H200"


SOURCE_REF = re.compile(r'benchmarks/log/([\w-]+\.md)((?:, "[^"]+")+)')


def log_headings(path: Path) -> list[str]:
    """The Markdown headings of a log file, code blocks left out."""
    headings, fence = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            headings.append(line.lstrip("#").strip())
    return headings


def test_every_record_source_names_a_section_of_the_log() -> None:
    """A record's ``source`` names the log's day file and one or more of its sections:
    ``benchmarks/log/<day>.md, "<title>", "<title>"`` (free text may follow; a second day file
    after a semicolon). A title is a heading of that file or its opening words. Only what
    ``make bench`` writes may name no section."""
    log = REPO / "benchmarks" / "log"
    for name, record in load_records().items():
        refs = SOURCE_REF.findall(record["source"])
        if not refs:
            assert record["source"].startswith("make bench (benchmarks/bench_quick.py)"), (
                f"{name}: its source names no section of benchmarks/log/: {record['source']!r}"
            )
        for file, titles in refs:
            assert (log / file).is_file(), f"{name}: no benchmarks/log/{file}"
            headings = log_headings(log / file)
            for title in re.findall(r'"([^"]+)"', titles):
                assert any(
                    h.startswith(title) and not h[len(title) : len(title) + 1].isalnum()
                    for h in headings
                ), f"{name}: benchmarks/log/{file} has no section {title!r}"


def test_make_bench_rewrites_a_record_keeping_its_claims_and_lists_stale_ones(
    tmp_path, monkeypatch, capsys
) -> None:
    """bench_quick.write_record: new values, commit and machine, the old claims kept; the
    claim check then names the sentence the document no longer states."""
    import bench_quick
    import harness

    records = tmp_path / "benchmarks" / "records"
    records.mkdir(parents=True)
    (tmp_path / "README.md").write_text(
        "The demo takes 6.0 minutes at commit abc1234 <!-- record: demo_x -->\n", "utf-8"
    )
    old = {"values": {"dag_seconds": 360.0}, "derived": {"dag_minutes": ["dag_seconds", "/", 60]},
           "claims": {"README.md": ["takes {dag_minutes:.1f} minutes at commit {commit}"]},
           "commit": "abc1234", "date": "2026-01-01"}  # fmt: skip
    (records / "demo_x.json").write_text(json.dumps(old), "utf-8")
    monkeypatch.setattr(harness, "RECORDS", records)
    monkeypatch.setattr(bench_quick, "load_records", lambda: load_records(records))
    monkeypatch.setattr(
        bench_quick, "stale_claims", lambda name, record: stale_claims(name, record, tmp_path)
    )
    info = {"cpu": "AMD EPYC", "flags": ["avx2", "avx512_bf16"], "cores": 2, "commit": "def5678"}
    result = {"values": {"dag_seconds": 420.0}, "derived": old["derived"], "what": "w",
              "command": "c", "runs": 1, "spread": "s", "model": {"model": "m.pt"}}  # fmt: skip
    bench_quick.write_record("demo_x", result, info)
    record = load_records(records)["demo_x"]
    assert record["claims"] == old["claims"]
    assert (record["values"], record["commit"]) == ({"dag_seconds": 420.0}, "def5678")
    assert record["machine"] == {"cpu_model": "AMD EPYC", "cpu_flags": "avx2 avx512_bf16",
                                 "cores": 2}  # fmt: skip
    assert set(record) >= REQUIRED and "model" not in record
    assert bench_quick.report_claims(["demo_x"]) == 1
    stale = capsys.readouterr().out
    assert "'takes 7.0 minutes at commit def5678'" in stale, stale
    (tmp_path / "README.md").write_text(
        "The demo takes 7.0 minutes at commit def5678 <!-- record: demo_x -->\n", "utf-8"
    )
    assert bench_quick.report_claims(["demo_x"]) == 0


def test_make_bench_names_each_cpu_class_as_the_records_do() -> None:
    from bench_quick import machine_key

    def key(cpu, *flags):
        return machine_key({"cpu": cpu, "flags": list(flags)})

    assert key("Intel(R) Xeon(R) Processor", "amx_bf16", "avx512_bf16", "avx2") == "xeon_amx"
    assert key("AMD EPYC", "avx512_bf16", "avx2") == "epyc"
    assert key("AMD EPYC 7B13", "avx2") == "epyc_avx2"
    assert key("Intel(R) Xeon(R) Processor", "avx512f", "avx512bw", "avx2") == "xeon_avx512"
    assert (
        key(
            "Some CPU 9",
        )
        == "some_cpu_9_base"
    )
    assert {f"demo_{key('AMD EPYC', 'avx512_bf16')}", "demo_xeon_amx"} <= set(load_records())


def test_a_row_naming_a_value_its_record_lacks_is_one_error_naming_table_and_record() -> None:
    records = load_records()
    table = {"columns": ["Minutes"], "rows": [{"record": "demo_epyc", "cells": ["{no_such:.1f}"]}]}
    with pytest.raises(ValueError, match=r"tables\.yaml: table t, row of demo_epyc: .*no_such"):
        render_table("t", table, records, "")
    table["rows"][0]["record"] = "no_record"
    with pytest.raises(ValueError, match=r"no benchmarks/records/no_record\.json"):
        render_table("t", table, records, "")
