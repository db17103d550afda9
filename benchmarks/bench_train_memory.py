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

from common import data_paths, layout, train_settings
from stage_process import machine

OUT = Path(__file__).resolve().parent / "out" / "train_memory.json"
WINDOW = re.compile(r"tgt tok/s (\d+)")


def cut_config(config: dict, steps: int) -> dict:
    """The run's config for ``steps`` updates in every precision (``common.train_settings``):
    one validation, at the end, without the beam-search dev BLEU (its decoding is not the train
    step measured here), and a cool-down of a quarter of them where the run has one."""
    train = config["train"]
    overrides: dict = {"max_steps": steps, "val_every_steps": steps}
    entries = [train, *(train.get("by_precision") or {}).values()]
    if any(entry.get("lr_cooldown_steps") for entry in entries):
        overrides["lr_cooldown_steps"] = max(1, steps // 4)
    if any(entry.get("val_beam_bleu_every_steps") for entry in entries):
        overrides["val_beam_bleu_every_steps"] = None
    return {**config, "train": train_settings(train, **overrides)}


def train_once(
    workdir: Path, experiment: str, dataset: str, pair: str, steps: int, tracking: bool
) -> dict:
    paths = data_paths({"dataset": dataset, "pair": pair})  # relative to the DAG's directory
    config = json.loads((workdir / layout.TRAIN_CONFIG.format(experiment=experiment)).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        config_file = Path(tmp) / "train_config.json"
        config_file.write_text(json.dumps(cut_config(config, steps)))
        command = [
            sys.executable, "-m", "transformer_nmt", "train",
            "--bin-dir", str(workdir / paths["bin_dir"]),
            "--spm-model", str(workdir / paths["spm"]),
            "--src", paths["src"], "--tgt", paths["tgt"], "--run-dir", str(run_dir),
            "--config-file", str(config_file),
            "--clean-report", str(workdir / paths["clean_report"]),
        ]  # fmt: skip
        if tracking:
            command += ["--mlflow-experiment", f"{dataset}_{pair}", "--mlflow-run", experiment,
                        "--mlflow-run-dir", str(run_dir)]  # fmt: skip
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
        log = Path(tmp) / "train.log"
        start = time.perf_counter()
        with open(log, "w") as handle:
            child = subprocess.Popen(command, cwd=tmp, env=env, stdout=handle, stderr=handle)
            _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        text = log.read_text()
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"the training failed (exit status {status}); its log:\n{text[-3000:]}")
    windows = [int(v) for v in WINDOW.findall(text)]
    return {
        "experiment": experiment,
        "steps": steps,
        "tracking": tracking,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "tgt_tokens_per_s": statistics.median(windows) if windows else float("nan"),
        "wall_s": wall,
        "released_freed_pages": "(malloc_trim)" in text,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True,
                        help="the working directory of a finished DAG (its results/)")  # fmt: skip
    parser.add_argument("--experiment", default="multi30k_en_de_tiny")
    parser.add_argument("--dataset", default="multi30k")
    parser.add_argument("--pair", default="en-de")
    parser.add_argument("--steps", type=int, default=450)
    parser.add_argument("--no-tracking", action="store_true", help="train without MLflow")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    config = args.workdir / layout.TRAIN_CONFIG.format(experiment=args.experiment)
    if not config.is_file():
        sys.exit(f"{config}: no such file; give --workdir a finished DAG's directory")
    row = train_once(
        args.workdir, args.experiment, args.dataset, args.pair, args.steps, not args.no_tracking
    )
    print(
        f"{row['experiment']}, {row['steps']} updates: peak RSS {row['peak_rss_mb']:.0f} MB, "
        f"{row['tgt_tokens_per_s']:.0f} tgt tok/s (median window), {row['wall_s']:.1f} s"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine(), "rows": [row]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
