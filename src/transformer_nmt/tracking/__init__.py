"""MLflow tracking: one MLflow run per pipeline experiment, every stage logging into it.

By concern (each module's docstring gives its decisions):

- ``store``: where the MLflow store is (``tracking_uri``), and using it from many jobs at once
  (the store lock, retries while SQLite is locked); a server's credentials (``check_access``);
- ``identity``: which MLflow run is a run directory's (``mlflow_run.json``, the run's tags) and
  supersession when a stage re-runs with changed params;
- ``stage``: a stage's logging (``stage_run`` → ``StageRun``: params, tags, metrics, artifacts),
  the CLI's tracking arguments, notices to the terminal, nested runs of a study;
- ``lineage``: what a run records about its data (``data_record``).

Tracking never imports training or inference code (tests/test_repo.py checks it). MLflow imports
lazily (its first import takes seconds), so untracked stages and ``--help`` stay fast.
"""

from transformer_nmt.runs.layout import RUN_RECORD
from transformer_nmt.tracking.identity import RUN_DIR_TAG, SUPERSEDED_BY_TAG, SUPERSEDES_TAG
from transformer_nmt.tracking.lineage import data_inputs, data_record
from transformer_nmt.tracking.provenance import RERUN_ENV, git_commit
from transformer_nmt.tracking.stage import (
    NOTICE_FD_ENV,
    StageRun,
    first_line,
    flatten_params,
    nest_runs,
    notice,
    stage_run,
)
from transformer_nmt.tracking.store import check_access, tracking_uri, with_retry
from transformer_nmt.tracking.system_monitor import system_metrics

__all__ = [
    "NOTICE_FD_ENV",
    "RERUN_ENV",
    "RUN_DIR_TAG",
    "RUN_RECORD",
    "SUPERSEDED_BY_TAG",
    "SUPERSEDES_TAG",
    "StageRun",
    "check_access",
    "data_inputs",
    "data_record",
    "first_line",
    "flatten_params",
    "git_commit",
    "nest_runs",
    "notice",
    "stage_run",
    "system_metrics",
    "tracking_uri",
    "with_retry",
]
