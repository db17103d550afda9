"""Few shapes (issue 20 §1): training speed, peak memory and distinct batch shapes of the demo
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
``benchmarks/out/shapes.json`` with the CPU model, its bf16 flags, the load average and date.

Usage (repository root, the project's environment):
``python benchmarks/bench_shapes.py --data-mirror ../shared/data [--steps 100] [--runs 2]``
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peer_training import OURS_LINE, run, summarise  # noqa: E402
from common import build_data, data_paths, load_experiment, train_settings  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
EXPERIMENT = "multi30k_en_de_tiny"


def cpu_description() -> dict[str, Any]:
    """The CPU model and which bf16 instructions it has (/proc/cpuinfo)."""
    model, flags = platform.processor() or "unknown", set()
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name") and model in ("unknown", ""):
                model = row.split(":", 1)[1].strip()
            if row.startswith("flags"):
                flags = set(row.split(":", 1)[1].split())
    except OSError:
        pass
    bf16 = sorted(flags & {"amx_bf16", "avx512_bf16", "avx2"})
    return {"model": model, "flags": bf16, "cores": os.cpu_count()}


def epoch_shapes(paths: dict[str, Any], max_tokens: int, pad_multiple: int) -> dict[str, Any]:
    """Distinct (source, target) shapes and padding share of one training epoch's batches."""
    from transformer_nmt.data.datamodule import TranslationDataModule

    dm = TranslationDataModule(
        REPO / paths["bin_dir"], paths["src"], paths["tgt"], max_tokens=max_tokens,
        pad_multiple=pad_multiple,
    )  # fmt: skip
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


def train_once(args, exp: dict[str, Any], paths, setting: dict, run_dir: Path) -> dict[str, Any]:
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)
    model = {"preset": exp["preset"], "overrides": exp.get("model_overrides", {})}
    train = train_settings(
        exp["train"],
        max_steps=args.steps,
        checkpoint_every_steps=args.steps,
        keep_checkpoints=1,
        val_every_steps=args.steps,
        log_every_steps=args.log_every,
        **setting,
    )
    cmd = [
        sys.executable, "-m", "transformer_nmt", "train", "--bin-dir", paths["bin_dir"],
        "--spm-model", paths["spm"], "--src", paths["src"], "--tgt", paths["tgt"],
        "--run-dir", str(run_dir), "--model", json.dumps(model), "--train", json.dumps(train),
    ]  # fmt: skip
    peak: dict[str, int] = {}
    log, cpu = run(cmd, run_dir, args.threads, OURS_LINE, peak)
    windows = [
        {"step": int(m[1]), "loss": float(m[2]), "tgt_tokens_per_s": float(m[3])}
        for m in OURS_LINE.finditer(log)
    ]
    summary = json.loads((run_dir / "train_summary.json").read_text(encoding="utf-8"))
    tgt_per_batch = summary["train_tokens_this_job"]["tgt"] / summary["final_step"]
    for w in windows:
        w["tgt_tokens"] = tgt_per_batch * args.log_every
    row = summarise(windows, cpu, args, tgt_per_batch)
    row.update(peak_rss_bytes=peak.get("rss_bytes", 0), precision=summary["precision"])
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

    config_path = REPO / "config" / "config.yaml"
    _, exp = load_experiment(config_path, EXPERIMENT)
    paths = data_paths(exp)
    build_data(config_path, paths, [], args.data_mirror)
    max_tokens = exp["train"]["max_tokens"]
    shapes = {m: epoch_shapes(paths, max_tokens, m) for m in args.pad_multiples}
    settings = [
        {"pad_multiple": m, "precision": p} for p in args.precisions for m in args.pad_multiples
    ]
    rows: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(settings))}
    load_before = os.getloadavg()
    for r in range(args.runs):
        shift = r % len(settings)
        for i in [*range(shift, len(settings)), *range(shift)]:
            started = time.perf_counter()
            row = train_once(args, exp, paths, settings[i], OUT / "shapes" / f"run{i}")
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
        "cpu": cpu_description(),
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "table": table,
        "runs": {json.dumps(settings[i]): rows[i] for i in rows},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
