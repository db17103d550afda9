"""The house's rules (docs/design.md, "Layout"), read from the package's own import statements:
no import circle between modules, and the rooms that must not know each other do not."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "transformer_nmt"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if p.stem != "__main__"}


def _imports(name: str) -> set[str]:
    """The package's modules that module ``name`` imports anywhere in its body (top level,
    inside functions, under TYPE_CHECKING): ``from a.b import c`` counts as ``a.b.c`` when c
    is a module, else as ``a.b``."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [
                f"{node.module}.{alias.name}"
                if f"{node.module}.{alias.name}" in MODULES
                else node.module
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _reaches(start: str, graph: dict[str, set[str]] = GRAPH) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _is_package_init(importer: str, imported: str) -> bool:
    # A package's __init__ re-exporting its own modules is not a circle: Python imports the
    # package before its modules anyway.
    return importer.startswith(imported + ".") or imported.startswith(importer + ".")


def test_the_graph_is_read_from_the_real_imports() -> None:
    assert "transformer_nmt.inference.engine" in GRAPH["transformer_nmt.inference.ct2"]
    assert "transformer_nmt.runs.checkpoints" in GRAPH["transformer_nmt.inference.translator"]
    assert "transformer_nmt.search" in GRAPH["transformer_nmt.inference.translator"]


def test_no_import_circle_between_modules() -> None:
    circles = sorted(
        f"{a} -> {b} -> ... -> {a}"
        for a in GRAPH
        for b in GRAPH[a]
        if a in _reaches(b) and not _is_package_init(a, b)
    )
    assert circles == []


# cli/ modules that are not a stage: the dispatcher and the shared argument groups
CLI_SHARED = {"transformer_nmt.cli", "transformer_nmt.cli.arguments"}


def test_no_module_of_the_package_is_over_500_lines() -> None:
    # one concern per file: a module that grows past this holds more than one
    long = {name: n for name, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_no_stage_cli_imports_another_stages_cli() -> None:
    """A stage's CLI module imports the library and ``cli/arguments.py``, never another
    stage's CLI module (what two stages share lives in the library or in ``arguments``)."""
    stages = [n for n in MODULES if n.startswith("transformer_nmt.cli.") and n not in CLI_SHARED]
    crossing = sorted(f"{a} -> {b}" for a in stages for b in GRAPH[a] if b in stages and b != a)
    assert crossing == []


def test_no_module_of_the_package_is_loaded_by_file_path() -> None:
    """Every dependency is an import the graph above sees: nothing loads a file by its path
    (``importlib.util.spec_from_file_location``, ``runpy``, ``exec``), which breaks where the
    package is installed without its checkout."""
    loaders = ("spec_from_file_location", "run_path", "SourceFileLoader")
    found = sorted(
        f"{name}: {word}"
        for name, path in MODULES.items()
        for word in loaders
        if word in path.read_text(encoding="utf-8")
    )
    assert found == []


def _rooms(prefix: str) -> list[str]:
    return [name for name in MODULES if name == prefix or name.startswith(prefix + ".")]


def test_inference_and_tracking_never_import_training_code() -> None:
    """design.md: inference never imports training code; tracking imports neither training nor
    inference code (directly or through another module)."""
    bad = []
    for room, forbidden in (
        ("transformer_nmt.inference", ("transformer_nmt.training",)),
        ("transformer_nmt.tracking", ("transformer_nmt.training", "transformer_nmt.inference")),
        ("transformer_nmt.runs", ("transformer_nmt.training", "transformer_nmt.inference")),
    ):
        for name in _rooms(room):
            bad += [f"{name} -> {m}" for m in sorted(_reaches(name)) if m.startswith(forbidden)]
    assert bad == []


def test_the_inference_wing_imports_no_lightning_in_a_fresh_interpreter() -> None:
    modules = [m for m in _rooms("transformer_nmt.inference") if not m.endswith("_mlflow_model")]
    code = (
        f"import sys, {', '.join(modules)}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'pytorch_lightning',"
        " 'sacrebleu', 'sacremoses'}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


BENCHMARKS = PACKAGE.parents[1] / "benchmarks"


def _benchmark_imports() -> dict[str, set[str]]:
    """Which of benchmarks/'s scripts each one imports (``benchmarks/`` is not a package: the
    scripts import their siblings by module name, at the top or inside functions)."""
    scripts = {p.stem: p for p in sorted(BENCHMARKS.glob("*.py"))}
    graph = {}
    for name, path in scripts.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
        graph[name] = {m for m in found if m in scripts and m != name}
    return graph


def test_no_import_circle_between_benchmark_scripts() -> None:
    graph = _benchmark_imports()
    assert "harness" in graph["bench_time_to_bleu"]  # the graph is read from real imports
    circles = sorted(
        f"{a} -> {b} -> ... -> {a}" for a in graph for b in graph[a] if a in _reaches(b, graph)
    )
    assert circles == []


# Module paths that moved before the first release: each name has one import path, its new
# home (CHANGELOG.md, "Removed", names both).
FORMER_PATHS = {
    "translation": "inference",
    "checkpoints": "runs.checkpoints",
    "metrics_history": "runs.metrics_history",
    "selection": "evaluation.selection",
    "ct2": "inference.ct2",
    "serving": "inference.serving",
}


def test_a_moved_module_has_no_alias_at_its_former_path() -> None:
    changelog = (PACKAGE.parents[1] / "CHANGELOG.md").read_text(encoding="utf-8")
    for old, new in FORMER_PATHS.items():
        assert f"transformer_nmt.{old}" not in MODULES, old
        assert f"transformer_nmt.{new}" in MODULES, new
        assert f"`transformer_nmt.{old}` | `transformer_nmt.{new}`" in changelog, old


def test_no_module_re_exports_another_modules_names() -> None:
    """One import path per name: a module other than a package's ``__init__`` imports the
    package's names to use them, never to pass them on (``__all__``, an import kept unused)."""
    found = [
        name
        for name, path in MODULES.items()
        if path.name != "__init__.py"
        and any(mark in path.read_text(encoding="utf-8") for mark in ("__all__ =", "noqa: F401"))
    ]
    assert found == []


def test_argparse_stays_in_the_cli() -> None:
    """The stages' arguments are the CLI's (``cli/arguments.py``): tracking parses no
    command line."""
    found = sorted(
        name
        for name in _rooms("transformer_nmt.tracking")
        for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8")))
        if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names)
    )
    assert found == []


# The rules that turn a config's "auto" values into this machine's (training/rules.py,
# preflight.size_max_tokens); ``accumulation`` and ``resolve`` apply them too.
RESOLVING = {
    "resolve", "resolve_accelerator", "resolve_devices", "resolve_precision", "precision_choice",
    "pad_multiple_choice", "accumulation", "size_max_tokens", "resolve_plan_precision",
}  # fmt: skip


RULE_MODULES = {
    "transformer_nmt.training.rules",
    "transformer_nmt.training.resolution",
    "transformer_nmt.training.preflight",
}


def _resolving_calls(name: str) -> list[tuple[str, str]]:
    """(enclosing function, called rule) for each call of a ``RESOLVING`` rule in ``name``:
    a name imported from ``RULE_MODULES``, or an attribute of such a module (``Path.resolve``
    is not one)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    rules, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in RULE_MODULES:
            rules.update(a.asname or a.name for a in node.names if a.name in RESOLVING)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.update(
                a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in RULE_MODULES
            )
        elif isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.name in RULE_MODULES and a.asname)
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Call):
                func = child.func
                if isinstance(func, ast.Name) and func.id in rules:
                    found.append((function, func.id))
                elif (
                    isinstance(func, ast.Attribute)
                    and func.attr in RESOLVING
                    and isinstance(func.value, ast.Name)
                    and func.value.id in modules
                ):
                    found.append((function, func.attr))
            visit(child, function)

    visit(tree, "<module>")
    return found


def test_a_run_resolves_its_auto_settings_once() -> None:
    """A training run resolves accelerator, devices, precision, pad multiple and
    ``max_tokens: auto`` in one place (``training.resolution.resolve_run``); the trainer, the data
    module, the module, the callbacks and the CLI read its ``Resolved`` record and call no
    rule again."""
    run_time = [
        name
        for name in MODULES
        if name.startswith(("transformer_nmt.training.", "transformer_nmt.data."))
        and name not in RULE_MODULES  # the rules themselves; the planner, for any machine
    ] + ["transformer_nmt.cli.train"]
    calls = {name: _resolving_calls(name) for name in run_time}
    resolving = _resolving_calls("transformer_nmt.training.resolution")
    assert ("resolve_run", "size_max_tokens") in resolving, "the graph should see the calls"
    elsewhere = sorted(
        (name, function, called) for name, found in calls.items() for function, called in found
    )
    assert elsewhere == []
