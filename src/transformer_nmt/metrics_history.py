"""Former home of ``transformer_nmt.runs.metrics_history`` (moved 2026-11-25, CHANGELOG.md),
kept so that users' scripts still import: the same objects, and a FutureWarning once per
process."""

import warnings

from transformer_nmt.runs.metrics_history import *  # noqa: F403  (every public name, the same objects)

warnings.warn(
    "transformer_nmt.metrics_history moved to transformer_nmt.runs.metrics_history (CHANGELOG.md); "
    "this alias will be removed",
    FutureWarning,
    stacklevel=2,
)
