"""Where a run came from: the checkout's git commit, MLflow's source tags (the Snakefile, or the
stage run by hand) and the run's description, the commands that re-run it from a clean checkout
(``$TRANSFORMER_NMT_RERUN``, the Snakefile's own command line, else the stage's)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from transformer_nmt.tracking.identity import GIT_COMMIT_TAG
from transformer_nmt.tracking.store import set_tags, with_retry

RERUN_ENV = (
    "TRANSFORMER_NMT_RERUN"  # the Snakefile's command line (experiments/paths.py rerun_command)
)
NOTE_TAG = "mlflow.note.content"  # the run's description in the MLflow UI
_RERUN_HEADING = "Re-run this experiment"


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


def _checkout() -> Path:
    return Path(__file__).resolve().parents[3]


def _dirty(checkout: Path) -> bool:
    """True when the checkout has uncommitted changes to tracked files."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=checkout, capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(out.stdout.strip())


def rerun_description(stage: str, commit: str | None) -> str:
    """The run's description: the commands that re-run it from a clean checkout."""
    command = os.environ.get(RERUN_ENV) or shlex.join(
        ["python", "-m", "transformer_nmt", *sys.argv[1:]] if sys.argv[1:] else
        ["python", "-m", "transformer_nmt", stage.split(".")[0]]
    )  # fmt: skip
    lines = [f"{_RERUN_HEADING} from a clean checkout:", ""]
    if commit:
        lines += [f"    git checkout {commit}"]
    lines += [f"    {command}", ""]
    if commit and _dirty(_checkout()):
        lines.append(f"(The checkout had uncommitted changes on top of {commit}.)")
    return "\n".join(lines).rstrip("\n")


def source_tags(stage: str, commit: str | None) -> dict[str, str]:
    """MLflow's own default run tags (``mlflow.user``, ``mlflow.source.type``), with the
    source named after the pipeline (its Snakefile) or the stage run by hand, and the commit."""
    from mlflow.tracking.context.default_context import DefaultRunContext
    from mlflow.utils.mlflow_tags import MLFLOW_SOURCE_NAME

    tags = dict(DefaultRunContext().tags())
    if os.environ.get(RERUN_ENV):
        tags[MLFLOW_SOURCE_NAME] = str(_checkout() / "Snakefile")
    else:
        tags[MLFLOW_SOURCE_NAME] = f"python -m transformer_nmt {stage.split('.')[0]}"
    if commit:
        tags[GIT_COMMIT_TAG] = commit
    return tags


def describe(client: Any, run_id: str, description: str) -> None:
    """Set the run's description to ``description`` below what it says before our own
    re-run block (a supersession note)."""
    note = with_retry(client.get_run, run_id).data.tags.get(NOTE_TAG, "")
    kept = note.split(_RERUN_HEADING, 1)[0].rstrip()
    text = f"{kept}\n\n{description}" if kept else description
    if text != note:
        set_tags(client, run_id, {NOTE_TAG: text})
