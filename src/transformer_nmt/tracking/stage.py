"""A stage's logging: ``stage_run`` enters the MLflow run of a pipeline experiment for one stage.

Each stage enters ``stage_run(experiment, run_name, stage, params, tags)``, which finds or
creates that run (``identity``), logs the stage's params under the stage's prefix
(``train.max_steps``), its tags (git commit, stage status, data checksums) and then yields a
:class:`StageRun` for metrics and artifacts. A store that fails after the stage's work is done
gives a ``notice`` (one line in the Snakemake terminal), not a failed job.

**How to re-run it.** Every stage also sets what MLflow shows as the run's *Source*, *User*
and *Description*: MLflow's own default tags (``mlflow.user``; ``mlflow.source.type`` LOCAL)
with ``mlflow.source.name`` the checkout's ``Snakefile`` (or ``python -m transformer_nmt
<stage>`` when a stage ran by hand) and ``mlflow.source.git.commit``; the description
(``mlflow.note.content``) gives the commands that re-run the experiment from a clean checkout of
that commit: ``$TRANSFORMER_NMT_RERUN`` (the Snakefile puts its own ``snakemake`` command line
there, ``--configfile`` and ``--config`` included), else the stage's command line. A
supersession note stays above it. Where a run came from is ``tracking/provenance.py``'s;
MLflow's system metrics during a stage ``tracking/system_monitor.py``'s; the stages'
``--mlflow-*`` arguments ``cli/arguments.py``'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from transformer_nmt.tracking.identity import (
    GROUP_TAG,
    PARENT_RUN_TAG,
    RUN_TAG,
    changed_params,
    create_run,
    find_run,
    run_of_directory,
    supersede,
    write_record,
)
from transformer_nmt.tracking.lineage import SHA256_TAG, SPLIT_TAG, DataInput
from transformer_nmt.tracking.provenance import (
    describe,
    git_commit,
    rerun_description,
    source_tags,
)
from transformer_nmt.tracking.store import (
    check_access,
    get_or_create_experiment,
    log_params,
    open_client,
    refusal_is_an_error,
    set_tags,
    sqlite_on_network_filesystem,
    store_lock,
    tracking_uri,
    with_retry,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


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
        set_tags(self.client, self.run_id, {k: str(v) for k, v in tags.items()})

    def log_data_inputs(self, inputs: Sequence[DataInput]) -> None:
        """Log ``inputs`` (``lineage.data_inputs``) as the run's MLflow dataset inputs: MLflow
        ``MetaDataset``s (source: an HTTP URL or a local path, MLflow's own source types) with
        MLflow's context tag, shown under the run's *Datasets*."""
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.http_dataset_source import HTTPDatasetSource
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        items = []
        for record in inputs:
            if record.source.startswith(("http://", "https://")):
                source = HTTPDatasetSource(record.source)
            else:
                # MLflow registers its local artifact store under two schemes ("" and "file"),
                # so it warns that a local path "can be interpreted in multiple ways" (both the
                # same LocalArtifactDatasetSource): not the user's concern.
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", "The specified dataset source can be")
                    source = resolve_dataset_source(record.source)
            dataset = MetaDataset(source, name=record.name, digest=record.digest)
            tags = [
                InputTag(MLFLOW_DATASET_CONTEXT, record.context),
                InputTag(SHA256_TAG, record.sha256),
                InputTag(SPLIT_TAG, record.split),
            ]
            # what mlflow.log_input does for the active run, here for this run's client
            items.append(DatasetInput(dataset._to_mlflow_entity(), tags))
        if items:
            with_retry(self.client.log_inputs, self.run_id, datasets=items)


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
    mutable_params: Mapping[str, Any] | None = None,
) -> Iterator[StageRun | None]:
    """Track one stage of a pipeline experiment in MLflow; yields None when not tracking.

    ``params`` (nested dicts allowed) are logged as ``<stage>.<key>``; ``tags`` as given (data
    checksums, ...); plus the git commit and ``stage.<stage>.status`` (running/finished/failed).
    ``shared_params`` are logged without the stage prefix (``{"data": {"vocab_size": 8000}}``
    -> ``data.vocab_size``: settings of earlier stages that this stage knows); like ``params``,
    a changed value supersedes the run.
    ``new_run_reason``: the stage starts over (training from scratch): an existing run is
    superseded even with identical params, and the reason becomes the new run's description.
    ``mutable_params``: settings that may change within one run without superseding it (the
    batch geometry of a resumed training): tags ``<stage>.<key>``, since MLflow params cannot
    change.
    ``run_dir``: the experiment instance's run directory, which identifies its run (its
    ``mlflow_run.json``, the ``transformer_nmt.run_dir`` tag); None: the newest run of the name.
    Marking the stage finished is best effort: the stage's work is done, so a store that fails
    then gives a warning, not a failed job.
    """
    if experiment is None or run_name is None:
        yield None
        return
    uri = tracking_uri()
    check_access(uri, experiment)  # a server that refuses us: one line, before the work
    shared_sqlite = sqlite_on_network_filesystem(uri)
    if shared_sqlite:
        notice(shared_sqlite, topic="mlflow-network-sqlite")
    flat = {**flatten_params(shared_params or {}), **flatten_params(params or {}, prefix=stage)}
    commit = git_commit()
    stage_tags = {**source_tags(stage, commit), f"stage.{stage}.status": "running"}
    if commit:
        stage_tags[f"stage.{stage}.git_commit"] = commit
    stage_tags.update({k: str(v) for k, v in (tags or {}).items()})
    stage_tags.update(flatten_params(mutable_params or {}, prefix=stage))

    with refusal_is_an_error(uri, experiment), store_lock(uri):
        client = open_client(uri)
        experiment_id = get_or_create_experiment(client, uri, experiment)
        if run_dir is not None:
            run, created = run_of_directory(client, uri, experiment_id, run_name, Path(run_dir))
        else:
            run = find_run(client, experiment_id, run_name)
            created = run is None
            if created:
                run = create_run(client, experiment_id, run_name, {})
                log.info("MLflow: created run %r (%s) in %r", run_name, run.info.run_id, experiment)
        if not created:  # a fresh run has nothing to supersede
            changed = changed_params(run.data.params, flat)
            if changed or new_run_reason:
                run = supersede(
                    client, run, experiment_id, run_name, stage, changed, set(flat), new_run_reason
                )
        run_id = run.info.run_id
        if run_dir is not None:
            write_record(Path(run_dir), uri, experiment, run)
        log_params(client, run_id, flat)
        set_tags(client, run_id, stage_tags)
        describe(client, run_id, rerun_description(stage, commit))

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


def nest_runs(parent: StageRun, run_names: list[str]) -> dict[str, str]:
    """Make the runs named ``run_names`` (of ``parent``'s MLflow experiment) children of
    ``parent`` (tag ``mlflow.parentRunId``, MLflow's nested runs) and tag them
    ``transformer_nmt.group`` = the parent's run name; returns name -> run id of those found
    (a run not tracked yet is left out)."""
    client = parent.client
    group = with_retry(client.get_run, parent.run_id).data.tags.get(RUN_TAG, "")
    found = {}
    for name in run_names:
        run = find_run(client, parent.experiment_id, name)
        if run is None:
            log.warning("MLflow: no run %r to nest under %r", name, group)
            continue
        set_tags(client, run.info.run_id, {PARENT_RUN_TAG: parent.run_id, GROUP_TAG: group})
        found[name] = run.info.run_id
    return found
