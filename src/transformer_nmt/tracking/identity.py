"""A run's identity: which MLflow run is a pipeline experiment instance's, and supersession.

Layout (docs/interfaces.md): MLflow *experiment* = dataset pair (``multi30k_en-de``), MLflow
*run* = pipeline experiment (run name = the experiment's name).

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
* **Groups.** ``nest_runs`` makes the runs of a study (seeds, Table 3 rows) children of one run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformer_nmt.io_utils import read_json_object
from transformer_nmt.runs.layout import RUN_RECORD
from transformer_nmt.tracking.store import log_params, set_tags, with_retry

log = logging.getLogger(__name__)

RUN_TAG = "transformer_nmt.run"
RUN_DIR_TAG = "transformer_nmt.run_dir"
SUPERSEDED_BY_TAG = "transformer_nmt.superseded_by"
SUPERSEDES_TAG = "transformer_nmt.supersedes"
GIT_COMMIT_TAG = "mlflow.source.git.commit"
PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's own nesting: the UI shows children under it
GROUP_TAG = "transformer_nmt.group"


def find_run(client: Any, experiment_id: str, run_name: str) -> Any | None:
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


def create_run(client: Any, experiment_id: str, run_name: str, tags: dict[str, str]) -> Any:
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


def write_record(run_dir: Path, uri: str, experiment: str, run: Any) -> None:
    from transformer_nmt.io_utils import write_json

    record = {
        "tracking_uri": uri,
        "experiment": experiment,
        "experiment_id": run.info.experiment_id,
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
    }
    if read_json_object(run_dir / RUN_RECORD) != record:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / RUN_RECORD, record)


def run_of_directory(
    client: Any, uri: str, experiment_id: str, run_name: str, run_dir: Path
) -> tuple[Any, bool]:
    """``(run, created)``: the MLflow run of the experiment instance in ``run_dir``, found by
    its record or created (see the module's docstring). Call under ``store_lock``."""
    key = str(run_dir.resolve())
    record = read_json_object(run_dir / RUN_RECORD)
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
    run = create_run(client, experiment_id, run_name, {RUN_DIR_TAG: key})
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
    set_tags(client, old_id, {SUPERSEDED_BY_TAG: new_id})
    set_tags(
        client,
        new_id,
        {SUPERSEDES_TAG: old_id, "mlflow.note.content": f"Supersedes run {old_id}: {why}"},
    )


def changed_params(existing: Mapping[str, str], new: Mapping[str, str]) -> dict[str, tuple]:
    return {k: (existing[k], v) for k, v in new.items() if k in existing and existing[k] != v}


def supersede(
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
    new = create_run(
        client, experiment_id, run_name, {**keep_tags, SUPERSEDES_TAG: old.info.run_id}
    )
    log_params(client, new.info.run_id, keep_params)
    set_tags(client, old.info.run_id, {SUPERSEDED_BY_TAG: new.info.run_id})
    summary = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(changed.items()))
    description = f"Supersedes run {old.info.run_id}: stage {stage!r} " + (
        reason or f"re-ran with changed params ({summary})"
    )
    set_tags(client, new.info.run_id, {"mlflow.note.content": description})
    log.warning(
        "MLflow: stage %r %s; run %s is superseded by new run %s",
        stage,
        reason or f"re-ran with changed params ({summary})",
        old.info.run_id,
        new.info.run_id,
    )
    return new
