"""Few shapes: training speed, peak memory and distinct batch shapes of the demo
with batch widths rounded up to ``pad_multiple``, in fp32 and bf16-mixed, on this CPU.

What runs: the pipeline's own ``python -m transformer_nmt train`` (what Snakemake runs) on the
demo's Multi30k EN-DE token arrays (built by the pipeline's data stages, ``--data-mirror``),
with the demo's model and train config (``config/config.yaml``) except ``max_steps`` (``--steps``),
``pad_multiple`` and ``precision`` (the grid), and checkpoints/validation only at the end. Each
setting runs ``--runs`` times as a fresh process; the settings alternate within a round and the
round's order rotates (the machine may be shared). Per run: the median of the log windows'
real target tokens/s (the first window, start-up, left out), the same per CPU-second of the
process, and its peak RSS (VmHWM). Per setting: the median over runs, and the distinct
(source, target) batch shapes and the share of computed tokens that are padding in one epoch
(from the training data loader itself, no training). Printed as a table; written to
``benchmarks/out/shapes.json`` with the machine (``harness.machine``), the load average and date.

Usage (repository root, the project's environment):
``python benchmarks/bench_shapes.py --data-mirror ../shared/data [--steps 100] [--runs 2]``
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import harness
from harness import OUT, REPO, Experiment

EXPERIMENT = "multi30k_en_de_tiny"


def epoch_shapes(exp: Experiment, max_tokens: int, pad_multiple: int) -> dict[str, Any]:
    """Distinct (source, target) shapes and padding share of one training epoch's batches."""
    from transformer_nmt.data.datamodule import TranslationDataModule

    dm = TranslationDataModule(
        REPO / exp.bin_dir, exp.src, exp.tgt, max_tokens=max_tokens, pad_multiple=pad_multiple
    )
    shapes: collections.Counter = collections.Counter()
    computed = real = 0
    for batch in dm.dataloader("train", shuffle=True):
        shapes[(tuple(batch["src"].shape), tuple(batch["tgt_in"].shape))] += 1
        computed += batch["src"].numel() + batch["tgt_out"].numel()
        real += int((batch["src"] != 0).sum() + (batch["tgt_out"] != 0).sum())
    return {
        "batches": sum(shapes.values()),
        "distinct_shapes": len(shapes),
        "padding_share": 1 - real / computed,
    }


def train_once(args, exp: Experiment, setting: dict, run_dir: Path) -> dict[str, Any]:
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)
    config = exp.train_config(
        max_steps=args.steps,
        checkpoint_every_steps=args.steps,
        keep_checkpoints=1,
        val_every_steps=args.steps,
        log_every_steps=args.log_every,
        **setting,
    )
    peak: dict[str, int] = {}
    cmd = harness.train_command(exp, run_dir, config)
    row = harness.timed_train(cmd, run_dir, args.threads, args.steps, args.log_every, peak)
    row["peak_rss_bytes"] = peak.get("rss_bytes", 0)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="updates per run (100)")
    parser.add_argument("--runs", type=int, default=2, help="runs per setting (median)")
    parser.add_argument("--log-every", type=int, default=20, help="log window in updates")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pad-multiples", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed"])
    parser.add_argument("--data-mirror", default=os.environ.get("TRANSFORMER_NMT_MIRROR"))
    parser.add_argument("--out", type=Path, default=OUT / "shapes.json")
    args = parser.parse_args()
    if args.steps < 2 * args.log_every:
        parser.error("--steps must be at least two log windows (the first is left out)")

    exp = harness.load_experiment(REPO / "config" / "config.yaml", EXPERIMENT)
    harness.build_data(exp, [], args.data_mirror)
    max_tokens = exp.settings["train"]["max_tokens"]
    shapes = {m: epoch_shapes(exp, max_tokens, m) for m in args.pad_multiples}
    settings = [
        {"pad_multiple": m, "precision": p} for p in args.precisions for m in args.pad_multiples
    ]
    rows: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(settings))}
    load_before = os.getloadavg()
    for r in range(args.runs):
        shift = r % len(settings)
        for i in [*range(shift, len(settings)), *range(shift)]:
            started = time.perf_counter()
            row = train_once(args, exp, settings[i], OUT / "shapes" / f"run{i}")
            row.update(run=r, wall_seconds=time.perf_counter() - started)
            rows[i].append(row)
            print(f"run {r} {settings[i]}: {row['tgt_tokens_per_s']:.0f} tgt tok/s, "
                  f"{row['peak_rss_bytes'] / 2**30:.2f} GiB peak RSS", flush=True)  # fmt: skip

    table = []
    for i, setting in enumerate(settings):
        runs = rows[i]
        table.append({
            **setting,
            "tgt_tokens_per_s": statistics.median(r["tgt_tokens_per_s"] for r in runs),
            "tgt_tokens_per_cpu_s": statistics.median(r["tgt_tokens_per_cpu_s"] for r in runs),
            "peak_rss_gib": max(r["peak_rss_bytes"] for r in runs) / 2**30,
            "final_loss": statistics.median(r["final_loss"] for r in runs),
            **shapes[setting["pad_multiple"]],
        })  # fmt: skip
    reference = table[0]["tgt_tokens_per_s"]
    print(f"\n{args.steps} updates of the demo, median of {args.runs} runs, {args.threads} threads")
    print("| pad_multiple | precision | tgt tok/s | per CPU-s | vs first | peak RSS | loss | "
          "shapes/epoch | padding |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for row in table:
        print(
            f"| {row['pad_multiple']} | {row['precision']} | {row['tgt_tokens_per_s']:.0f} | "
            f"{row['tgt_tokens_per_cpu_s']:.0f} | {row['tgt_tokens_per_s'] / reference:.2f}x | "
            f"{row['peak_rss_gib']:.2f} GiB | {row['final_loss']:.3f} | "
            f"{row['distinct_shapes']} of {row['batches']} | {row['padding_share']:.1%} |"
        )
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": harness.machine(),
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "table": table,
        "runs": {json.dumps(settings[i]): rows[i] for i in rows},
    }
    harness.write_result(args.out, result)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
