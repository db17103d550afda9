"""MLflow tracking: one run per experiment, stage params, superseding, concurrent writers."""

from __future__ import annotations

import argparse
import multiprocessing as mp
from pathlib import Path

import pytest

from transformer_nmt import tracking


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(uri: str, experiment: str):
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def test_tracking_uri_default_and_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert tracking.tracking_uri() == "http://mlflow.example:5000"


def test_cli_arguments_default_to_untracked() -> None:
    parser = argparse.ArgumentParser()
    tracking.add_cli_arguments(parser)
    args = parser.parse_args([])
    assert args.mlflow_experiment is None and args.mlflow_run is None
    args = parser.parse_args(["--mlflow-experiment", "multi30k_en-de", "--mlflow-run", "tiny"])
    assert (args.mlflow_experiment, args.mlflow_run) == ("multi30k_en-de", "tiny")


def test_untracked_stage_is_a_no_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with tracking.stage_run(None, None, "train", params={"a": 1}) as run:
        assert run is None
    assert not (tmp_path / "mlflow.db").exists()


def test_flatten_params_nests_with_dots() -> None:
    flat = tracking.flatten_params({"model": {"N": 6, "h": 8}, "betas": [0.9, 0.98], "x": None})
    assert flat == {"model.N": "6", "model.h": "8", "betas": "[0.9, 0.98]", "x": "null"}


def test_stages_share_one_run_with_prefixed_params(store: str, tmp_path: Path) -> None:
    artifact = tmp_path / "spm.model"
    artifact.write_bytes(b"vocab")
    with tracking.stage_run(
        "multi30k_en-de",
        "tiny",
        "spm",
        params={"vocab_size": 8000},
        tags={"data.spm_sha256": "abc"},
    ) as run:
        run.log_artifact(artifact)
        first_id = run.run_id
    with tracking.stage_run(
        "multi30k_en-de", "tiny", "train", params={"max_steps": 100, "model": {"N": 1}}
    ) as run:
        run.log_metrics({"train/loss": 5.0, "lr": 1e-4}, step=1)
        run.log_metrics({"train/loss": 4.0}, step=2)
        assert run.run_id == first_id

    (only,) = _runs(store, "multi30k_en-de")
    assert only.info.run_id == first_id
    assert only.info.run_name == "tiny"
    assert only.data.params == {
        "spm.vocab_size": "8000",
        "train.max_steps": "100",
        "train.model.N": "1",
    }
    tags = only.data.tags
    assert tags["data.spm_sha256"] == "abc"
    assert tags["stage.spm.status"] == "finished"
    assert tags["stage.train.status"] == "finished"
    assert only.info.status == "FINISHED"
    history = _client(store).get_metric_history(first_id, "train/loss")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
        (1, 5.0),
        (2, 4.0),
    ]
    artifacts = [f.path for f in _client(store).list_artifacts(first_id)]
    assert artifacts == ["spm.model"]
    # Artifacts of a SQLite store live beside the database, whatever the working directory.
    assert (Path(store[len("sqlite:///") :]).parent / "mlruns").is_dir()


def test_same_params_reuse_run_changed_params_supersede_it(store: str) -> None:
    with tracking.stage_run("pair", "exp", "prepare", params={"max_len": 250}) as run:
        prepared_id = run.run_id
    with tracking.stage_run("pair", "exp", "train", params={"max_steps": 100}) as run:
        assert run.run_id == prepared_id
    # A resumed training job logs the same params again: same run, no error.
    with tracking.stage_run("pair", "exp", "train", params={"max_steps": 100}) as run:
        assert run.run_id == prepared_id
    # A changed training value: a fresh run, carrying the prepare stage's params.
    with tracking.stage_run("pair", "exp", "train", params={"max_steps": 200}) as run:
        new_id = run.run_id
    assert new_id != prepared_id
    old, new = _runs(store, "pair")
    assert old.info.run_id == prepared_id and new.info.run_id == new_id
    assert old.data.tags[tracking.SUPERSEDED_BY_TAG] == new_id
    assert new.data.tags[tracking.SUPERSEDES_TAG] == prepared_id
    assert new.data.params == {"prepare.max_len": "250", "train.max_steps": "200"}
    assert old.data.params["train.max_steps"] == "100"
    # The next stage finds the newest, non-superseded run.
    with tracking.stage_run("pair", "exp", "average", params={"last": 5}) as run:
        assert run.run_id == new_id


def test_failed_stage_is_tagged_failed(store: str) -> None:
    with pytest.raises(RuntimeError, match="boom"), tracking.stage_run("p", "e", "train"):
        raise RuntimeError("boom")
    (run,) = _runs(store, "p")
    assert run.data.tags["stage.train.status"] == "failed"
    assert run.info.status == "FAILED"


def test_with_retry_retries_lock_errors_only() -> None:
    calls = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return 7

    assert tracking.with_retry(flaky) == 7
    assert len(calls) == 3

    def broken() -> None:
        calls.append(1)
        raise ValueError("no such table")

    calls.clear()
    with pytest.raises(ValueError, match="no such table"):
        tracking.with_retry(broken)
    assert len(calls) == 1


def _worker(uri: str, worker: int, n: int) -> None:
    import os

    os.environ["MLFLOW_TRACKING_URI"] = uri
    from transformer_nmt import tracking as tr

    with tr.stage_run("pair", "exp", f"job{worker}", params={"worker": worker}) as run:
        for step in range(n):
            run.log_metrics({f"job{worker}/value": float(step), "shared": float(worker)}, step)


def test_concurrent_processes_on_a_fresh_store(store: str) -> None:
    """Four jobs start at once on a fresh SQLite file: one run, no lost metric, no lock error."""
    workers, n = 4, 15
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(store, w, n)) for w in range(workers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
    assert [proc.exitcode for proc in procs] == [0] * workers

    (run,) = _runs(store, "pair")
    client = _client(store)
    for w in range(workers):
        assert run.data.params[f"job{w}.worker"] == str(w)
        history = client.get_metric_history(run.info.run_id, f"job{w}/value")
        assert sorted(m.step for m in history) == list(range(n))
    assert len(client.get_metric_history(run.info.run_id, "shared")) == workers * n


def test_shared_params_are_unprefixed_and_a_change_supersedes(store: str) -> None:
    shared = {"data": {"vocab_size": 8000, "clean": {"max_length": 250}}}
    with tracking.stage_run("p", "e", "train", {"max_steps": 5}, shared_params=shared) as run:
        first = run.run_id
    with tracking.stage_run("p", "e", "average", {"last": 2}) as run:
        assert run.run_id == first
    shared["data"]["vocab_size"] = 16000  # new data, same training settings
    with tracking.stage_run("p", "e", "train", {"max_steps": 5}, shared_params=shared) as run:
        second = run.run_id
    assert second != first
    old, new = _runs(store, "p")
    assert old.data.params["data.vocab_size"] == "8000"
    assert new.data.params == {
        "data.vocab_size": "16000", "data.clean.max_length": "250", "train.max_steps": "5",
        "average.last": "2",
    }  # fmt: skip
    assert "data.vocab_size: '8000' -> '16000'" in new.data.tags["mlflow.note.content"]
