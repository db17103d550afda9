"""The MLflow store: where it is, and using it from many jobs at once.

* **Where.** ``$MLFLOW_TRACKING_URI``, else the embedded store ``sqlite:///<cwd>/mlflow.db``.
* **Concurrency.** Several Snakemake jobs may share one SQLite store. Every MLflow call is
  retried with exponential backoff when the database reports a lock (``with_retry``), and the
  store creation (schema migration of a fresh database), experiment creation and run
  find-or-create happen under an exclusive ``fcntl`` file lock (``store_lock``:
  ``mlruns/.<db>.lock`` beside a SQLite file; a per-URI lock file in the temp dir for other
  stores, which serialises jobs of one host).
* **Artifacts** of a SQLite store go to ``<db dir>/mlruns/`` (fixed at experiment creation), so
  jobs started from different working directories share them.

* **What kind of experiment.** MLflow 3 sorts experiments into GenAI apps and model training by
  the tag ``mlflow.experimentKind``; ours are ``custom_model_development`` (set at creation, and
  on an experiment created before without it). The tag alone does not change the UI's landing
  page (MLflow 3.17 shows the GenAI overview unless the global *Model training* switch is on);
  the link ``<ui>/#/experiments/<id>?workflowType=machine_learning`` opens *Model training ->
  Runs* directly: ``experiment_links`` gives it for every experiment of the store
  (``python -m transformer_nmt ui`` prints them).

* **Credentials.** A tracking server that asks for them (MLflow's basic-auth app,
  docs/cluster.md, "MLflow on a cluster") gets them from MLflow's own ``MLFLOW_TRACKING_USERNAME`` /
  ``MLFLOW_TRACKING_PASSWORD`` or ``~/.mlflow/credentials`` (mode 0600), never from the URI: a
  URI carrying a password is refused (``check_uri``), since the URI is written into
  ``mlflow_run.json`` and logs. Before a tracked stage's work, ``check_access`` asks the server
  first; a refusal (HTTP 401/403) is one line naming what to set, not a failure hours later.

MLflow imports lazily (its first import takes seconds), so untracked stages stay fast.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from transformer_nmt.errors import ConfigError, UserFacingError

log = logging.getLogger(__name__)

T = TypeVar("T")

# Retry budget for a locked database: ~0.05 s doubling to 2 s per wait, up to 120 s in all.
_RETRY_TOTAL_S = 120.0
_RETRY_FIRST_S = 0.05
_RETRY_MAX_S = 2.0

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # MLflow 3's kind for model training
UI_VIEW = "workflowType=machine_learning"  # the UI's "Model training" view of an experiment


# MLflow's own sources of a tracking server's credentials (mlflow.utils.credentials)
USERNAME_ENV = "MLFLOW_TRACKING_USERNAME"
PASSWORD_ENV = "MLFLOW_TRACKING_PASSWORD"
CREDENTIALS_FILE = "~/.mlflow/credentials"
_HINT = (
    f"set {USERNAME_ENV} and {PASSWORD_ENV} in the environment, or put them into "
    f"{CREDENTIALS_FILE} (mode 0600) (docs/cluster.md, 'MLflow on a cluster')"
)


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` or the embedded store ``sqlite:///<cwd>/mlflow.db``; a URI
    carrying a password is refused (``check_uri``)."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return check_uri(env)
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def redact_uri(uri: str) -> str:
    """``uri`` with the password of its ``user:password@`` replaced by ``***``."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def check_uri(uri: str, source: str = "MLFLOW_TRACKING_URI") -> str:
    """``uri``, unless it carries a password (``http://user:password@host``): a ``ConfigError``
    naming ``source`` (the variable or config key), since the tracking URI is recorded in
    ``mlflow_run.json``, the logs and (given on Snakemake's command line) the run's
    description."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    if parts.scheme in ("http", "https"):
        instead = _HINT
    else:
        instead = "let the database read it from its own password file (e.g. ~/.pgpass)"
    raise ConfigError(
        f"{source}: {redact_uri(uri)} carries a password, which would be recorded in "
        f"mlflow_run.json and logs: remove it from the URI and {instead}"
    )


# Filesystems that several machines mount: SQLite's file locks are unreliable there, so jobs on
# several nodes writing one SQLite store can corrupt it (sqlite.org, "How To Corrupt", §2.1).
NETWORK_FILESYSTEMS = (
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs",
    "fuse.glusterfs", "fuse.sshfs", "fuse.cephfs", "panfs", "wekafs", "9p", "afs",
)  # fmt: skip


def filesystem_type(path: Path, mounts: str | os.PathLike[str] = "/proc/mounts") -> str | None:
    """The type of the filesystem holding ``path`` (the longest mount point above it in
    ``mounts``), or None where the mount table cannot be read (not Linux)."""
    try:
        table = Path(mounts).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    target = str(path.resolve())
    best, kind = "", None
    for line in table:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def sqlite_on_network_filesystem(
    uri: str, mounts: str | os.PathLike[str] = "/proc/mounts"
) -> str | None:
    """A warning when ``uri`` is a SQLite file on a network filesystem, else None."""
    db = sqlite_path(uri)
    if db is None:
        return None
    kind = filesystem_type(db, mounts)
    if kind is None or kind not in NETWORK_FILESYSTEMS:
        return None
    return (
        f"MLflow store {db} is a SQLite file on a network filesystem ({kind}): jobs on several "
        "nodes writing it can corrupt it; run an MLflow server and set tracking_uri "
        "(docs/cluster.md, 'MLflow on a cluster')"
    )


def _is_lock_error(err: BaseException) -> bool:
    text = f"{type(err).__name__}: {err}".lower()
    return (
        "database is locked" in text
        or "database table is locked" in text
        or ("operationalerror" in text and "locked" in text)
    )


def with_retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn`` and retry with jittered exponential backoff while the store is locked."""
    deadline = time.monotonic() + _RETRY_TOTAL_S
    wait = _RETRY_FIRST_S
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            if not _is_lock_error(err) or time.monotonic() + wait > deadline:
                raise
            log.debug("MLflow store locked (%s); retrying in %.2f s", err, wait)
            time.sleep(wait * (0.5 + random.random()))
            wait = min(wait * 2, _RETRY_MAX_S)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :]
    if not path or path.startswith(":memory:"):
        return None
    return Path(path)


def _lock_path(uri: str) -> Path:
    db = sqlite_path(uri)
    if db is not None:  # beside the artifacts (git-ignored mlruns/), not a stray file
        return db.parent / "mlruns" / f".{db.name}.lock"
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"transformer_nmt-mlflow-{digest}.lock"


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Exclusive inter-process lock for store creation and run find-or-create."""
    path = _lock_path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def open_client(uri: str) -> Any:
    """An ``MlflowClient`` whose store exists (tables migrated) when this returns.

    Call under ``store_lock``: the first client on a fresh SQLite file runs the schema
    migration, which two processes must not do at once.
    """
    from mlflow.tracking import MlflowClient

    db = sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=uri)
    # Touch the store so that its creation (and migration) happens here, under the lock.
    with_retry(client.search_experiments, max_results=1)
    return client


def get_or_create_experiment(client: Any, uri: str, name: str) -> str:
    experiment = with_retry(client.get_experiment_by_name, name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            with_retry(client.restore_experiment, experiment.experiment_id)
        if EXPERIMENT_KIND_TAG not in experiment.tags:
            with_retry(
                client.set_experiment_tag,
                experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND,
            )  # fmt: skip
        return experiment.experiment_id
    artifact_location = None
    db = sqlite_path(uri)
    if db is not None:
        artifact_location = (db.resolve().parent / "mlruns" / name).as_uri()
    return with_retry(
        client.create_experiment,
        name,
        artifact_location=artifact_location,
        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
    )


def experiment_links(uri: str, ui_url: str) -> list[tuple[str, str]]:
    """``(name, link)`` of every active experiment of the store ``uri`` (but MLflow's empty
    ``Default``) in the MLflow UI at ``ui_url``, each opening its *Model training -> Runs*."""
    from mlflow.entities import ViewType

    client = open_client(uri)
    experiments = with_retry(client.search_experiments, view_type=ViewType.ACTIVE_ONLY)
    base = ui_url.rstrip("/")
    return sorted(
        (e.name, f"{base}/#/experiments/{e.experiment_id}?{UI_VIEW}")
        for e in experiments
        if e.name != "Default"
    )


def log_params(client: Any, run_id: str, params: Mapping[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(key, value) for key, value in sorted(params.items())]
    # log_batch accepts at most 100 params per call.
    for start in range(0, len(items), 100):
        with_retry(client.log_batch, run_id, params=items[start : start + 100])


def set_tags(client: Any, run_id: str, tags: Mapping[str, str]) -> None:
    from mlflow.entities import RunTag

    items = [RunTag(key, str(value)) for key, value in sorted(tags.items())]
    for start in range(0, len(items), 100):
        with_retry(client.log_batch, run_id, tags=items[start : start + 100])


_REFUSED = {"UNAUTHENTICATED": 401, "CUSTOMER_UNAUTHORIZED": 401, "PERMISSION_DENIED": 403}


def refusal(err: BaseException, uri: str, experiment: str | None = None) -> str | None:
    """The one-line error for a tracking server that refused us (HTTP 401/403), naming what to
    set; None for any other error."""
    status = _REFUSED.get(str(getattr(err, "error_code", "")))
    if status is None:
        return None
    from mlflow.utils.credentials import read_mlflow_creds

    user = read_mlflow_creds().username
    server = f"MLflow server {redact_uri(uri)}"
    if status == 401:
        who = f"user {user!r}: wrong password or no such user" if user else "no credentials"
        return f"{server} refused us (HTTP 401, {who}): {_HINT}"
    if "Invalid Host header" in str(err):  # MLflow's host check (mlflow server --allowed-hosts)
        host = urlsplit(uri).netloc.rsplit("@", 1)[-1]
        return (
            f"{server} refused the host name {host!r} (HTTP 403, not in its --allowed-hosts): "
            "add it to the server's --allowed-hosts, or use a name listed there"
        )
    what = f"experiment {experiment!r}" if experiment else "this request"
    return (
        f"{server} refused user {user!r} access to {what} (HTTP 403): its admin must grant "
        f"that user a permission on it, or give a user who has one in {USERNAME_ENV} and "
        f"{PASSWORD_ENV} (or {CREDENTIALS_FILE})"
    )


@contextlib.contextmanager
def refusal_is_an_error(uri: str, experiment: str | None = None) -> Iterator[None]:
    """Inside the block, a tracking server's refusal (``refusal``) is a ``UserFacingError``."""
    try:
        yield
    except Exception as err:
        message = refusal(err, uri, experiment)
        if message is None:
            raise
        raise UserFacingError(message) from err


def check_access(uri: str, experiment: str | None = None) -> None:
    """Pre-flight of a tracked stage, before its work: ask an ``http(s)`` tracking server
    whether it lets us in (a search, and the experiment when it exists: two requests); a
    refusal is a one-line ``UserFacingError`` (``refusal``). MLflow's credentials file open to
    others is refused too. Nothing for other stores."""
    if urlsplit(uri).scheme not in ("http", "https"):
        return
    credentials = Path(CREDENTIALS_FILE).expanduser()
    try:
        mode = credentials.stat().st_mode & 0o777
    except OSError:
        mode = 0
    if mode & 0o077:
        raise UserFacingError(
            f"{credentials} (MLflow's credentials) is open to others (mode {mode:o}): "
            f"chmod 600 {credentials}"
        )
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    with refusal_is_an_error(uri, experiment):
        client.search_experiments(max_results=1)
        if experiment is not None:
            client.get_experiment_by_name(experiment)
