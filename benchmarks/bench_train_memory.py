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
Writes ``benchmarks/out/train_memory.json`` (``--out``).
"""

from __future__ import annotations

import argparse
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

OUT = harness.OUT / "train_memory.json"
WINDOW = re.compile(r"tgt tok/s (\d+)")


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


def train_once(workdir: Path, exp: Experiment, steps: int, tracking: bool) -> dict:
    """The experiment trained again for ``steps`` updates in the DAG's ``workdir``, from its own
    ``train_config.json`` (cut), in a fresh run directory and MLflow store."""
    config = json.loads((workdir / exp.train_config_file).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = harness.train_command(exp, run_dir, cut_config(config, steps), tracking)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
        log = Path(tmp) / "train.log"
        start = time.perf_counter()
        with open(log, "w") as handle:  # the data paths are relative to the DAG's directory
            child = subprocess.Popen(command, cwd=workdir, env=env, stdout=handle, stderr=handle)
            _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        text = log.read_text()
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"the training failed (exit status {status}); its log:\n{text[-3000:]}")
    windows = [int(v) for v in WINDOW.findall(text)]
    return {
        "experiment": exp.name,
        "steps": steps,
        "tracking": tracking,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "tgt_tokens_per_s": statistics.median(windows) if windows else float("nan"),
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
    row = train_once(workdir, exp, args.steps, not args.no_tracking)
    print(
        f"{row['experiment']}, {row['steps']} updates: peak RSS {row['peak_rss_mb']:.0f} MB, "
        f"{row['tgt_tokens_per_s']:.0f} tgt tok/s (median window), {row['wall_s']:.1f} s"
    )
    harness.write_result(args.out, {"machine": harness.machine(), "rows": [row]})


if __name__ == "__main__":
    main()
