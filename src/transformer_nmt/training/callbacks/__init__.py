"""Lightning callbacks and logger of a training run, one module per concern:

- ``checkpoint``: step-named checkpoints (§6.1), stopping on a signal at an update's end with one
  checkpoint, the newest validation's record beside the checkpoints;
- ``progress``: throughput, log lines for Snakemake's log files, ``metrics.csv``;
- ``determinism``: per-step reseeding (resume-exact dropout), the batch trace (a test aid);
- ``memory``: the heap's free pages handed back to the kernel every few updates;
- ``mlflow_logger``: the Lightning logger writing into the stage's MLflow run.
"""

from transformer_nmt.training.callbacks.checkpoint import (
    LastValidation,
    StepCheckpoint,
    StopOnSignal,
    TrainingStopped,
    read_last_validation,
    write_last_validation,
)
from transformer_nmt.training.callbacks.determinism import BatchTrace, StepSeed
from transformer_nmt.training.callbacks.memory import ReleaseFreedMemory
from transformer_nmt.training.callbacks.mlflow_logger import StageRunLogger
from transformer_nmt.training.callbacks.progress import (
    LogLines,
    MetricsHistory,
    Throughput,
    _clock,
    measured_validation,
)

__all__ = [
    "BatchTrace",
    "LastValidation",
    "LogLines",
    "MetricsHistory",
    "ReleaseFreedMemory",
    "StageRunLogger",
    "StepCheckpoint",
    "StepSeed",
    "StopOnSignal",
    "Throughput",
    "TrainingStopped",
    "_clock",
    "measured_validation",
    "read_last_validation",
    "write_last_validation",
]
