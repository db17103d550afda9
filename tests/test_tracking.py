"""MLflow tracking: one run per experiment, stage params, superseding, concurrent writers."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import warnings
from pathlib import Path

import pytest

from transformer_nmt import tracking
from transformer_nmt.cli.arguments import add_tracking_arguments, tracking_run_dir


@pytest.fixture()
def store(migrated_store: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", migrated_store)
    return migrated_store


@pytest.fixture()
def fresh_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """No database file yet: the first client creates and migrates it."""
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
    add_tracking_arguments(parser)
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


def test_a_changed_mutable_param_is_a_new_tag_value_in_the_same_run(store: str) -> None:
    """The batch geometry of a resumed training (max_tokens after an out-of-memory error, fewer
    GPUs) changes within one run: tags, which MLflow lets change, and no supersession."""
    params = {"max_steps": 100}
    with tracking.stage_run(
        "pair", "exp", "train", params, mutable_params={"max_tokens": "auto", "devices": 8}
    ) as run:
        first = run.run_id
    with tracking.stage_run(
        "pair", "exp", "train", params, mutable_params={"max_tokens": 2048, "devices": 1}
    ) as run:
        assert run.run_id == first
    (only,) = _runs(store, "pair")
    assert only.data.params == {"train.max_steps": "100"}
    assert (only.data.tags["train.max_tokens"], only.data.tags["train.devices"]) == ("2048", "1")
    assert tracking.SUPERSEDED_BY_TAG not in only.data.tags


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


def test_concurrent_processes_on_a_fresh_store(fresh_store: str) -> None:
    """Four jobs start at once on a fresh SQLite file: one run, no lost metric, no lock error."""
    store = fresh_store
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


# --- the run directory identifies the run ----------------------------------------------------


def _record(run_dir: Path) -> dict:
    import json

    return json.loads((run_dir / tracking.RUN_RECORD).read_text(encoding="utf-8"))


def test_the_run_directory_identifies_the_run(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two checkouts on one store with the same experiment names: two runs, each stage of a
    checkout logs into its own; a forced re-run and a directory made anew get fresh runs."""
    import shutil

    a = tmp_path / "checkout_a" / "results" / "runs" / "exp"
    b = tmp_path / "checkout_b" / "results" / "runs" / "exp"
    ids = {}
    for name, run_dir in (("a", a), ("b", b)):
        with tracking.stage_run("pair", "exp", "train", {"max_steps": 5}, run_dir=run_dir) as run:
            ids[name] = run.run_id
    assert ids["a"] != ids["b"]
    for name, run_dir in (("a", a), ("b", b)):
        assert _record(run_dir) == {
            "tracking_uri": store, "experiment": "pair", "run_name": "exp",
            "experiment_id": _client(store).get_experiment_by_name("pair").experiment_id,
            "run_id": ids[name],
        }  # fmt: skip
        run = _client(store).get_run(ids[name])
        assert run.data.tags[tracking.RUN_DIR_TAG] == str(run_dir.resolve())
        assert tracking.SUPERSEDED_BY_TAG not in run.data.tags
        # a later stage of the same checkout (here from another working directory) finds it
        monkeypatch.chdir(tmp_path)
        with tracking.stage_run("pair", "exp", "average", {"last": 2}, run_dir=run_dir) as run:
            assert run.run_id == ids[name]

    # A forced re-run in checkout a: a fresh run there, which the next stages follow.
    with tracking.stage_run(
        "pair", "exp", "train", {"max_steps": 5}, new_run_reason="forced", run_dir=a
    ) as run:
        forced = run.run_id
    assert forced not in ids.values() and _record(a)["run_id"] == forced
    assert _client(store).get_run(ids["a"]).data.tags[tracking.SUPERSEDED_BY_TAG] == forced
    # the new run carries the other stages' params, and its directory
    assert _client(store).get_run(forced).data.params["average.last"] == "2"
    assert _client(store).get_run(forced).data.tags[tracking.RUN_DIR_TAG] == str(a.resolve())
    with tracking.stage_run("pair", "exp", "translate.t", {"beam": 4}, run_dir=a) as run:
        assert run.run_id == forced
    assert tracking.SUPERSEDED_BY_TAG not in _client(store).get_run(ids["b"]).data.tags

    # Checkout b's run directory deleted and made anew: a fresh run, superseding the old one
    # (its points would otherwise mix with the new training's).
    shutil.rmtree(b)
    with tracking.stage_run(  # a reason to start over changes nothing for a fresh run
        "pair", "exp", "train", {"max_steps": 5}, new_run_reason="other settings", run_dir=b
    ) as run:
        anew = run.run_id
    assert anew not in (*ids.values(), forced)
    old = _client(store).get_run(ids["b"])
    assert old.data.tags[tracking.SUPERSEDED_BY_TAG] == anew
    assert "was made anew" in _client(store).get_run(anew).data.tags["mlflow.note.content"]
    assert _client(store).get_run(anew).data.params == {"train.max_steps": "5"}  # nothing copied
    assert len(_runs(store, "pair")) == 4

    # Another store: the record (of the first store) is not followed; a run is made there.
    other = f"sqlite:///{tmp_path / 'other.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other)
    with tracking.stage_run("pair", "exp", "average", {"last": 2}, run_dir=a) as run:
        assert run.run_id not in (*ids.values(), forced, anew)
    assert _record(a)["tracking_uri"] == other


def test_tracking_run_dir_takes_the_flag_or_the_stages_own_directory(tmp_path: Path) -> None:
    from transformer_nmt.errors import ConfigError

    parser = argparse.ArgumentParser()
    add_tracking_arguments(parser)
    run = tmp_path / "runs" / "e"
    assert tracking_run_dir(parser.parse_args([])) is None
    assert tracking_run_dir(parser.parse_args([]), run) == run
    flagged = parser.parse_args(["--mlflow-run-dir", str(run)])
    assert tracking_run_dir(flagged) == run
    assert tracking_run_dir(flagged, tmp_path / "runs" / ".." / "runs" / "e") == run
    with pytest.raises(ConfigError, match="--mlflow-run-dir .* is not --run-dir"):
        tracking_run_dir(flagged, tmp_path / "elsewhere")


# --- the training logger: one point per step, a failing store ----------------------------------


def test_a_resumed_attempt_logs_no_second_point_for_a_step(store: str, tmp_path: Path) -> None:
    from transformer_nmt.training.callbacks import StageRunLogger

    # MLflow itself keeps both points of a step logged twice: the reason for the logger's check
    with tracking.stage_run("pair", "exp", "probe", run_dir=tmp_path / "probe") as run:
        run.log_metrics({"x": 1.0}, step=3)
        run.log_metrics({"x": 2.0}, step=3)
        assert len(_client(store).get_metric_history(run.run_id, "x")) == 2

    with tracking.stage_run("pair", "exp", "train", run_dir=tmp_path / "run") as run:
        killed = StageRunLogger(run)  # logged updates 1..8, its last checkpoint was at 5
        for step in range(8):
            killed.log_metrics({"train/loss": 10.0 - step}, step=step)
        resumed = StageRunLogger(run)  # resumed from step 5: updates 6..12
        for step in range(5, 12):
            resumed.log_metrics({"train/loss": 100.0 + step, "val/loss": 1.0}, step=step)
        history = _client(store).get_metric_history(run.run_id, "train/loss")
        val = _client(store).get_metric_history(run.run_id, "val/loss")
    points = sorted((m.step, m.value) for m in history)
    assert [s for s, _ in points] == list(range(1, 13))
    assert points[7] == (8, 3.0) and points[8] == (9, 108.0)  # the first attempt's point stands
    assert sorted(m.step for m in val) == list(range(6, 13))
    assert resumed.points_lost == 0


@pytest.mark.parametrize("error", ["disk", "lock"])
def test_a_failing_store_is_one_notice_and_a_count(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    import errno
    import os
    import sqlite3

    from transformer_nmt.training.callbacks import StageRunLogger

    monkeypatch.setattr(tracking.store, "_RETRY_TOTAL_S", 0.2)  # a store locked past the retries
    monkeypatch.setattr(tracking.stage, "_noticed", set())
    notices = tmp_path / "terminal.txt"
    fd = os.open(notices, os.O_WRONLY | os.O_CREAT)
    monkeypatch.setenv(tracking.NOTICE_FD_ENV, str(fd))
    failure = (
        OSError(errno.ENOSPC, "No space left on device")
        if error == "disk"
        else sqlite3.OperationalError("database is locked")
    )
    with tracking.stage_run("pair", "exp", "train", run_dir=tmp_path / "run") as run:
        logger = StageRunLogger(run)
        logger.log_metrics({"train/loss": 5.0}, step=0)  # a healthy store
        healthy = run.client.log_batch
        calls: list[bool] = []
        original = run.log_metrics

        def spy(metrics, step=None, *, retry=True):
            calls.append(retry)
            return original(metrics, step, retry=retry)

        def broken(*args, **kwargs):
            raise failure

        monkeypatch.setattr(run, "log_metrics", spy)
        monkeypatch.setattr(run.client, "log_batch", broken)
        logger.log_metrics({"train/loss": 4.0, "train/lr": 1e-3}, step=1)
        logger.log_metrics({"train/loss": 3.0}, step=2)
        logger.log_metrics({"val/loss": 3.5}, step=2)  # a new key: its history is read first
        monkeypatch.setattr(run.client, "log_batch", healthy)  # the store is back
        logger.log_metrics({"train/loss": 2.0}, step=3)
        logger.log_metrics({"train/loss": 1.0}, step=4)
    os.close(fd)
    # the first failure retries (for a lock), later ones are tried once, until one succeeds
    assert calls == [True, False, False, False, True]
    assert logger.points_lost == 4
    (line,) = notices.read_text().splitlines()
    assert line.startswith("transformer_nmt: WARNING: MLflow: could not log 2 metric point(s)")
    assert type(failure).__name__ in line and "mlflow_points_lost" in line
    history = _client(store).get_metric_history(run.run_id, "train/loss")
    assert sorted(m.step for m in history) == [1, 4, 5]
    assert run.client.get_run(run.run_id).info.status == "FINISHED"


def _mounts(tmp_path: Path, *entries: tuple[str, str], name: str = "mounts") -> Path:
    """A /proc/mounts-format table of (mount point, type) entries."""
    path = tmp_path / name
    lines = [f"dev{i} {point.replace(' ', chr(92) + '040')} {kind} rw 0 0"
             for i, (point, kind) in enumerate(entries)]  # fmt: skip
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_the_filesystem_of_a_path_is_that_of_its_longest_mount_point(tmp_path: Path) -> None:
    from transformer_nmt.tracking.store import filesystem_type

    mounts = _mounts(
        tmp_path, ("/", "ext4"), ("/home", "nfs4"), ("/home/u/local disk", "xfs"), ("/ho", "tmpfs")
    )
    assert filesystem_type(Path("/home/u/mlflow.db"), mounts) == "nfs4"
    assert filesystem_type(Path("/home/u/local disk/mlflow.db"), mounts) == "xfs"
    assert filesystem_type(Path("/homework/mlflow.db"), mounts) == "ext4"  # not under /home
    assert filesystem_type(Path("/home"), mounts) == "nfs4"
    assert filesystem_type(Path("/x"), tmp_path / "no-such-table") is None


def test_sqlite_on_a_network_filesystem_is_warned_of_once_per_job(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from transformer_nmt.tracking.store import sqlite_on_network_filesystem

    on_lustre = _mounts(tmp_path, ("/", "ext4"), (str(tmp_path), "lustre"))
    on_ext4 = _mounts(tmp_path, ("/", "ext4"), name="mounts-ext4")
    warning = sqlite_on_network_filesystem(store, on_lustre)
    assert warning is not None
    assert str(tmp_path / "mlflow.db") in warning and "(lustre)" in warning
    assert "tracking_uri" in warning
    assert sqlite_on_network_filesystem(store, on_ext4) is None
    assert sqlite_on_network_filesystem("http://127.0.0.1:5000", on_lustre) is None

    monkeypatch.setattr(
        tracking.stage, "sqlite_on_network_filesystem",
        lambda uri: sqlite_on_network_filesystem(uri, on_lustre),
    )  # fmt: skip
    monkeypatch.setattr(tracking.stage, "_noticed", set())
    terminal = tmp_path / "terminal.txt"
    fd = os.open(terminal, os.O_WRONLY | os.O_CREAT)
    monkeypatch.setenv(tracking.NOTICE_FD_ENV, str(fd))
    for stage in ("train", "average"):
        with tracking.stage_run("pair", "exp", stage, run_dir=tmp_path / "run"):
            pass
    os.close(fd)
    (line,) = terminal.read_text().splitlines()
    assert line == f"transformer_nmt: WARNING: {warning}"


_REGISTRY = """
toy:
  description: a toy corpus
  files:
    train.tgz: {url: https://example.org/toy/train.tgz, sha256: %(train)s}
    dev.en: {url: https://example.org/toy/dev.en, sha256: null}
    dev.de: {url: https://example.org/toy/dev.de, sha256: null}
  pairs:
    en-de:
      splits:
        train:
          - name: toy_train
            en: {file: train.tgz, member: t/train.en, format: text}
            de: {file: train.tgz, member: t/train.de, format: text}
        valid:
          - name: toy_dev
            en: {file: dev.en, member: null, format: text}
            de: {file: dev.de, member: null, format: text}
  test_splits: []
"""


def test_a_runs_raw_corpus_files_are_its_mlflow_dataset_inputs(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    train_sum, dev_en, dev_de = "a" * 64, "b" * 64, "c" * 64
    registry = tmp_path / "datasets.yaml"
    registry.write_text(_REGISTRY % {"train": train_sum}, encoding="utf-8")
    raw = tmp_path / "resources" / "toy"  # the sums the registry leaves null: the lock file's
    raw.mkdir(parents=True)
    (raw / "checksums.lock.json").write_text(json.dumps({"dev.en": dev_en, "dev.de": dev_de}))
    report = tmp_path / "clean_report.json"
    report.write_text(json.dumps({"dataset": "toy", "pair": "en-de", "splits": {}}))
    monkeypatch.setenv("TRANSFORMER_NMT_REGISTRY", str(registry))
    monkeypatch.delenv("TRANSFORMER_NMT_MIRROR", raising=False)
    contexts = {"train": "training", "valid": "validation"}
    inputs = tracking.data_inputs(report, contexts, raw_root=tmp_path / "resources")
    with tracking.stage_run("toy_en-de", "demo", "train") as run:
        run.log_data_inputs(inputs)

    client = _client(store)
    (found,) = _runs(store, "toy_en-de")
    logged = client.get_run(found.info.run_id).inputs.dataset_inputs
    seen = {}
    for item in logged:
        tags = {t.key: t.value for t in item.tags}
        ds = item.dataset
        seen[ds.name] = (json.loads(ds.source), ds.source_type, ds.digest, tags)
    assert set(seen) == {"toy/train.tgz", "toy/dev.en", "toy/dev.de"}  # one per file
    source, source_type, digest, tags = seen["toy/train.tgz"]
    assert source == {"url": "https://example.org/toy/train.tgz"} and source_type == "http"
    assert digest == train_sum[:36] and tags["transformer_nmt.sha256"] == train_sum
    assert tags["mlflow.data.context"] == "training"
    assert seen["toy/dev.de"][2] == dev_de[:36]
    assert seen["toy/dev.de"][3]["mlflow.data.context"] == "validation"

    # With a mirror the source is the file's place in it.
    mirror = tmp_path / "mirror"
    monkeypatch.setenv("TRANSFORMER_NMT_MIRROR", str(mirror))
    (test,) = tracking.data_inputs(report, {"train": "test"}, raw_root=tmp_path / "resources")
    assert test.source == str(mirror / "toy" / "train.tgz") and test.context == "test"
    with warnings.catch_warnings():  # MLflow's "can be interpreted in multiple ways" is not shown
        warnings.filterwarnings("error", "The specified dataset source")
        with tracking.stage_run("toy_mirrored", "demo", "score") as run:  # (a new experiment:
            run.log_data_inputs([test])  # MLflow keeps one source per dataset name and digest)
    logged = client.get_run(run.run_id).inputs.dataset_inputs
    local = [item.dataset for item in logged if item.dataset.source_type != "http"]
    assert [json.loads(ds.source)["uri"] for ds in local] == [test.source]


# --- what the MLflow UI shows: source, user, description -------------------------------------


def test_the_runs_description_says_how_to_rerun_it_and_source_user_commit_are_set(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import getpass

    command = "snakemake --cores all --configfile config/experiments/x.yaml --config seed=2"
    monkeypatch.setenv(tracking.RERUN_ENV, command)
    shared = {"data": {"vocab_size": 8000}}
    with tracking.stage_run("p", "e", "train", {"max_steps": 5}, shared_params=shared):
        pass
    with tracking.stage_run("p", "e", "average", {"last": 2}):
        pass
    (run,) = _runs(store, "p")
    tags = run.data.tags
    commit = tracking.git_commit()
    assert commit and tags["mlflow.source.git.commit"] == commit
    assert tags["mlflow.note.content"].count("Re-run this experiment") == 1  # not per stage
    assert f"    git checkout {commit}\n    {command}" in tags["mlflow.note.content"]
    assert tags["mlflow.source.name"].endswith("/Snakefile")
    assert tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.user"] == getpass.getuser()

    # a superseded run's note stays above the re-run block
    shared["data"]["vocab_size"] = 16000
    with tracking.stage_run("p", "e", "train", {"max_steps": 5}, shared_params=shared):
        pass
    new = _runs(store, "p")[-1].data.tags["mlflow.note.content"]
    assert new.startswith("Supersedes run") and new.count("Re-run this experiment") == 1
    assert new.index("Supersedes run") < new.index(command)

    # by hand (no Snakefile): the stage's own command line
    monkeypatch.delenv(tracking.RERUN_ENV)
    monkeypatch.setattr("sys.argv", ["x", "average", "--last", "2"])
    with tracking.stage_run("p", "by_hand", "average", {"last": 2}):
        pass
    tags = _runs(store, "p")[-1].data.tags
    assert "python -m transformer_nmt average --last 2" in tags["mlflow.note.content"]
    assert tags["mlflow.source.name"] == "python -m transformer_nmt average"


def test_experiments_are_model_training_and_ui_prints_the_links_to_their_runs(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformer_nmt.cli import main

    client = _client(store)
    old = client.create_experiment("made_before")  # an experiment of an older checkout
    with tracking.stage_run("multi30k_en-de", "e", "train", {"max_steps": 5}):
        pass
    with tracking.stage_run("made_before", "e", "train", {"max_steps": 5}):
        pass
    new = client.get_experiment_by_name("multi30k_en-de")
    for experiment in (new, client.get_experiment(old)):
        kind = client.get_experiment(experiment.experiment_id).tags["mlflow.experimentKind"]
        assert kind == "custom_model_development"

    assert main(["ui", "--links-only", "--port", "5055"]) == 0
    out = capsys.readouterr().out
    assert f"MLflow store: {store}" in out
    link = f"http://127.0.0.1:5055/#/experiments/{new.experiment_id}?workflowType=machine_learning"
    assert f"  multi30k_en-de: {link}" in out
    assert f"/#/experiments/{old}?workflowType=machine_learning" in out
    assert "Default" not in out


def test_system_metrics_are_mlflows_own_while_the_block_runs_and_off_by_the_switch(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    monkeypatch.delenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", raising=False)
    with tracking.stage_run("p", "e", "train", {"max_steps": 5}) as run:
        pass  # the run is FINISHED now, as a resumed training's run is when it starts
    with (
        tracking.stage_run("p", "e", "train", {"max_steps": 5}) as run,
        tracking.system_metrics(run, interval_s=0.2),
    ):
        # work (so that the CPU samples are not all 0) until two samples are logged: on a busy
        # machine the monitor's thread may take longer than its interval
        client, key = _client(store), "system/cpu_utilization_percentage"
        give_up = time.monotonic() + 60
        while len(client.get_metric_history(run.run_id, key)) < 2 and time.monotonic() < give_up:
            busy_until = time.monotonic() + 0.2
            while time.monotonic() < busy_until:
                sum(range(10_000))
    assert client.get_run(run.run_id).data.metrics["system/system_memory_usage_megabytes"] > 0
    history = client.get_metric_history(run.run_id, key)
    assert len(history) >= 2 and sorted(m.step for m in history)[:2] == [0, 1]
    assert max(m.value for m in history) > 0
    assert client.get_run(run.run_id).info.status == "FINISHED"

    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
    with (
        tracking.stage_run("p", "quiet", "train", {"max_steps": 5}) as quiet,
        tracking.system_metrics(quiet, interval_s=0.2),
    ):
        time.sleep(0.5)
    assert not any(k.startswith("system/") for k in client.get_run(quiet.run_id).data.metrics)
