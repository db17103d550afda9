"""Where one training step's time goes: torch profiler over the bench_training step.

Runs the step of ``bench_training.py`` (forward, label-smoothed loss, backward, Adam, schedule)
for ``--preset`` under ``torch.profiler`` and prints the top kernels/operators by self device
time (CUDA) or self CPU time, grouped into coarse classes (matrix products, attention,
elementwise/normalisation, optimizer, loss/softmax). Writes ``benchmarks/out/profile_<preset>.json``
(the table) and, with ``--trace``, a Chrome trace beside it.

    python benchmarks/profile_training_step.py --preset big --max-tokens 25000
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training import make_step  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent / "out"

# Coarse classes by kernel/operator name: the order matters (first match wins).
CLASSES = [
    ("attention", re.compile(r"flash|fmha|attention|sdpa|efficient_attention", re.I)),
    ("matmul", re.compile(r"gemm|matmul|addmm|\bmm\b|bmm|cutlass|sm90_xmma|nvjet|cublas", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach", re.I)),
    ("loss/softmax", re.compile(r"softmax|log_softmax|nll|cross_entropy", re.I)),
    (
        "norm/dropout/elementwise",
        re.compile(r"norm|dropout|elementwise|vectorized|reduce|copy", re.I),
    ),
]


def classify(name: str) -> str:
    for label, pattern in CLASSES:
        if pattern.search(name):
            return label
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="big")
    parser.add_argument("--max-tokens", type=int, default=25_000)
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (after 3 warm-up)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--trace", action="store_true", help="also write a Chrome trace")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    step, _ = make_step(args.preset, device=device, bf16=True, max_tokens=args.max_tokens)
    for _ in range(3):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        if device == "cuda":
            torch.cuda.synchronize()

    events = prof.key_averages()
    use_device = device == "cuda"

    def self_us(e) -> float:
        return (e.self_device_time_total if use_device else e.self_cpu_time_total) / args.steps

    # Device kernels have no CPU self time and vice versa: keep the side that ran the work.
    rows = [(e.key, self_us(e), e.count // args.steps) for e in events if self_us(e) > 0]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    by_class: dict[str, float] = {}
    for name, us, _ in rows:
        by_class[classify(name)] = by_class.get(classify(name), 0.0) + us

    print(f"{args.preset} on {device}, {args.max_tokens} tokens/batch: {total / 1e3:.1f} ms/step")
    print(f"{'share':>6} {'ms/step':>8} {'calls':>6}  kernel / operator")
    for name, us, calls in rows[: args.top]:
        print(f"{100 * us / total:>5.1f}% {us / 1e3:>8.2f} {calls:>6}  {name[:110]}")
    print("\nby class:")
    for label, us in sorted(by_class.items(), key=lambda kv: -kv[1]):
        print(f"{100 * us / total:>5.1f}% {us / 1e3:>8.2f}  {label}")

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = OUT_DIR / f"profile_{args.preset}.json"
    out.write_text(
        json.dumps(
            {
                "preset": args.preset,
                "device": torch.cuda.get_device_name() if use_device else "cpu",
                "max_tokens": args.max_tokens,
                "ms_per_step": total / 1e3,
                "by_class_ms": {k: v / 1e3 for k, v in by_class.items()},
                "top": [{"name": n, "ms": us / 1e3, "calls": c} for n, us, c in rows[: args.top]],
            },
            indent=2,
        )
        + "\n"
    )
    if args.trace:
        prof.export_chrome_trace(str(OUT_DIR / f"trace_{args.preset}.json"))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
