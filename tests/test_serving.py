"""The trained model as an MLflow model: register stage, pyfunc predict, model server."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from tests.test_translation import _results_layout, assets  # noqa: F401 (fixtures)
from transformer_nmt.cli import main
from transformer_nmt.errors import DataError
from transformer_nmt.inference.serving import source_sentences
from transformer_nmt.inference.translator import Translator
from transformer_nmt.search import SearchSettings

# Tiny models: one torch thread (conftest.one_torch_thread) for every test here.
pytestmark = pytest.mark.usefixtures("one_torch_thread")

SOURCES = ["ein mann läuft", "", "im park"]
SEARCH = ["--beam", "2", "--max-len-b", "5"]


@pytest.fixture(scope="module")
def registered(assets: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    """A finished run registered by the ``register`` stage into a fresh SQLite store."""
    root = tmp_path_factory.mktemp("serving")
    run_dir = _results_layout(assets, root / "results")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        argv = ["register", "--run-dir", str(run_dir), *SEARCH, "--out", str(root / "model.json"),
                "--mlflow-experiment", "toy_en-de", "--mlflow-run", "tiny"]  # fmt: skip
        assert main(argv) == 0
    record = json.loads((root / "model.json").read_text(encoding="utf-8"))
    expected = Translator(assets["model"], assets["spm"], SearchSettings(beam=2, max_len_b=5))
    return {"uri": uri, "record": record, "expected": expected.translate(SOURCES), "root": root}


def test_register_logs_a_pyfunc_that_translates(registered: dict, monkeypatch) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", registered["uri"])
    monkeypatch.setattr(sys, "path", [*sys.path])  # loading puts the model's code/ on it
    record = registered["record"]
    assert record["registered_name"] == "tiny" and record["version"] == 1
    assert record["registered_uri"] == "models:/tiny/1"
    model = mlflow.pyfunc.load_model(record["registered_uri"])
    assert model.predict(SOURCES) == registered["expected"]
    assert model.predict(pd.DataFrame({"text": SOURCES})) == registered["expected"]
    assert model.predict(SOURCES[0]) == registered["expected"][:1]

    client = MlflowClient(tracking_uri=registered["uri"])
    (run,) = client.search_runs([client.get_experiment_by_name("toy_en-de").experiment_id])
    assert run.data.params["register.beam"] == "2" and run.data.params["register.alpha"] == "0.6"
    assert run.data.tags["register.model_uri"] == "models:/tiny/1"
    version = client.get_model_version("tiny", "1")
    assert version.run_id == run.info.run_id


def test_source_sentences_accepts_the_pyfunc_inputs() -> None:
    assert source_sentences("ein mann") == ["ein mann"]
    assert source_sentences(["a", None]) == ["a", ""]
    assert source_sentences(pd.DataFrame({"x": ["a", "b"]})) == ["a", "b"]
    assert source_sentences(pd.DataFrame({"id": [1, 2], "text": ["a", float("nan")]})) == ["a", ""]
    with pytest.raises(DataError, match="expected a 'text' column"):
        source_sentences(pd.DataFrame({"a": ["x"], "b": ["y"]}))
    with pytest.raises(DataError, match="expected source sentences"):
        source_sentences([1, 2])


def test_register_needs_tracking_flags(assets: dict[str, Path], tmp_path: Path, capsys) -> None:  # noqa: F811
    run_dir = _results_layout(assets, tmp_path / "results")
    assert main(["register", "--run-dir", str(run_dir)]) == 2
    assert "give --mlflow-experiment and --mlflow-run" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_mlflow_models_serve_answers_translation_requests(registered: dict) -> None:
    mlflow_cli = shutil.which("mlflow", path=str(Path(sys.executable).parent))
    if mlflow_cli is None:
        pytest.skip("the mlflow command is not installed beside this Python")
    # the scoring server's own dependencies (an optional part of mlflow): skip only without them
    for module in ("fastapi", "uvicorn"):
        pytest.importorskip(module, reason=f"mlflow models serve needs {module}, not installed")
    port = _free_port()
    # the server runs `uvicorn` by name: this Python's scripts first, as in an activated venv
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "MLFLOW_TRACKING_URI": registered["uri"], "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(sys.path), "PATH": path}  # fmt: skip
    log = registered["root"] / "serve.log"
    cmd = [mlflow_cli, "models", "serve", "-m", "models:/tiny/1", "--env-manager", "local",
           "-h", "127.0.0.1", "-p", str(port)]  # fmt: skip
    with open(log, "w") as handle:
        server = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:  # its dependencies are here: a crash is a failure
                pytest.fail(f"mlflow models serve exited ({server.returncode}): {log.read_text()}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    pytest.fail(f"the model server did not answer in 120 s: {log.read_text()}")
                time.sleep(0.5)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            data=json.dumps({"inputs": SOURCES}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert json.loads(response.read()) == {"predictions": registered["expected"]}
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
