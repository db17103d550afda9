"""An authenticated tracking server (docs/cluster.md, "MLflow on a cluster"): MLflow's basic-auth
app with ``default_permission = NO_PERMISSIONS`` and its host check on, on 127.0.0.1. Tracked
stages reach it with credentials from the environment or ``~/.mlflow/credentials`` (mode 0600);
a request without them, or with wrong ones, is refused (HTTP 401) and changes nothing; a stage
without them fails before its work with one line naming the variables; the credentials are in no
log file, param or tag. A tracking URI carrying a password is refused. The server tests are
skipped only where the auth app's dependency (Flask-WTF: ``pip install 'mlflow[auth]'``) is
absent."""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from tests.conftest import REPO_ROOT, checkout_pythonpath, wait_for_health
from tests.training_helpers import MODEL, reversal_corpus
from transformer_nmt import tracking
from transformer_nmt.cli import main
from transformer_nmt.errors import ConfigError, UserFacingError

EXPERIMENT, RUN = "toy_en-de", "tiny"
TEST_SET = "test_toy"
TRAIN = {
    "max_steps": 4, "max_tokens": 64, "tokens_per_update": 64, "warmup": 10,
    "accelerator": "cpu", "devices": 1, "checkpoint_every_steps": 2, "keep_checkpoints": 2,
    "val_every_steps": 10, "log_every_steps": 2, "seed": 3,
}  # fmt: skip
_CREDENTIAL_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


# -- no server: a tracking URI with a password, an open credentials file -------------------------


def test_a_tracking_uri_carrying_a_password_is_refused_without_repeating_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://nmt:s3cr3t-pw@login-node:5000")
    with pytest.raises(ConfigError) as err:
        tracking.tracking_uri()
    message = str(err.value)
    assert "s3cr3t-pw" not in message and "http://nmt:***@login-node:5000" in message
    assert "MLFLOW_TRACKING_USERNAME" in message and "MLFLOW_TRACKING_PASSWORD" in message
    # a stage given it stops before its work, in one line that does not repeat the password
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("a b c\n", encoding="utf-8")
    out = tmp_path / f"{TEST_SET}.scores.json"
    argv = ["score", "--hyp", str(hyp), "--ref", str(hyp), "--tgt-lang", "de", "--out", str(out)]
    assert main([*argv, "--mlflow-experiment", EXPERIMENT, "--mlflow-run", RUN]) == 2
    captured = capsys.readouterr()
    assert "s3cr3t-pw" not in captured.out + captured.err
    assert [ln for ln in captured.err.splitlines() if ln.startswith("error:")] == [
        f"error: {message}"
    ]
    assert not out.exists()
    # a database URI's password is refused too; one without a password passes
    with pytest.raises(ConfigError, match=r"pgpass") as err:
        tracking.store.check_uri("postgresql://mlflow:db-pw@db/mlflow")
    assert "db-pw" not in str(err.value)
    for uri in ("http://login-node:5000", "https://nmt@mlflow.example", "sqlite:////a/b@c.db"):
        assert tracking.store.check_uri(uri) == uri


def test_a_config_tracking_uri_carrying_a_password_stops_the_pipeline_before_any_job() -> None:
    import yaml

    from transformer_nmt.experiments import Pipeline
    from transformer_nmt.experiments.paths import config_error_line

    config = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text(encoding="utf-8"))
    Pipeline({**config, "tracking_uri": "http://login-node:5000"})
    with pytest.raises(ConfigError, match=r"^tracking_uri: http://nmt:\*\*\*@login-node") as err:
        Pipeline({**config, "tracking_uri": "http://nmt:pw-1@login-node:5000"})
    assert "pw-1" not in config_error_line(err.value)


def test_a_credentials_file_open_to_others_is_refused_before_any_request(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    credentials = tmp_path / ".mlflow" / "credentials"
    credentials.parent.mkdir()
    credentials.write_text("[mlflow]\nmlflow_tracking_username = nmt\n", encoding="utf-8")
    credentials.chmod(0o644)
    # port 9 (discard) has no server: a request would fail otherwise, not with this message
    with pytest.raises(UserFacingError, match=r"open to others \(mode 644\): chmod 600"):
        tracking.check_access("http://127.0.0.1:9", EXPERIMENT)
    tracking.check_access(f"sqlite:///{tmp_path / 'mlflow.db'}", EXPERIMENT)  # no server: no-op


# -- an MLflow server with its basic-auth app ------------------------------------------------------


def _call(
    url: str,
    path: str,
    body: dict[str, Any] | None = None,
    auth: tuple[str, str] | None = None,
    host: str | None = None,
) -> tuple[int, str]:
    """One REST request (POST with ``body``, else GET) as ``auth`` (None: no credentials); the
    HTTP status and the answer's text."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url + path, data=data, method="GET" if data is None else "POST"
    )
    request.add_header("Content-Type", "application/json")
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    if host is not None:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """``mlflow server --app-name basic-auth`` as docs/cluster.md's "MLflow on a cluster" runs
    it: the auth config file (mode 0600) with ``default_permission = NO_PERMISSIONS``, the admin's
    password and the CSRF key in the server's environment, ``--allowed-hosts`` = the address
    the clients use; users ``nmt`` (who tracks) and ``other``. Stopped after the module's
    tests, and by ``timeout`` in any case."""
    try:
        import flask_wtf  # noqa: F401  (what mlflow[auth] adds; the auth app imports it)
    except ImportError:
        pytest.skip("MLflow's basic-auth app needs Flask-WTF: pip install 'mlflow[auth]'")
    root = tmp_path_factory.mktemp("auth_server")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    ini = root / "basic_auth.ini"
    ini.write_text(
        "[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{root / 'basic_auth.db'}\nadmin_username = admin\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n",
        encoding="utf-8",
    )
    ini.chmod(0o600)
    admin = ("admin", secrets.token_urlsafe(16))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    env.update(
        MLFLOW_AUTH_CONFIG_PATH=str(ini),
        MLFLOW_AUTH_ADMIN_PASSWORD=admin[1],
        MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(16),
        MLFLOW_DISABLE_TELEMETRY="true",
    )
    mlflow = Path(sys.executable).with_name("mlflow")
    cmd = ["timeout", "900", str(mlflow), "server", "--app-name", "basic-auth",
           "--host", "127.0.0.1", "--port", str(port), "--allowed-hosts", f"127.0.0.1:{port}",
           "--backend-store-uri", f"sqlite:///{root / 'server.db'}",
           "--artifacts-destination", str(root / "artifacts"), "--workers", "1"]  # fmt: skip
    log = open(root / "server.log", "wb")  # noqa: SIM115 (closed after the server)
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_for_health(url, proc, root / "server.log", 180)
        # the jobs' user, made as docs/cluster.md's snippet makes it: the admin's credentials in the
        # environment, MLflow's auth client
        from mlflow.server import get_app_client

        users = {"nmt": secrets.token_urlsafe(16), "other": secrets.token_urlsafe(16)}
        admin_env = {"MLFLOW_TRACKING_USERNAME": admin[0], "MLFLOW_TRACKING_PASSWORD": admin[1]}
        with mock.patch.dict(os.environ, admin_env), warnings.catch_warnings():
            # (the auth client imports MLflow's server app: a module Starlette deprecates)
            warnings.simplefilter("ignore", UserWarning)
            auth = get_app_client("basic-auth", tracking_uri=url)
            for name, password in users.items():
                auth.create_user(name, password)
        yield SimpleNamespace(
            url=url, root=root, admin=admin,
            nmt=("nmt", users["nmt"]), other=("other", users["other"]),
        )  # fmt: skip
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()


def _train_argv(corpus: dict[str, Path], run_dir: Path) -> list[str]:
    return [
        "train", "--bin-dir", str(corpus["bin"]), "--spm-model", str(corpus["spm"]),
        "--src", "en", "--tgt", "de", "--run-dir", str(run_dir),
        "--model", json.dumps(MODEL), "--train", json.dumps(TRAIN),
        "--mlflow-experiment", EXPERIMENT, "--mlflow-run", RUN,
    ]  # fmt: skip


def _score_argv(root: Path, run_dir: Path) -> list[str]:
    hyp, ref = root / "hyp.txt", root / "ref.txt"
    hyp.write_text("ein Mann fährt Rad .\nzwei Hunde spielen .\n", encoding="utf-8")
    ref.write_text("ein Mann fährt ein Rad .\nzwei Hunde spielen .\n", encoding="utf-8")
    return [
        "score", "--hyp", str(hyp), "--ref", str(ref), "--tgt-lang", "de",
        "--out", str(run_dir / f"{TEST_SET}.scores.json"), "--bootstrap-resamples", "0",
        "--mlflow-experiment", EXPERIMENT, "--mlflow-run", RUN, "--mlflow-run-dir", str(run_dir),
    ]  # fmt: skip


def _stage(argv: list[str], env: dict[str, str], log: Path) -> None:
    """``python -m transformer_nmt <argv>`` (this checkout's code), its output into ``log``."""
    with open(log, "wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "transformer_nmt", "-v", *argv],
            env={**env, "PYTHONPATH": checkout_pythonpath()},
            stdout=out, stderr=subprocess.STDOUT, timeout=600,
        )  # fmt: skip
    assert done.returncode == 0, log.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def tracked(server: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A tiny run's train (4 steps) and score stages tracked on ``server`` as ``nmt``: train
    with the credentials in the environment, score with them in ``~/.mlflow/credentials``
    (mode 0600) and none in the environment. Each stage's output goes to a log file."""
    root = tmp_path_factory.mktemp("tracked")
    home = root / "home"
    home.mkdir()
    corpus = reversal_corpus(root)
    run_dir = root / "run"
    base = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    base.update(
        HOME=str(home), MLFLOW_TRACKING_URI=server.url, MLFLOW_DISABLE_TELEMETRY="true",
        MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING="false", OMP_NUM_THREADS="1",
    )  # fmt: skip
    logs = root / "logs"
    logs.mkdir()
    user, password = server.nmt
    with_env = {**base, "MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password}
    _stage(_train_argv(corpus, run_dir), with_env, logs / "train.log")
    credentials = home / ".mlflow" / "credentials"
    credentials.parent.mkdir(mode=0o700)
    credentials.touch(mode=0o600)
    credentials.write_text(
        f"[mlflow]\nmlflow_tracking_username = {user}\nmlflow_tracking_password = {password}\n",
        encoding="utf-8",
    )
    _stage(_score_argv(root, run_dir), base, logs / "score.log")
    credentials.unlink()  # the rest of the module's tests choose their credentials themselves
    record = json.loads((run_dir / tracking.RUN_RECORD).read_text(encoding="utf-8"))
    return SimpleNamespace(root=root, corpus=corpus, run_dir=run_dir, record=record)


def _client(monkeypatch: pytest.MonkeyPatch, server: SimpleNamespace, auth: tuple[str, str]):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", auth[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", auth[1])
    return MlflowClient(tracking_uri=server.url)


def _state(client: Any) -> dict[str, Any]:
    """What the server holds that a refused request could change: experiments, runs, tags."""
    from mlflow.entities import ViewType

    experiments = client.search_experiments(view_type=ViewType.ALL)
    runs = client.search_runs([e.experiment_id for e in experiments], run_view_type=ViewType.ALL)
    return {
        "experiments": sorted((e.name, e.lifecycle_stage) for e in experiments),
        "runs": sorted(
            (r.info.run_id, r.info.lifecycle_stage, r.info.status, sorted(r.data.tags.items()))
            for r in runs
        ),
    }


@pytest.mark.slow
def test_tracked_stages_reach_the_server_with_credentials_from_the_environment_or_the_file(
    server: SimpleNamespace, tracked: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = _client(monkeypatch, server, server.nmt)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == tracked.record["run_id"] and run.info.run_name == RUN
    assert tracked.record["tracking_uri"] == server.url
    assert run.data.tags["stage.train.status"] == "finished"
    assert run.data.tags[f"stage.score.{TEST_SET}.status"] == "finished"
    assert run.data.params["train.max_steps"] == "4"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == [
        2, 4,
    ]  # fmt: skip
    scores = json.loads((tracked.run_dir / f"{TEST_SET}.scores.json").read_text("utf-8"))
    (bleu,) = client.get_metric_history(run.info.run_id, f"{TEST_SET}.bleu")
    assert bleu.value == pytest.approx(scores["bleu"]["score"])
    artifacts = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"data", "scores", "train_summary.json"} <= artifacts
    # the other user sees nothing of it (default_permission NO_PERMISSIONS)
    other = _client(monkeypatch, server, server.other)
    assert [e.name for e in other.search_experiments()] == []


@pytest.mark.slow
def test_without_or_with_wrong_credentials_the_server_refuses_and_changes_nothing(
    server: SimpleNamespace, tracked: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = _client(monkeypatch, server, server.nmt)
    before = _state(client)
    run_id = tracked.record["run_id"]
    experiment_id = tracked.record["experiment_id"]
    writes = [
        ("/api/2.0/mlflow/runs/delete", {"run_id": run_id}),
        ("/api/2.0/mlflow/experiments/delete", {"experiment_id": experiment_id}),
        ("/api/2.0/mlflow/runs/set-tag", {"run_id": run_id, "key": "x", "value": "y"}),
        ("/api/2.0/mlflow/experiments/create", {"name": "intruder"}),
    ]
    reads = [
        f"/api/2.0/mlflow/runs/get?run_id={run_id}",
        "/api/2.0/mlflow/experiments/search?max_results=10",
        f"/api/2.0/mlflow-artifacts/artifacts/{experiment_id}/{run_id}/artifacts/scores",
    ]
    user, password = server.nmt
    for auth in (None, (user, "wrong-" + password), ("nobody", password), (server.admin[0], "")):
        for path, body in writes:
            assert _call(server.url, path, body, auth=auth)[0] == 401, (path, auth)
        for path in reads:
            assert _call(server.url, path, auth=auth)[0] == 401, (path, auth)
    # a valid user without a permission on the experiment: 403
    for path, body in writes[:3]:
        assert _call(server.url, path, body, auth=server.other)[0] == 403, path
    assert _call(server.url, reads[0], auth=server.other)[0] == 403
    # the right credentials under a host name not in --allowed-hosts: 403 (MLflow's host check)
    status, text = _call(server.url, reads[0], auth=server.nmt, host="evil.example")
    assert status == 403 and "Invalid Host header" in text
    assert _call(server.url, reads[0], auth=server.nmt)[0] == 200
    assert _state(client) == before
    assert client.get_run(run_id).info.lifecycle_stage == "active"


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_a_stage_refused_by_the_server_fails_before_its_work_in_one_line(
    server: SimpleNamespace,
    tracked: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    client = _client(monkeypatch, server, server.nmt)
    before = _state(client)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # no ~/.mlflow/credentials
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
    run_dir = tmp_path / "run"
    user, password = server.nmt
    cases = [
        ({}, "HTTP 401, no credentials"),
        ({user: "wrong-" + password}, f"HTTP 401, user '{user}': wrong password"),
        (dict([server.other]), f"refused user 'other' access to experiment '{EXPERIMENT}'"),
    ]
    for credentials, why in cases:
        for name in _CREDENTIAL_VARS:
            monkeypatch.delenv(name, raising=False)
        for name, secret in credentials.items():
            monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", name)
            monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", secret)
        assert main(_train_argv(tracked.corpus, run_dir)) == 2
        err = capsys.readouterr().err
        (line,) = _error_lines(err)
        assert line.startswith(f"error: MLflow server {server.url} ") and why in line, line
        for name in (*_CREDENTIAL_VARS, "~/.mlflow/credentials"):
            assert name in line
        assert "Traceback" not in err
        for secret in credentials.values():
            assert secret not in err
        assert not run_dir.exists()  # nothing trained: no checkpoint, no attempt log
    # the cheapest stage too, before its scores file
    for name in _CREDENTIAL_VARS:
        monkeypatch.delenv(name)
    out = tmp_path / f"{TEST_SET}.scores.json"
    argv = _score_argv(tmp_path, tmp_path / "score_run")
    argv[argv.index("--out") + 1] = str(out)
    assert main(argv) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "HTTP 401" in line and "MLFLOW_TRACKING_PASSWORD" in line
    assert not out.exists()
    assert _state(_client(monkeypatch, server, server.nmt)) == before


@pytest.mark.slow
def test_the_credentials_are_in_no_log_file_param_or_tag(
    server: SimpleNamespace, tracked: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    user, password = server.nmt
    secrets_ = {
        password: "nmt's password",
        server.admin[1]: "the admin's password",
        base64.b64encode(f"{user}:{password}".encode()).decode(): "nmt's basic-auth header",
    }
    # every file the stages and the server wrote: logs, the run directory (attempt logs,
    # mlflow_run.json, metrics), the server's log, stores and artifacts
    files = [p for root in (tracked.root, server.root) for p in root.rglob("*") if p.is_file()]
    logs = [p for p in files if p.suffix == ".log"]
    assert {p.name for p in logs} >= {"train.log", "score.log", "server.log"}
    assert any(p.parent.name == "logs" and p.name.startswith("attempt-") for p in logs)
    for path in files:
        data = path.read_bytes()
        for secret, what in secrets_.items():
            assert secret.encode() not in data, f"{what} in {path}"
    client = _client(monkeypatch, server, server.nmt)
    run = client.get_run(tracked.record["run_id"])
    experiment = client.get_experiment(tracked.record["experiment_id"])
    recorded = [*run.data.params.items(), *run.data.tags.items(), *experiment.tags.items()]
    assert recorded
    for key, value in recorded:
        for secret, what in secrets_.items():
            assert secret not in key and secret not in value, f"{what} in {key}"


@pytest.mark.slow
def test_a_user_granted_read_sees_the_run_and_still_cannot_delete_it(
    server: SimpleNamespace, tracked: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/cluster.md: the admin grants a colleague READ on one experiment."""
    from mlflow.server import get_app_client

    run_id, experiment_id = tracked.record["run_id"], tracked.record["experiment_id"]
    get_run = f"/api/2.0/mlflow/runs/get?run_id={run_id}"
    assert _call(server.url, get_run, auth=server.other)[0] == 403
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", server.admin[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", server.admin[1])
    auth = get_app_client("basic-auth", tracking_uri=server.url)
    auth.grant_user_permission("other", "experiment", experiment_id, "READ")
    try:
        assert _call(server.url, get_run, auth=server.other)[0] == 200
        delete = ("/api/2.0/mlflow/runs/delete", {"run_id": run_id})
        assert _call(server.url, *delete, auth=server.other)[0] == 403
    finally:
        auth.revoke_user_permission("other", "experiment", experiment_id)
    assert _call(server.url, get_run, auth=server.other)[0] == 403
    client = _client(monkeypatch, server, server.nmt)
    assert client.get_run(run_id).info.lifecycle_stage == "active"
