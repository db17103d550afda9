"""Peak memory and speed of one train stage: a finished DAG's experiment trained again for a few
hundred updates, as the Snakefile runs it (MLflow on, a SQLite store), in a fresh directory.

The train stage is the largest process of a DAG (``make bench``'s peak RSS is its), and its
resident memory stops growing once the epoch's batch widths have all been seen (the demo:
~400 updates). This script runs ``python -m transformer_nmt train`` on the experiment's own
``train_config.json`` cut to ``--steps`` updates (the warm-up kept, the cool-down and the one
validation moved into them: ``cut_config``) and writes one row: the child's peak RSS
(``wait4``), its wall time and the median of its ``tgt tok/s`` log windows. Run it through
``bench_ab.py`` to compare two source trees interleaved, e.g. the checkout before a memory
change (``git archive <commit> src | tar -x -C /tmp/base``)::

    python benchmarks/bench_ab.py --a /tmp/base/src --b src --repeats 3 \\
        --metric peak_rss_mb tgt_tokens_per_s --key experiment -- \\
        benchmarks/bench_train_memory.py --workdir <a demo DAG's directory>

The experiment's files are the pipeline's for its config (``--config``, default: the repository's
config that has ``--experiment``: config/config.yaml, else one of config/experiments/).
``--settings-from`` trains another recipe's model and train keys on those files instead (e.g.
WMT14's ``big`` on a Multi30k DAG's data), and each ``--set KEY=VALUE ...`` is one more row,
those dotted keys of the run's config set (``train.fused_loss=false``; ``--common``: every
row's). On a CUDA device each row also gives the child's peak GPU memory
(``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` at its exit, read by a
``sitecustomize`` hook this script puts first on the child's path) and the loss's path that the
train log names. E.g. the fused loss against the eager one in WMT14's big on one GPU::

    python benchmarks/bench_train_memory.py --workdir <a Multi30k DAG's directory> \
        --experiment multi30k_en_de_base --settings-from config/experiments/wmt14_en_de_big.yaml \
        --steps 200 --set train.fused_loss=auto --set train.fused_loss=false

Writes ``benchmarks/out/train_memory.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
from harness import REPO, Experiment

from transformer_nmt.runs.layout import SUMMARY_FILE

OUT = harness.OUT / "train_memory.json"
WINDOW = re.compile(r"tgt tok/s (\d+)")
LOSS_PATH = re.compile(r"loss \(§5\.4\): (\w+)")
# The child's peak GPU memory at its exit, where it used CUDA (the train stage runs unchanged).
CUDA_PEAK_HOOK = """
import atexit, json, os, sys

def _cuda_peak():
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    with open(os.environ["BENCH_CUDA_PEAK_FILE"], "w") as out:
        json.dump({"allocated": torch.cuda.max_memory_allocated(),
                   "reserved": torch.cuda.max_memory_reserved()}, out)

atexit.register(_cuda_peak)
"""


def cut_config(config: dict, steps: int) -> dict:
    """The run's config for ``steps`` updates in every precision (``harness.train_settings``):
    one validation, at the end, without the beam-search dev BLEU (its decoding is not the train
    step measured here), and a cool-down of a quarter of them where the run has one."""
    train = config["train"]
    overrides: dict = {"max_steps": steps, "val_every_steps": steps}
    entries = [train, *(train.get("by_precision") or {}).values()]
    if any(entry.get("lr_cooldown_steps") for entry in entries):
        overrides["lr_cooldown_steps"] = max(1, steps // 4)
    if any(entry.get("val_beam_bleu_every_steps") for entry in entries):
        overrides["val_beam_bleu_every_steps"] = None
    return {**config, "train": harness.train_settings(train, **overrides)}


def with_settings(config: dict, settings: list[tuple[str, object]]) -> dict:
    """The run's config with dotted settings: ``train.KEY`` (winning over ``by_precision``,
    ``harness.train_settings``) and ``model.preset`` / ``model.overrides.KEY``."""
    config = copy.deepcopy(config)
    train = {}
    for key, value in settings:
        words = key.split(".")
        if words[0] == "train" and len(words) == 2:
            train[words[1]] = value
        elif words[:2] == ["model", "preset"] and len(words) == 2:
            config["model"]["preset"] = value
        elif words[:2] == ["model", "overrides"] and len(words) == 3:
            config["model"]["overrides"] = {**config["model"].get("overrides", {}), words[2]: value}
        else:
            sys.exit(f"{key}: not train.KEY, model.preset or model.overrides.KEY")
    if train:
        config["train"] = harness.train_settings(config["train"], **train)
    return config


def train_once(
    workdir: Path, exp: Experiment, steps: int, tracking: bool, config: dict | None = None
) -> dict:
    """The experiment trained again for ``steps`` updates in the DAG's ``workdir``, from
    ``config`` (default: its own ``train_config.json``), cut, in a fresh run directory and
    MLflow store."""
    if config is None:
        config = json.loads((workdir / exp.train_config_file).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = harness.train_command(exp, run_dir, cut_config(config, steps), tracking)
        hook = Path(tmp) / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(CUDA_PEAK_HOOK)
        peak_file = Path(tmp) / "cuda_peak.json"
        path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db",
               "PYTHONPATH": path, "BENCH_CUDA_PEAK_FILE": str(peak_file)}  # fmt: skip
        log = Path(tmp) / "train.log"
        start = time.perf_counter()
        with open(log, "w") as handle:  # the data paths are relative to the DAG's directory
            child = subprocess.Popen(command, cwd=workdir, env=env, stdout=handle, stderr=handle)
            _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        text = log.read_text()
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"the training failed (exit status {status}); its log:\n{text[-3000:]}")
        cuda = json.loads(peak_file.read_text()) if peak_file.exists() else {}
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    windows = [int(v) for v in WINDOW.findall(text)]
    gib = 1024**3
    return {
        "experiment": exp.name,
        "model": config["model"],
        "steps": steps,
        "tracking": tracking,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "cuda_peak_allocated_gib": cuda["allocated"] / gib if cuda else None,
        "cuda_peak_reserved_gib": cuda["reserved"] / gib if cuda else None,
        "tgt_tokens_per_s": statistics.median(windows) if windows else float("nan"),
        "loss_path": (LOSS_PATH.findall(text) or [None])[0],
        "precision": summary.get("precision"),
        "max_tokens": summary["train_config"]["max_tokens"],
        "accumulation": summary.get("accumulate_grad_batches"),
        "wall_s": wall,
        "released_freed_pages": "(malloc_trim)" in text,
    }


def config_with(experiment: str) -> Path:
    """The repository's config that has ``experiment`` (or the seeded one it is a run of)."""
    import yaml

    configs = [
        REPO / "config" / "config.yaml",
        *sorted((REPO / "config" / "experiments").glob("*.yaml")),
    ]
    for path in configs:
        experiments = yaml.safe_load(path.read_text(encoding="utf-8")).get("experiments") or {}
        if experiment.split(".seed")[0] in experiments:
            return path
    sys.exit(f"no config of the repository has experiment {experiment!r}: give --config")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True,
                        help="the working directory of a finished DAG (its results/)")  # fmt: skip
    parser.add_argument("--experiment", default="multi30k_en_de_tiny")
    parser.add_argument(
        "--config", type=Path, help="the DAG's config (default: the repository's that has it)"
    )
    parser.add_argument("--dataset", help="(the experiment's, from its config)")
    parser.add_argument("--pair", help="(the experiment's, from its config)")
    parser.add_argument("--steps", type=int, default=450)
    parser.add_argument("--no-tracking", action="store_true", help="train without MLflow")
    parser.add_argument(
        "--settings-from", type=Path, metavar="RECIPE",
        help="train this recipe's model and train keys (its only experiment) on the DAG's data",
    )  # fmt: skip
    parser.add_argument(
        "--set", nargs="+", action="append", metavar="KEY=VALUE", dest="rows",
        help="one row with these keys set (train.KEY, model.preset, model.overrides.KEY); "
        "repeat for more rows",
    )  # fmt: skip
    parser.add_argument("--common", nargs="+", default=[], metavar="KEY=VALUE",
                        help="keys set in every row")  # fmt: skip
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    exp = harness.load_experiment(args.config or config_with(args.experiment), args.experiment)
    for key in ("dataset", "pair"):
        if getattr(args, key) not in (None, exp.settings[key]):
            sys.exit(f"--{key} {getattr(args, key)}: {exp.name}'s is {exp.settings[key]}")
    workdir = args.workdir.resolve()
    if not (workdir / exp.train_config_file).is_file():
        sys.exit(
            f"{workdir}: no {exp.train_config_file}; give --workdir a finished DAG's directory"
        )
    config = json.loads((workdir / exp.train_config_file).read_text())
    if args.settings_from:
        config = harness.load_experiment(args.settings_from).train_config()
    common = harness.key_values(args.common, "--common")
    rows = []
    for items in args.rows or [[]]:
        settings = common + harness.key_values(items, "--set")
        row = train_once(
            workdir, exp, args.steps, not args.no_tracking, with_settings(config, settings)
        )
        row["settings"] = dict(settings)
        cuda = row["cuda_peak_allocated_gib"]
        print(
            f"{row['experiment']} {' '.join(items)}, {row['steps']} updates: peak RSS "
            f"{row['peak_rss_mb']:.0f} MB"
            + ("" if cuda is None else f", peak GPU memory {cuda:.2f} GiB allocated")
            + f", {row['tgt_tokens_per_s']:.0f} tgt tok/s (median window), loss "
            f"{row['loss_path']}, {row['wall_s']:.1f} s"
        )
        rows.append(row)
    harness.write_result(args.out, {"machine": harness.machine(), "rows": rows})


if __name__ == "__main__":
    main()
