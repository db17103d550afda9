"""Shared pytest fixtures and marker handling."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def snakemake_command() -> list[str]:
    """How to start this interpreter's snakemake: its console script when it has one, else
    ``python -m snakemake`` (an environment whose packages sit on PYTHONPATH, as on the GPU
    machine of benchmarks/gpu_proof.sh, has no script beside its python)."""
    script = Path(sys.executable).with_name("snakemake")
    return [str(script)] if script.exists() else [sys.executable, "-m", "snakemake"]


def checkout_pythonpath() -> str:
    """PYTHONPATH for a subprocess that must run this checkout's package: its src/ first, then
    the caller's PYTHONPATH (where an environment keeps its packages there, as on the GPU
    machine of benchmarks/gpu_proof.sh, the subprocess still finds them)."""
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(p for p in (str(REPO_ROOT / "src"), inherited) if p)


def _shared_data_dir() -> Path:
    """The offline mirror of public datasets (``../shared/data`` beside the checkout)."""
    env = os.environ.get("TRANSFORMER_NMT_TEST_MIRROR")
    if env:
        return Path(env)
    return REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_mirror() -> Path:
    """Directory laid out as ``<mirror>/<dataset>/<filename>``; skips when it is absent."""
    mirror = _shared_data_dir()
    if not (mirror / "multi30k" / "SHA256SUMS").is_file():
        pytest.skip(f"dataset mirror not found at {mirror} (set TRANSFORMER_NMT_TEST_MIRROR)")
    return mirror


@pytest.fixture(scope="session")
def mlflow_store_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store, its schema migrated once per session (~3 s a store)."""
    from transformer_nmt.tracking.store import open_client

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    open_client(f"sqlite:///{path}")
    return path


@pytest.fixture()
def migrated_store(tmp_path: Path, mlflow_store_template: Path) -> str:
    """The URI of an empty, migrated MLflow store of this test's own (a copy of the template).
    A test of the store's creation (the migration, its lock) starts from no file instead."""
    path = tmp_path / "mlflow.db"
    shutil.copyfile(mlflow_store_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The reversal task of tests/training_helpers.py (a SentencePiece model and token arrays),
    built once per test process and shared by every file that trains on it: tests only read it
    (one that must change it works on a copy)."""
    from tests.training_helpers import reversal_corpus

    return reversal_corpus(tmp_path_factory.mktemp("corpus"))


@contextlib.contextmanager
def local_http_server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 (an ephemeral port) in a thread, stopped on exit; yields its
    base URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def wait_for_health(url: str, server: subprocess.Popen, log: Path, seconds: float) -> None:
    """Wait until ``url``/health answers 200 (an ``mlflow server``); fail with the tail of its
    ``log`` when the process exits or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        assert server.poll() is None and time.monotonic() < deadline, log.read_text(
            errors="replace"
        )[-3000:]
        time.sleep(1)


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to ``n`` for the block, then restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def one_torch_thread():
    """Tiny models on a shared 2-core machine: more threads only spin against each other."""
    with torch_threads(1):
        yield


@pytest.fixture
def two_torch_threads():
    """Two intra-op threads (the CI machine's cores), whatever the machine has."""
    with torch_threads(2):
        yield


# The files that take longest, longest first (``pytest --durations=0`` on one worker, summed
# per file): the Table 3 study's DAG, the smoke DAG with its re-runs, the SLURM cluster's DAG
# (where SLURM is installed), the search's equivalence checks, the tracking server with
# credentials, the DAGs of local data, signals and resumes, the loss's compiled and DDP checks,
# MLflow stores, the planner's sizing runs, the recipes.
LONGEST_FILES = ("test_table3_workflow.py", "test_workflow.py", "test_slurm.py", "test_search.py",
                 "test_tracking_auth.py", "test_local_data.py", "test_reliability.py",
                 "test_loss_normalisation.py", "test_tracking.py", "test_plan.py",
                 "test_recipes.py")  # fmt: skip


def _longest_rank(name: str) -> int:
    return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)


def one_compile_thread(environ: dict[str, str] | os._Environ[str]) -> int:
    """Inductor compiles in this process, without its pool of compile-worker processes, unless
    ``TORCHINDUCTOR_COMPILE_THREADS`` says otherwise: a run of the CUDA tests under pytest-xdist
    (a pool per worker) hung in that pool's shutdown on an H100 (benchmarks/log/2026-11-27.md),
    and one compile thread is PyTorch's way around the pool (``torch._inductor.config``'s
    ``decide_compile_threads``: "setting this to 1" disables async compiling; with it
    ``AsyncCompile.use_process_pool`` starts no pool). The variable is set for the stages a test
    starts, the config for this process; returns the threads."""
    import torch._inductor.config as inductor

    threads = int(environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1"))
    inductor.compile_threads = threads
    return threads


def pytest_configure(config: pytest.Config) -> None:
    # A pytest-xdist worker (``make test`` starts one per core) computes with one torch thread:
    # the workers already fill the cores, more threads only spin against each other.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The longest files first, then the other files with slow tests, each file kept whole and
    # in its order: under ``--dist loadfile`` they start at once and the short files fill the
    # cores behind them.
    slow_files = {item.path for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: (_longest_rank(item.path.name), item.path not in slow_files))
    if torch.cuda.is_available():
        if any("gpu" in item.keywords for item in items):
            one_compile_thread(os.environ)
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
