"""Every output path of the pipeline (one template each, Snakemake wildcards in braces; the rules
use them as their output patterns, ``Pipeline`` fills them in) and the small helpers the
Snakefile calls: canonical JSON for params, one-line config errors, the re-run command line,
the ``train_config`` rule's writer (docs/interfaces.md, "Data files").
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema

from transformer_nmt.io_utils import write_json
from transformer_nmt.removed_keys import removed_key_message
from transformer_nmt.runs import layout as run_files

# --- output path templates (Snakemake wildcards in braces) ------------------------------------
RAW_DIR = "resources/{dataset}"
# the registry plus the config's own datasets (``datasets:``), what the stages read
MERGED_REGISTRY = "results/datasets.yaml"
CHECKSUM_LOCK = RAW_DIR + "/checksums.lock.json"  # sha256 pinned by the first download
TEXT_DIR = "results/data/{dataset}/{pair}"
TEXT_FILE = TEXT_DIR + "/{split}.{lang}"
CLEAN_REPORT = TEXT_DIR + "/clean_report.json"
SPM_PREFIX = "results/spm/{dataset}/{pair}/spm"
SPM_MODEL = SPM_PREFIX + ".model"
SPM_VOCAB = SPM_PREFIX + ".vocab"
BIN_DIR = "results/bin/{dataset}/{pair}"
TOKENS = BIN_DIR + "/{split}.{lang}.tokens.npy"
OFFSETS = BIN_DIR + "/{split}.{lang}.offsets.npy"
RUN_DIR = "results/runs/{experiment}"  # its files: transformer_nmt.runs.layout
TRAIN_CONFIG = f"{RUN_DIR}/{run_files.TRAIN_CONFIG_FILE}"
TRAIN_SUMMARY = f"{RUN_DIR}/{run_files.SUMMARY_FILE}"
CHECKPOINT_DIR = f"{RUN_DIR}/{run_files.CHECKPOINT_DIR}"
AVERAGED_MODEL = f"{RUN_DIR}/{run_files.AVERAGED_MODEL}"
MLFLOW_MODEL = f"{RUN_DIR}/{run_files.MLFLOW_MODEL_FILE}"  # the registered MLflow model's URIs
ALPHA_SELECTION = f"{RUN_DIR}/{run_files.ALPHA_SELECTION_FILE}"  # translate.alpha: auto
HYPOTHESES = RUN_DIR + "/{test_set}.hyp"
SCORES = RUN_DIR + "/{test_set}.scores.json"
RUN_FIGURES_DIR = (
    f"{RUN_DIR}/{run_files.FIGURES_DIR}"  # every PNG here is a figure of the run (report, MLflow)
)
ATTENTION_MAP = RUN_FIGURES_DIR + "/attention_{line}.png"  # line: 1-based line of the test set
ATTENTION_MAP_CSV = RUN_FIGURES_DIR + "/attention_{line}.csv"  # the figure's numbers
REPORT = "results/report.md"
REPORT_TABLE = "results/report_table.csv"  # the report's results table (the report's landing page)
FIGURES_DIR = "results/figures"  # the report's figures: runs/{experiment}/, pairs/{D}_{P}/


def canonical_json(value: Any) -> str:
    """Canonical JSON: equal values give equal strings, so params compare exactly."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def config_error_line(err: Exception) -> str:
    """One line naming the config key at fault, for a ``ConfigError`` or a failed
    ``snakemake.utils.validate`` (a WorkflowError raised while handling the jsonschema error)."""
    causes = (*err.args, err.__cause__, err.__context__)
    error = next((c for c in causes if isinstance(c, jsonschema.ValidationError)), None)
    if error is None:
        return f"config: {err}"
    path = ".".join(str(part) for part in error.absolute_path)
    where = f"{path}: " if path else ""
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(known))
        section = {"model_overrides": "model", "train": "train"}.get(path.rpartition(".")[2])
        removed = removed_key_message(section, unknown) if section else None
        if removed:
            return f"config: {where}{removed}"
        names = ", ".join(f"'{key}'" for key in unknown)
        noun = "key" if len(unknown) == 1 else "keys"
        return f"config: {where}unknown {noun} {names} (known: {', '.join(known)})"
    return f"config: {where}{error.message}"


def rerun_command(configfiles: list[Any], overrides: Mapping[str, Any], repo: str | Path) -> str:
    """The ``snakemake`` command line that re-runs this workflow from a checkout of ``repo``:
    its ``--configfile``s (relative to the checkout when inside it) and ``--config`` values.
    Every job gets it as ``$TRANSFORMER_NMT_RERUN``: MLflow runs show it as their description
    (``transformer_nmt.tracking.stage``)."""
    words = ["snakemake", "--cores", "all"]
    for path in configfiles:
        path = Path(path).absolute()
        if path.is_relative_to(Path(repo).absolute()):
            path = path.relative_to(Path(repo).absolute())
        words += ["--configfile", str(path)]
    if overrides:
        words.append("--config")
        for key, value in overrides.items():
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            words.append(f"{key}={text}")
    return shlex.join(words)


def write_train_config(path: str, settings_json: str, log: str) -> None:
    """The ``train_config`` rule: an experiment's settings (``Pipeline.train_config``, as
    canonical JSON) to the file that ``train --config-file`` reads."""
    write_json(path, json.loads(settings_json))
    Path(log).write_text(f"wrote {path}\n", encoding="utf-8")
