"""The repository's own promises: CI runs the README's test command, the environment matches."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.conftest import REPO_ROOT


def _readme_test_command() -> str:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Tests\s*$(.*?)(?=^## )", readme + "\n## ", re.M | re.S)
    assert section, "README.md has no '## Tests' section"
    block = re.search(r"```(?:bash|sh|console)?\n(.*?)```", section.group(1), re.S)
    assert block, "README.md's Tests section has no fenced command"
    lines = [ln.strip() for ln in block.group(1).splitlines() if ln.strip()]
    return lines[0]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    last_command = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.startswith("#")][
        -1
    ]
    assert last_command == _readme_test_command()


def test_environment_yml_installs_every_runtime_dependency() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text(encoding="utf-8"))
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0].lower() for r in requirements}

    assert names(pyproject["project"]["dependencies"]) <= names(pip_section)


def test_one_torch_version_everywhere() -> None:
    """docs/running.md (the install by hand), Makefile (what `make run` installs) and
    environment.yml pin the same torch."""
    pins = {
        name: set(re.findall(r"torch==([\w.+]+)", (REPO_ROOT / name).read_text(encoding="utf-8")))
        for name in ("docs/running.md", "Makefile", "environment.yml")
    }
    (version,) = pins["Makefile"]
    assert pins == {name: {version} for name in pins}


def test_license_file_matches_pyproject() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["license"] == "MIT"
    assert (REPO_ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License\n")


def test_config_readme_explains_every_key_of_the_schema() -> None:
    schema = yaml.safe_load((REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    doc = (REPO_ROOT / "config" / "README.md").read_text(encoding="utf-8")
    keys = set(schema["properties"])
    for name in ("train", "experiment", "model_overrides", "data_pair"):
        keys |= set(schema["$defs"][name]["properties"])
    missing = sorted(k for k in keys if f"`{k}`" not in doc)
    assert not missing, f"config/README.md does not explain {missing}"


# The history of the product's making (tracker numbers, development sessions) belongs in git
# and CHANGELOG.md, not in the product.
HISTORY = re.compile(
    r"\bissues? #?[0-9]+|the issue'?s\b|\b(this|last|next|previous|earlier) session\b", re.I
)
PRODUCT = ["README.md", "docs", "config", "src", "workflow", "Snakefile", "tests", "Makefile"]


def test_product_files_state_goals_and_results_not_their_history() -> None:
    roots = [REPO_ROOT / name for name in PRODUCT]
    files = [p for root in roots for p in ([root] if root.is_file() else sorted(root.rglob("*")))]
    files += sorted((REPO_ROOT / "benchmarks").glob("*.py"))
    hits = []
    for path in files:
        if not path.is_file() or any(
            part == "__pycache__" or part.endswith(".egg-info") for part in path.parts
        ):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()[:80]}")
    assert not hits, "history in the product:\n" + "\n".join(hits)


KINDS = ["Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"]


def test_changelog_keeps_one_heading_per_kind_and_its_top_release_is_the_version() -> None:
    """CHANGELOG.md in Keep a Changelog form: ``## [Unreleased]``, then one ``## [version] -
    YYYY-MM-DD`` per release, newest first; under each, at most one heading per kind, in
    Keep a Changelog's order. The newest release is pyproject's version and the package's."""
    import transformer_nmt

    text = (REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.split(r"^## ", text, flags=re.M)[1:]
    titles = [release.splitlines()[0] for release in releases]
    assert titles[0] == "[Unreleased]", titles
    for title in titles[1:]:
        assert re.fullmatch(r"\[\d+\.\d+\.\d+\] - \d{4}-\d{2}-\d{2}", title), title
    for title, release in zip(titles, releases, strict=True):
        kinds = re.findall(r"^### (.*)$", release, flags=re.M)
        assert set(kinds) <= set(KINDS), (title, kinds)
        assert kinds == sorted(set(kinds), key=KINDS.index), (title, kinds)
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    version = pyproject["project"]["version"]
    assert titles[1].startswith(f"[{version}] - ")
    assert transformer_nmt.__version__ == version


def test_make_test_gpu_runs_the_gpu_tests_alone_in_one_process_with_a_time_limit() -> None:
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    # --no-print-directory: under `make test` this make is a sub-make, which would announce
    # the directory it enters
    dry = subprocess.run(["make", "--no-print-directory", "-n", "test-gpu", "GPU_TEST_LIMIT=77"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                         check=True)  # fmt: skip
    words = " ".join(dry.stdout.replace("\\\n", " ").split())
    assert words.startswith("TORCHINDUCTOR_COMPILE_THREADS=1 timeout ")
    assert " 77 python -m pytest " in words
    options = words[words.index("python -m pytest") :].split()[3:]
    assert {"-p", "no:xdist"} <= set(options) and "-n" not in options
    assert options[options.index("-m") + 1] == "gpu"
    assert "pip install" not in dry.stdout  # no install step: a GPU machine's own python runs it


def test_a_run_with_gpu_tests_on_cuda_compiles_with_one_inductor_thread(monkeypatch) -> None:
    import torch._inductor.config as inductor

    from tests import conftest

    monkeypatch.setattr(inductor, "compile_threads", inductor.compile_threads)
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    monkeypatch.setattr(conftest.torch.cuda, "is_available", lambda: True)

    def items(*marks: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(path=Path(f"test_{m}.py"), keywords={m: 1}) for m in marks]

    conftest.pytest_collection_modifyitems(None, items("slow"))  # no gpu test: pool as it was
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ and inductor.compile_threads != 1
    conftest.pytest_collection_modifyitems(None, items("slow", "gpu"))
    assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "1" and inductor.compile_threads == 1
    # a user's own setting stays
    assert conftest.one_compile_thread({"TORCHINDUCTOR_COMPILE_THREADS": "3"}) == 3
    assert inductor.compile_threads == 3
