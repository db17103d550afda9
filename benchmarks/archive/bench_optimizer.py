"""The §5.3 Adam update: PyTorch's default multi-tensor ("foreach") path against its fused kernel,
on one preset's parameters (what ``training.objective.FUSED_ADAM_DEVICES`` decides).

Both optimizers hold the same random gradients; their steps alternate (A, B, A, B, ...) in one
process so that a shared machine's drift hits both alike; the median step time of each and the
ratio foreach / fused are printed and written to ``benchmarks/out/optimizer.json``.

Usage: ``python benchmarks/bench_optimizer.py [--presets tiny base] [--repeats 10]
[--threads 1]`` (repository root, ``PYTHONPATH=src``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from transformer_nmt.io_utils import write_json
from transformer_nmt.model.config import get_preset
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.training.optimizer import build_optimizer

OUT = Path(__file__).resolve().parent / "out" / "optimizer.json"
VOCAB = {"tiny": 8000, "base": 37000, "big": 37000}


def optimizer_for(preset: str, fused: bool | None) -> torch.optim.Adam:
    torch.manual_seed(0)
    model = Transformer(get_preset(preset), vocab_size=VOCAB[preset], pad_id=0)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    return build_optimizer(model.parameters(), fused=fused)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "base"])
    parser.add_argument("--repeats", type=int, default=10, help="timed steps of each")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    rows = []
    for preset in args.presets:
        optimizers = {"foreach": optimizer_for(preset, None), "fused": optimizer_for(preset, True)}
        params = sum(p.numel() for g in optimizers["fused"].param_groups for p in g["params"])
        times: dict[str, list[float]] = {name: [] for name in optimizers}
        for optimizer in optimizers.values():
            optimizer.step()  # warm-up: allocates the moments
        for _ in range(args.repeats):
            for name, optimizer in optimizers.items():
                start = time.perf_counter()
                optimizer.step()
                times[name].append(time.perf_counter() - start)
        row = {
            "preset": preset,
            "parameters": params,
            "foreach_ms": 1000 * statistics.median(times["foreach"]),
            "fused_ms": 1000 * statistics.median(times["fused"]),
        }
        row["foreach_over_fused"] = row["foreach_ms"] / row["fused_ms"]
        rows.append(row)
    print(f"{'preset':<6} {'params':>12} {'foreach ms':>11} {'fused ms':>9} {'ratio':>6}")
    for r in rows:
        print(
            f"{r['preset']:<6} {r['parameters']:>12,} {r['foreach_ms']:>11.1f} "
            f"{r['fused_ms']:>9.1f} {r['foreach_over_fused']:>5.2f}x"
        )
    meta = {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": args.threads,
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    write_json(args.out, {"meta": meta, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
