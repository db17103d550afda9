"""What the benchmarks that train and score an experiment of a config share: the experiment's
data files as the pipeline lays them out, reading the experiment, and building its data with
the pipeline's own rules. ``benchmarks/`` is not a package: scripts put their own directory on
``sys.path`` and import this module; it imports no benchmark script (no circle).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent

# --- the pipeline's file layout (transformer_nmt.experiments.paths, the Snakefile's templates) --

sys.path[:0] = [str(REPO / "src")]
from transformer_nmt.experiments import paths as layout  # noqa: E402


def data_paths(exp: dict[str, Any]) -> dict[str, Any]:
    """Paths of an experiment's data files, relative to the repository root."""
    where = {"dataset": exp["dataset"], "pair": exp["pair"]}
    src, tgt = exp["pair"].split("-")
    return {
        "src": src,
        "tgt": tgt,
        "spm": layout.SPM_MODEL.format(**where),
        "bin_dir": layout.BIN_DIR.format(**where),
        "clean_report": layout.CLEAN_REPORT.format(**where),
        "bins": [
            template.format(**where, split=split, lang=lang)
            for split in ("train", "valid")
            for lang in (src, tgt)
            for template in (layout.TOKENS, layout.OFFSETS)
        ],
        "text": lambda split, lang: layout.TEXT_FILE.format(**where, split=split, lang=lang),
    }


def load_experiment(config_path: Path, name: str | None) -> tuple[str, dict[str, Any]]:
    with open(config_path, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    experiments = config.get("experiments") or {}
    if name is None:
        if len(experiments) != 1:
            sys.exit(f"{config_path} has {len(experiments)} experiments: name one (--experiment)")
        name = next(iter(experiments))
    if name not in experiments:
        sys.exit(f"no experiment {name!r} in {config_path}; it has {sorted(experiments)}")
    return name, experiments[name]


def build_data(config_path: Path, paths: dict[str, Any], sets: list[str], mirror: str | None):
    targets = [paths["spm"], paths["clean_report"], *paths["bins"]]
    targets += [paths["text"](s, lang) for s in sets for lang in (paths["src"], paths["tgt"])]
    # Options taking lists first: "--cores N" ends them before the targets.
    cmd = [sys.executable, "-m", "snakemake", "--configfile", str(config_path)]
    if mirror:
        cmd += ["--config", f"data_mirror={mirror}"]
    cmd += ["--quiet", "rules", "--cores", str(os.cpu_count() or 1), *targets]
    subprocess.run(cmd, cwd=REPO, check=True)


def train_settings(train: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """An experiment's train settings with a benchmark's ``overrides``, which also win over its
    ``train.by_precision`` entries: a benchmark's own step counts hold in every precision, and
    an entry stays (emptied) so that ``precision: auto`` still chooses as the config does."""
    by_precision = {
        precision: {key: value for key, value in values.items() if key not in overrides}
        for precision, values in (train.get("by_precision") or {}).items()
    }
    return {**train, **overrides, "by_precision": by_precision}
