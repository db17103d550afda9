"""MLflow's system metrics (CPU, memory, disk, network, GPU) logged into a stage's run while it
works: ``system_metrics(run)``, on unless ``$MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`` says false."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from transformer_nmt.tracking.stage import StageRun, first_line, notice
from transformer_nmt.tracking.store import tracking_uri, with_retry

SYSTEM_METRICS_INTERVAL_S = 10.0  # MLflow's default sampling interval
# MLflow's own switch; unset = on here (the Snakefile sets it from the config key system_metrics)
SYSTEM_METRICS_ENV = "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"


def system_metrics_enabled() -> bool:
    """``$MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`` (true/false), on when unset."""
    return os.environ.get(SYSTEM_METRICS_ENV, "true").strip().lower() in ("true", "1", "yes")


@contextlib.contextmanager
def system_metrics(
    run: StageRun | None,
    enabled: bool | None = None,
    interval_s: float = SYSTEM_METRICS_INTERVAL_S,
) -> Iterator[None]:
    """While the block runs, MLflow's own system-metrics monitor (``SystemMetricsMonitor``:
    CPU, memory, disk, network, and GPU where ``nvidia-ml-py`` sees one) logs ``system/*``
    into ``run`` every ``interval_s`` seconds (``$MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL``
    overrides it); the run's *System metrics* tab draws them. Nothing without a run or when not
    ``enabled``. The run is marked RUNNING first (the monitor stops on a terminated run, which a
    resumed training's run is), and its steps continue those of an earlier attempt. A monitor
    that cannot start is a notice, not a failed stage. ``enabled`` None:
    ``system_metrics_enabled()``."""
    if enabled is None:
        enabled = system_metrics_enabled()
    if run is None or not enabled:
        yield
        return
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = None
    try:
        with_retry(run.client.update_run, run.run_id, status="RUNNING")
        monitor = SystemMetricsMonitor(
            run.run_id,
            sampling_interval=interval_s,
            resume_logging=True,
            tracking_uri=tracking_uri(),
        )
        monitor.start()
    except Exception as err:
        notice(f"MLflow: no system metrics for run {run.run_name!r} ({first_line(err)})")
        monitor = None
    try:
        yield
    finally:
        if monitor is not None:
            monitor.finish()
