"""MLflow tracking: one MLflow run per pipeline experiment, every stage logging into it.

Layout (docs/interfaces.md): MLflow *experiment* = dataset pair (``multi30k_en-de``), MLflow
*run* = pipeline experiment (run name = the experiment's name). Each stage enters
``stage_run(experiment, run_name, stage, params, tags)``, which finds or creates that run and
logs the stage's params under the stage's prefix (``train.max_steps``), its tags (git commit,
stage status, data checksums) and then yields a :class:`StageRun` for metrics and artifacts.

Decisions documented here because they are not MLflow's defaults:

* **Finding the run.** A pipeline experiment *instance* is its run directory
  (``results/runs/<experiment>``, ``--mlflow-run-dir``): the run's id is kept in
  ``<run dir>/mlflow_run.json`` (with the store's URI and the experiment id; written atomically
  when the run is created or superseded), and the run carries the directory's absolute path as
  the tag ``transformer_nmt.run_dir``. Two checkouts that use one store with the same experiment
  names therefore get two runs, and a run directory made anew (deleted, or a fresh checkout)
  gets a fresh run, which supersedes the newest run of the same directory. A stage called
  without a run directory (by hand) finds the newest run tagged ``transformer_nmt.run`` (= run
  name) that has not been superseded.
* **Changed params (MLflow params are immutable).** When a stage re-runs with a value that
  differs from the one already logged under its prefix (e.g. ``train.max_steps`` 100 -> 200),
  the current run is *superseded*: a fresh run with the same name is created, the params and
  user tags of the *other* stages are copied into it, and the two runs are linked by the tags
  ``transformer_nmt.superseded_by`` / ``transformer_nmt.supersedes``. Metrics and artifacts of
  the older stages stay in the superseded run (reachable through that tag). Re-running a stage
  with identical params (e.g. a resumed training job) logs into the same run.
  Jobs of one stage that run in parallel for different inputs (translate of two test sets)
  must either log identical params or use a qualified stage name (``translate.test_2016``).
* **Concurrency.** Several Snakemake jobs may share one SQLite store. Every MLflow call is
  retried with exponential backoff when the database reports a lock, and the store creation
  (schema migration of a fresh database), experiment creation and run find-or-create happen
  under an exclusive ``fcntl`` file lock (``mlruns/.<db>.lock`` beside a SQLite file; a per-URI lock
  file in the temp dir for other stores, which serialises jobs of one host).
* **Artifacts** of a SQLite store go to ``<db dir>/mlruns/`` (fixed at experiment creation), so
  jobs started from different working directories share them.

MLflow imports lazily (its first import takes seconds), so untracked stages and ``--help`` stay
fast.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

RUN_TAG = "transformer_nmt.run"
RUN_DIR_TAG = "transformer_nmt.run_dir"
RUN_RECORD = "mlflow_run.json"  # in the run directory: which MLflow run is this instance's
SUPERSEDED_BY_TAG = "transformer_nmt.superseded_by"
SUPERSEDES_TAG = "transformer_nmt.supersedes"
GIT_COMMIT_TAG = "mlflow.source.git.commit"
PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's own nesting: the UI shows children under it
GROUP_TAG = "transformer_nmt.group"

# Retry budget for a locked database: ~0.05 s doubling to 2 s per wait, up to 120 s in all.
_RETRY_TOTAL_S = 120.0
_RETRY_FIRST_S = 0.05
_RETRY_MAX_S = 2.0


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` or the embedded store ``sqlite:///<cwd>/mlflow.db``."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--mlflow-experiment`` and ``--mlflow-run``; without both a stage does not track."""
    group = parser.add_argument_group("MLflow tracking (off unless both are given)")
    group.add_argument(
        "--mlflow-experiment",
        default=None,
        metavar="NAME",
        help="MLflow experiment = dataset pair, e.g. multi30k_en-de",
    )
    group.add_argument(
        "--mlflow-run",
        default=None,
        metavar="NAME",
        help="MLflow run = the pipeline experiment's name",
    )
    group.add_argument(
        "--mlflow-run-dir",
        default=None,
        type=Path,
        metavar="DIR",
        help="the experiment's run directory (results/runs/<experiment>): its mlflow_run.json "
        "and absolute path identify the MLflow run (without it: the newest run of that name)",
    )


def run_dir_arg(args: argparse.Namespace, run_dir: Path | None = None) -> Path | None:
    """The run directory that keys the MLflow run: ``--mlflow-run-dir``, else the stage's own
    ``run_dir`` (train and register have ``--run-dir``); both given must be one directory."""
    given = getattr(args, "mlflow_run_dir", None)
    if given is not None and run_dir is not None and given.resolve() != run_dir.resolve():
        from transformer_nmt.errors import ConfigError

        raise ConfigError(f"--mlflow-run-dir {given} is not --run-dir {run_dir}: give one")
    return given if given is not None else run_dir


def git_commit(cwd: str | os.PathLike[str] | None = None) -> str | None:
    """``git rev-parse HEAD`` of ``cwd`` (default: this package's checkout), or None."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit or None


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested dicts into dotted keys; lists and other values become strings/JSON."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, name))
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(list(value))
        elif value is None:
            flat[name] = "null"
        else:
            flat[name] = str(value)
    return flat


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


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :]
    if not path or path.startswith(":memory:"):
        return None
    return Path(path)


def _lock_path(uri: str) -> Path:
    db = _sqlite_path(uri)
    if db is not None:  # beside the artifacts (git-ignored mlruns/), not a stray file
        return db.parent / "mlruns" / f".{db.name}.lock"
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"transformer_nmt-mlflow-{digest}.lock"


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Exclusive inter-process lock for store creation and run find-or-create."""
    path = _lock_path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _client(uri: str) -> Any:
    """An ``MlflowClient`` whose store exists (tables migrated) when this returns.

    Call under ``_store_lock``: the first client on a fresh SQLite file runs the schema
    migration, which two processes must not do at once.
    """
    from mlflow.tracking import MlflowClient

    db = _sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=uri)
    # Touch the store so that its creation (and migration) happens here, under the lock.
    with_retry(client.search_experiments, max_results=1)
    return client


def _get_or_create_experiment(client: Any, uri: str, name: str) -> str:
    experiment = with_retry(client.get_experiment_by_name, name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            with_retry(client.restore_experiment, experiment.experiment_id)
        return experiment.experiment_id
    artifact_location = None
    db = _sqlite_path(uri)
    if db is not None:
        artifact_location = (db.resolve().parent / "mlruns" / name).as_uri()
    return with_retry(client.create_experiment, name, artifact_location=artifact_location)


def _find_run(client: Any, experiment_id: str, run_name: str) -> Any | None:
    """The newest active run tagged with ``run_name`` that no run has superseded."""
    runs = with_retry(
        client.search_runs,
        [experiment_id],
        filter_string=f"tags.`{RUN_TAG}` = '{_quote(run_name)}'",
        order_by=["attributes.start_time DESC"],
        max_results=100,
    )
    for run in runs:
        if SUPERSEDED_BY_TAG not in run.data.tags:
            return run
    return None


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _create_run(client: Any, experiment_id: str, run_name: str, tags: dict[str, str]) -> Any:
    return with_retry(
        client.create_run, experiment_id, tags={RUN_TAG: run_name, **tags}, run_name=run_name
    )


def _get_run(client: Any, run_id: str) -> Any | None:
    """The run ``run_id``, or None when the store has no such active run."""
    from mlflow.exceptions import MlflowException

    try:
        run = with_retry(client.get_run, run_id)
    except MlflowException:
        return None
    return run if run.info.lifecycle_stage == "active" else None


def _read_record(run_dir: Path) -> dict[str, Any]:
    try:
        record = json.loads((run_dir / RUN_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_record(run_dir: Path, uri: str, experiment: str, run: Any) -> None:
    from transformer_nmt.io_utils import write_json

    record = {
        "tracking_uri": uri,
        "experiment": experiment,
        "experiment_id": run.info.experiment_id,
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
    }
    if _read_record(run_dir) != record:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / RUN_RECORD, record)


def _run_of_directory(
    client: Any, uri: str, experiment_id: str, run_name: str, run_dir: Path
) -> tuple[Any, bool]:
    """``(run, created)``: the MLflow run of the experiment instance in ``run_dir``, found by
    its record or created (see the module's docstring). Call under ``_store_lock``."""
    key = str(run_dir.resolve())
    record = _read_record(run_dir)
    run = None
    if (record.get("tracking_uri"), record.get("experiment_id"), record.get("run_name")) == (
        uri,
        experiment_id,
        run_name,
    ):
        run = _get_run(client, str(record.get("run_id")))
        seen: set[str] = set()  # a stage of this directory may have superseded it since
        while run is not None and SUPERSEDED_BY_TAG in run.data.tags:
            seen.add(run.info.run_id)
            newer = run.data.tags[SUPERSEDED_BY_TAG]
            run = None if newer in seen else _get_run(client, newer)
    if run is not None:
        return run, False
    run = _create_run(client, experiment_id, run_name, {RUN_DIR_TAG: key})
    log.info("MLflow: created run %r (%s) for %s", run_name, run.info.run_id, key)
    # A directory made anew (deleted and rerun): its former run is superseded, not reused.
    for old in with_retry(
        client.search_runs,
        [experiment_id],
        filter_string=f"tags.`{RUN_TAG}` = '{_quote(run_name)}' "
        f"and tags.`{RUN_DIR_TAG}` = '{_quote(key)}'",
        order_by=["attributes.start_time DESC"],
        max_results=100,
    ):
        if old.info.run_id != run.info.run_id and SUPERSEDED_BY_TAG not in old.data.tags:
            why = f"the run directory {key} was made anew (its {RUN_RECORD} names no run)"
            _link(client, old.info.run_id, run.info.run_id, why)
    return run, True


def _link(client: Any, old_id: str, new_id: str, why: str) -> None:
    """Tag ``new_id`` as superseding ``old_id``; its description (``mlflow.note.content``)
    says why."""
    _set_tags(client, old_id, {SUPERSEDED_BY_TAG: new_id})
    _set_tags(
        client,
        new_id,
        {SUPERSEDES_TAG: old_id, "mlflow.note.content": f"Supersedes run {old_id}: {why}"},
    )


def _log_params(client: Any, run_id: str, params: Mapping[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(key, value) for key, value in sorted(params.items())]
    # log_batch accepts at most 100 params per call.
    for start in range(0, len(items), 100):
        with_retry(client.log_batch, run_id, params=items[start : start + 100])


def _set_tags(client: Any, run_id: str, tags: Mapping[str, str]) -> None:
    from mlflow.entities import RunTag

    items = [RunTag(key, str(value)) for key, value in sorted(tags.items())]
    for start in range(0, len(items), 100):
        with_retry(client.log_batch, run_id, tags=items[start : start + 100])


def _changed_params(existing: Mapping[str, str], new: Mapping[str, str]) -> dict[str, tuple]:
    return {k: (existing[k], v) for k, v in new.items() if k in existing and existing[k] != v}


class StageRun:
    """Handle on the MLflow run of one pipeline experiment, for one stage."""

    def __init__(
        self, client: Any, run_id: str, experiment_id: str, stage: str, run_name: str = ""
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.stage = stage
        self.run_name = run_name

    def log_metrics(
        self, metrics: Mapping[str, float], step: int | None = None, *, retry: bool = True
    ) -> None:
        """Log a dict of scalar metrics at ``step`` (one batched call, retried while the store
        is locked unless ``retry`` is False)."""
        from mlflow.entities import Metric

        timestamp = int(time.time() * 1000)
        items = [
            Metric(key, float(value), timestamp, int(step or 0))
            for key, value in sorted(metrics.items())
        ]
        # MLflow rejects ±inf in some stores; NaN is stored. Keep both visible as NaN.
        items = [
            m if math.isfinite(m.value) else Metric(m.key, math.nan, m.timestamp, m.step)
            for m in items
        ]
        call = with_retry if retry else _once
        for start in range(0, len(items), 1000):
            call(self.client.log_batch, self.run_id, metrics=items[start : start + 1000])

    def logged_steps(self, key: str, *, retry: bool = True) -> set[int]:
        """The steps at which the run already has a point of metric ``key``."""
        call = with_retry if retry else _once
        return {m.step for m in call(self.client.get_metric_history, self.run_id, key)}

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Copy a local file (or directory) into the run's artifacts."""
        path = Path(path)
        if path.is_dir():
            with_retry(self.client.log_artifacts, self.run_id, str(path), artifact_path)
        else:
            with_retry(self.client.log_artifact, self.run_id, str(path), artifact_path)

    def log_artifact_as(self, path: str | os.PathLike[str], artifact_file: str) -> None:
        """Copy a local file into the run's artifacts under another name (``dir/name.txt``)."""
        artifact = PurePosixPath(artifact_file)
        directory = None if str(artifact.parent) == "." else str(artifact.parent)
        with tempfile.TemporaryDirectory(prefix="transformer_nmt-artifact-") as tmp:
            copy = Path(tmp) / artifact.name
            shutil.copyfile(path, copy)
            self.log_artifact(copy, directory)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        _set_tags(self.client, self.run_id, {k: str(v) for k, v in tags.items()})


def _once(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return fn(*args, **kwargs)


NOTICE_FD_ENV = "TRANSFORMER_NMT_NOTICE_FD"
_noticed: set[str] = set()  # the topics this process has shown a notice for


def notice(message: str, topic: str = "mlflow") -> None:
    """Log ``message`` as a warning and, for the first notice of ``topic`` in this process,
    also write it as one line to the file descriptor named by ``$TRANSFORMER_NMT_NOTICE_FD``:
    the train rule sends the job's output to its log file but passes Snakemake's own stderr as
    descriptor 3, so that this line shows in the Snakemake terminal, once per job. Without it
    (by hand, or a descriptor that a launcher such as ``srun`` did not forward) the warning is
    in the log alone."""
    log.warning(message)
    fd = os.environ.get(NOTICE_FD_ENV)
    if not fd or topic in _noticed:
        return
    _noticed.add(topic)
    with contextlib.suppress(ValueError, OSError):
        os.write(int(fd), f"transformer_nmt: WARNING: {message}\n".encode())


def first_line(err: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` (SQLAlchemy's errors run to many lines)."""
    text = (str(err).strip().splitlines() or [""])[0]
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


@contextlib.contextmanager
def stage_run(
    experiment: str | None,
    run_name: str | None,
    stage: str,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
    new_run_reason: str | None = None,
    shared_params: Mapping[str, Any] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
) -> Iterator[StageRun | None]:
    """Track one stage of a pipeline experiment in MLflow; yields None when not tracking.

    ``params`` (nested dicts allowed) are logged as ``<stage>.<key>``; ``tags`` as given (data
    checksums, ...); plus the git commit and ``stage.<stage>.status`` (running/finished/failed).
    ``shared_params`` are logged without the stage prefix (``{"data": {"vocab_size": 8000}}``
    -> ``data.vocab_size``: settings of earlier stages that this stage knows); like ``params``,
    a changed value supersedes the run.
    ``new_run_reason``: the stage starts over (training from scratch): an existing run is
    superseded even with identical params, and the reason becomes the new run's description.
    ``run_dir``: the experiment instance's run directory, which identifies its run (its
    ``mlflow_run.json``, the ``transformer_nmt.run_dir`` tag); None: the newest run of the name.
    Marking the stage finished is best effort: the stage's work is done, so a store that fails
    then gives a warning, not a failed job.
    """
    if experiment is None or run_name is None:
        yield None
        return
    uri = tracking_uri()
    flat = {**flatten_params(shared_params or {}), **flatten_params(params or {}, prefix=stage)}
    commit = git_commit()
    stage_tags = {f"stage.{stage}.status": "running"}
    if commit:
        stage_tags[GIT_COMMIT_TAG] = commit
        stage_tags[f"stage.{stage}.git_commit"] = commit
    stage_tags.update({k: str(v) for k, v in (tags or {}).items()})

    with _store_lock(uri):
        client = _client(uri)
        experiment_id = _get_or_create_experiment(client, uri, experiment)
        if run_dir is not None:
            run, created = _run_of_directory(client, uri, experiment_id, run_name, Path(run_dir))
        else:
            run = _find_run(client, experiment_id, run_name)
            created = run is None
            if created:
                run = _create_run(client, experiment_id, run_name, {})
                log.info("MLflow: created run %r (%s) in %r", run_name, run.info.run_id, experiment)
        if not created:  # a fresh run has nothing to supersede
            changed = _changed_params(run.data.params, flat)
            if changed or new_run_reason:
                run = _supersede(
                    client, run, experiment_id, run_name, stage, changed, set(flat), new_run_reason
                )
        run_id = run.info.run_id
        if run_dir is not None:
            _write_record(Path(run_dir), uri, experiment, run)
        _log_params(client, run_id, flat)
        _set_tags(client, run_id, stage_tags)

    handle = StageRun(client, run_id, experiment_id, stage, run_name)
    try:
        yield handle
    except BaseException:
        with contextlib.suppress(Exception):
            handle.set_tags({f"stage.{stage}.status": "failed"})
            with_retry(client.set_terminated, run_id, status="FAILED")
        raise
    try:
        handle.set_tags({f"stage.{stage}.status": "finished"})
        with_retry(client.set_terminated, run_id, status="FINISHED")
    except Exception as err:
        notice(f"MLflow: could not mark stage {stage!r} of run {run_name!r} finished "
               f"({first_line(err)}); its results are written")  # fmt: skip


def _supersede(
    client: Any,
    old: Any,
    experiment_id: str,
    run_name: str,
    stage: str,
    changed: Mapping[str, tuple],
    own_keys: set[str],
    reason: str | None = None,
) -> Any:
    """Start a fresh run for ``run_name`` carrying the other stages' params and tags (not the
    params in ``own_keys``, which the stage logs anew); its description (MLflow's
    ``mlflow.note.content``) says what changed."""
    prefix = f"{stage}."
    keep_params = {
        k: v for k, v in old.data.params.items() if not k.startswith(prefix) and k not in own_keys
    }
    keep_tags = {
        k: v
        for k, v in old.data.tags.items()
        if not k.startswith("mlflow.")
        and k not in (RUN_TAG, SUPERSEDES_TAG, SUPERSEDED_BY_TAG)
        and not k.startswith(f"stage.{stage}.")
    }
    new = _create_run(
        client, experiment_id, run_name, {**keep_tags, SUPERSEDES_TAG: old.info.run_id}
    )
    _log_params(client, new.info.run_id, keep_params)
    _set_tags(client, old.info.run_id, {SUPERSEDED_BY_TAG: new.info.run_id})
    summary = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(changed.items()))
    description = f"Supersedes run {old.info.run_id}: stage {stage!r} " + (
        reason or f"re-ran with changed params ({summary})"
    )
    _set_tags(client, new.info.run_id, {"mlflow.note.content": description})
    log.warning(
        "MLflow: stage %r %s; run %s is superseded by new run %s",
        stage,
        reason or f"re-ran with changed params ({summary})",
        old.info.run_id,
        new.info.run_id,
    )
    return new


def nest_runs(parent: StageRun, run_names: list[str]) -> dict[str, str]:
    """Make the runs named ``run_names`` (of ``parent``'s MLflow experiment) children of
    ``parent`` (tag ``mlflow.parentRunId``, MLflow's nested runs) and tag them
    ``transformer_nmt.group`` = the parent's run name; returns name -> run id of those found
    (a run not tracked yet is left out)."""
    client = parent.client
    group = with_retry(client.get_run, parent.run_id).data.tags.get(RUN_TAG, "")
    found = {}
    for name in run_names:
        run = _find_run(client, parent.experiment_id, name)
        if run is None:
            log.warning("MLflow: no run %r to nest under %r", name, group)
            continue
        _set_tags(client, run.info.run_id, {PARENT_RUN_TAG: parent.run_id, GROUP_TAG: group})
        found[name] = run.info.run_id
    return found


# --- what the train stage records about its data -----------------------------------------------

# spm.json keys that are not settings: the input paths and the model's checksum (a tag).
_SPM_NOT_SETTINGS = ("input_lines", "sha256")


def data_record(
    spm_model: str | os.PathLike[str],
    vocab_size: int,
    clean_report: str | os.PathLike[str] | None,
    bin_dir: str | os.PathLike[str],
    splits: Mapping[str, tuple[str, ...]],
) -> tuple[dict[str, Any], dict[str, str]]:
    """The data-stage settings and data checksums of a run, as ``(shared_params, tags)``.

    Params (for ``stage_run(shared_params=...)``): ``data.vocab_size``, ``data.spm.*`` (the
    settings in ``spm.json`` beside ``spm_model``), ``data.dataset``, ``data.pair`` and
    ``data.clean.*`` (the rules in ``clean_report``). Tags: ``data.spm_sha256`` and the sha256
    of each token array, ``data.<split>.<lang>.tokens_sha256`` / ``.offsets_sha256``, for
    ``splits`` = ``{split: (lang, ...)}``. A missing ``spm.json`` or report is left out.
    """
    from transformer_nmt.data.token_array import array_paths
    from transformer_nmt.io_utils import sha256_file

    spm_model = Path(spm_model)
    data: dict[str, Any] = {"vocab_size": vocab_size}
    spm_json = spm_model.with_suffix(".json")
    if spm_json.is_file():
        settings = json.loads(spm_json.read_text(encoding="utf-8"))
        data["spm"] = {k: v for k, v in settings.items() if k not in _SPM_NOT_SETTINGS}
    if clean_report is not None and Path(clean_report).is_file():
        report = json.loads(Path(clean_report).read_text(encoding="utf-8"))
        data.update({k: report[k] for k in ("dataset", "pair") if k in report})
        data["clean"] = report.get("rules", {})
    tags = {"data.spm_sha256": sha256_file(spm_model)}
    for split, langs in splits.items():
        for lang in langs:
            tokens, offsets = array_paths(Path(bin_dir) / f"{split}.{lang}")
            for kind, path in (("tokens", tokens), ("offsets", offsets)):
                if path.is_file():
                    tags[f"data.{split}.{lang}.{kind}_sha256"] = sha256_file(path)
    return {"data": data}, tags
