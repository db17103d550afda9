"""Former home of ``transformer_nmt.runs.checkpoints`` (moved 2026-11-25, CHANGELOG.md),
kept so that users' scripts still import: the same objects, and a FutureWarning once per
process."""

import warnings

from transformer_nmt.runs.checkpoints import *  # noqa: F403  (every public name, the same objects)

warnings.warn(
    "transformer_nmt.checkpoints moved to transformer_nmt.runs.checkpoints (CHANGELOG.md); "
    "this alias will be removed",
    FutureWarning,
    stacklevel=2,
)
