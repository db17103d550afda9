"""The package installed as a user on a cluster's login node installs it: a wheel, not this
checkout. ``plan`` and ``check-config`` must read a WMT14 recipe from a directory outside the
checkout (the config schema and the dataset registry are package data; nothing is loaded by
file path)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with this package's wheel (built from a copy of the
    sources) and, through a path file, the test environment's dependencies; its python."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"  # the build writes build/ and *.egg-info: not into the checkout
    shutil.copytree(REPO_ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO_ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = (root / "dist").glob("transformer_nmt-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    # the dependencies (torch, snakemake, ...) from the test environment; a path line is not a
    # site directory, so the checkout's editable .pth there is never read
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    (site / "test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _run(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(python), *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )


def test_the_installed_package_plans_and_checks_a_wmt14_recipe_outside_the_checkout(
    installed: Path, tmp_path: Path
) -> None:
    where = _run(
        installed, tmp_path, "-c", "import transformer_nmt; print(transformer_nmt.__file__)"
    )
    assert where.returncode == 0, where.stderr[-2000:]
    assert Path(where.stdout.strip()).is_relative_to(installed.parent.parent), where.stdout
    recipe = tmp_path / "wmt14_en_de_base.yaml"  # the user's copy, away from the checkout
    shutil.copy(REPO_ROOT / "config" / "experiments" / "wmt14_en_de_base.yaml", recipe)
    plan = _run(installed, tmp_path, "-m", "transformer_nmt", "plan", "--configfile", str(recipe),
                "--estimate-only", "--gpus", "8", "--gpu-kind", "h100")  # fmt: skip
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "| wmt14_en_de_base | base (63.0M) |" in plan.stdout, plan.stdout[-3000:]
    assert "| 8 h100 x 1 " in plan.stdout, plan.stdout[-3000:]
    check = _run(installed, tmp_path, "-m", "transformer_nmt", "check-config", str(recipe))
    assert check.returncode == 0, check.stderr[-3000:]
    assert f"{recipe}: valid (1 experiment(s): wmt14_en_de_base)" in check.stdout
    # a bad value is caught by the packaged schema, in one line naming the key
    recipe.write_text(recipe.read_text().replace("beam: 4", "beam: 0"))
    bad = _run(installed, tmp_path, "-m", "transformer_nmt", "check-config", str(recipe))
    assert bad.returncode == 2 and "translate.beam: 0 is less than the minimum" in bad.stderr
