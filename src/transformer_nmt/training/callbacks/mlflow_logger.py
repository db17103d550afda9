"""The MLflow side of a run: a Lightning logger writing into the stage's MLflow run, one notice
and a count when the store fails, training going on."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

if TYPE_CHECKING:
    from transformer_nmt.tracking import StageRun

log = logging.getLogger(__name__)


class StageRunLogger(Logger):
    """Lightning logger that writes metrics into the experiment's MLflow run through
    ``tracking.StageRun`` (batched, retried on a locked store). Params are logged by the CLI.

    * **One point per step.** MLflow keeps every point logged, two for a step logged twice
      (and has no call to delete one). Steps that a killed attempt logged after its last
      checkpoint are trained again after the resume, so a point whose (key, step) the run
      already has is not logged again: the first attempt's point stands, for the same update
      (same checkpoint, data position and ``StepSeed`` dropout).
    * **A failing store does not stop training.** The first failed call (full disk, a store
      locked past ``tracking.with_retry``'s budget, an unreachable server) is one warning
      (``tracking.notice``: the log and the Snakemake terminal); later calls are tried once,
      without the lock retries, until one succeeds, and the points of failed calls are counted
      in ``points_lost`` (``train_summary.json``'s ``mlflow_points_lost``).
    """

    def __init__(self, run: StageRun) -> None:
        super().__init__()
        self._run = run
        self._logged: dict[str, set[int]] = {}  # steps the run had for each key
        self.points_lost = 0
        self.first_error: str | None = None
        self._failing = False

    @property
    def name(self) -> str:
        return "mlflow"

    @property
    def version(self) -> str:
        return self._run.run_id

    @property
    @rank_zero_experiment
    def experiment(self) -> StageRun:
        return self._run

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Params go in through ``tracking.stage_run`` (prefixed by the stage)."""

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        values = {k: float(v) for k, v in metrics.items() if k != "epoch"}
        # Lightning passes the number of updates done *before* the current one (0-based,
        # also for validation inside it); MLflow gets the update count after it, so that
        # the loss of update k and the validation after it are logged at step k.
        mlflow_step = 0 if step is None else step + 1
        if not values:
            return
        try:
            for key in values.keys() - self._logged.keys():
                self._logged[key] = self._run.logged_steps(key, retry=not self._failing)
            values = {k: v for k, v in values.items() if mlflow_step not in self._logged[k]}
            if values:
                self._run.log_metrics(values, step=mlflow_step, retry=not self._failing)
        except Exception as err:  # a tracking outage must not kill a training run
            from transformer_nmt.tracking import first_line, notice

            self.points_lost += len(values)
            if self.first_error is None:
                self.first_error = first_line(err)
                notice(
                    f"MLflow: could not log {len(values)} metric point(s) of run "
                    f"{self._run.run_name!r} at step {mlflow_step} ({self.first_error}); "
                    "training goes on, and train_summary.json counts the points lost "
                    "(mlflow_points_lost)"
                )
            self._failing = True
            return
        self._failing = False
