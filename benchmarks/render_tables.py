"""Render the tables of measured figures in README.md and docs/*.md from their records.

Every table of measured figures in those documents sits between ``<!-- table: NAME -->`` and
``<!-- /table -->`` and is written here, from ``benchmarks/tables.yaml`` (per table its columns,
per row a record of ``benchmarks/records/``, format strings over that record's values and, where
the row shows one of the record's measurements, its own ``runs``) and
the records themselves. Each row gets four columns of its record: the machine class (CPU vendor
and the instructions that decide our CPU paths, or the GPU), the runs, the commit that
reproduces the figure (or the record's ``commit_note`` where none does) and a link to the record.

    python benchmarks/render_tables.py            # rewrite the tables in place
    python benchmarks/render_tables.py --check    # exit 1 naming each table that differs

``tests/test_records.py`` runs the check, so a figure edited by hand fails CI; ``make bench``
rewrites records and then the tables.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml
from harness import cpu_tier
from record_claims import REPO, load_records, record_values

TABLES = REPO / "benchmarks" / "tables.yaml"
BLOCK = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.DOTALL)
RECORD_COLUMNS = ["Machine", "Runs", "Commit", "Record"]
# harness.cpu_tier's classes, as a row names them
TIER_NAMES = {"amx": "AMX", "avx512_bf16": "AVX512-BF16", "avx512": "AVX512, no bf16",
              "avx2": "AVX2 only", "base": "no AVX2"}  # fmt: skip


def documents(repo: Path = REPO) -> list[Path]:
    """The documents whose measured figures are rendered: README.md and docs/*.md."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def render_text(text: str, where: str, tables: dict, records: dict[str, dict]) -> str:
    """``text`` (the document ``where``, relative to the repository) with each table block
    rendered afresh; links to the records relative to ``where``."""
    prefix = "../" * where.count("/")

    def block(match: re.Match) -> str:
        name = match.group(2)
        if name not in tables:
            raise ValueError(f"{where}: table {name!r} is not in {TABLES.name}")
        return match.group(1) + render_table(name, tables[name], records, prefix) + match.group(4)

    return BLOCK.sub(block, text)


def machine_class(machine: dict) -> str:
    """``2-core AMD EPYC, AVX512-BF16``; ``NVIDIA H200`` for a GPU record; a record of several
    machines names them in ``class``."""
    if "class" in machine:
        return machine["class"]
    if "gpu" in machine:  # "NVIDIA H100 80GB HBM3 (one, ...)" -> "NVIDIA H100"
        named = re.match(r"NVIDIA \w+", machine["gpu"])
        return named.group(0) if named else machine["gpu"].split(" (")[0]
    tier = TIER_NAMES[cpu_tier(machine["cpu_flags"].split())]
    model = machine["cpu_model"]
    vendor = "AMD EPYC" if "EPYC" in model else "Intel Xeon" if "Xeon" in model else model
    return f"{machine['cores']}-core {vendor}, {tier}"


def commit_cell(record: dict) -> str:
    return f"{record['commit']} ({record['commit_note']})" if "commit_note" in record else (
        record["commit"])  # fmt: skip


def render_table(name: str, table: dict, records: dict[str, dict], link_prefix: str) -> str:
    """The Markdown of table ``name``: its columns, then the record's four."""
    header = [*table["columns"], *RECORD_COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table["rows"]:
        where = f"{TABLES.name}: table {name}, row of {row['record']}"
        if row["record"] not in records:
            raise ValueError(f"{where}: no benchmarks/records/{row['record']}.json")
        record = records[row["record"]]
        text = {key: value for key, value in record.items() if isinstance(value, str)}
        values = {**text, **record_values(record)}
        try:
            cells = [cell.format(**values) for cell in row["cells"]]
        except (KeyError, ValueError) as error:
            raise ValueError(f"{where}: {error!r} is not a value of that record (or its "
                             f"format does not fit it)") from None  # fmt: skip
        if len(cells) != len(table["columns"]):
            raise ValueError(f"{where}: {len(cells)} cells for {len(table['columns'])} "
                             f"columns")  # fmt: skip
        link = f"[{row['record']}]({link_prefix}benchmarks/records/{row['record']}.json)"
        runs = row.get("runs", record["runs"])  # a row showing one of a record's measurements
        cells += [machine_class(record["machine"]), str(runs), commit_cell(record), link]
        lines.append("| " + " | ".join(cells) + " |")
    note = table.get("note")
    return "\n".join(lines) + "\n" + (f"\n{' '.join(note.split())}\n" if note else "")


def load_tables(path: Path = TABLES) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def placed_tables(repo: Path = REPO) -> dict[str, list[str]]:
    """Each table name found in the documents, with the documents it is in."""
    found: dict[str, list[str]] = {}
    for path in documents(repo):
        for match in BLOCK.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(match.group(2), []).append(path.relative_to(repo).as_posix())
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 on a "
                        "table that differs from its rendering")  # fmt: skip
    args = parser.parse_args(argv)
    tables, records = load_tables(), load_records()
    changed = {}  # every document rendered before any is written: an error leaves them all
    for path in documents():
        text, name = path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix()
        try:
            rendered = render_text(text, name, tables, records)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if rendered != text:
            changed[path] = rendered
    differ = [path.relative_to(REPO).as_posix() for path in changed] if args.check else []
    for path, rendered in {} if args.check else changed.items():
        path.write_text(rendered, encoding="utf-8")
        print(f"rendered the tables of {path.relative_to(REPO).as_posix()}")
    for name in differ:
        print(f"{name}: a table differs from its records; run python benchmarks/render_tables.py",
              file=sys.stderr)  # fmt: skip
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
