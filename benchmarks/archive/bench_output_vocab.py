"""What a smaller output vocabulary would buy a training step: a bare step (forward, §5.4 loss,
backward, Adam) of an experiment's model at several vocabulary sizes, in alternating rounds in
one process, under bf16 autocast where ``--precision bf16`` (the CPU demo's sizing on a CPU with
bf16).

The lever it bounds is a §3.4 projection and softmax over the target side's pieces only (the
demo's German side uses 5,331 of its 8,000 joint pieces). A model with a smaller vocabulary also
shrinks the source embedding, its gradient and Adam's update over it, so the ratio printed is a
bound from above for that lever, not its measurement::

    python benchmarks/bench_output_vocab.py --vocab 8000 5331 --rounds 4

The step is ``bench_training.make_step``'s (one batch of random tokens, ``max_tokens`` //
``--length`` rows of ``--length`` tokens, each row's real length uniform in [L/2, L]), with the
experiment's model and each vocabulary size. Prints one
row per size (ms per step of each round, the median, the ratio to the first size's median) and
writes ``benchmarks/out/output_vocab.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training import make_step  # noqa: E402
from common import REPO, load_experiment  # noqa: E402

from transformer_nmt.model import apply_overrides, get_preset  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "output_vocab.json"


def seconds_per_step(step, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "config" / "config.yaml")
    parser.add_argument("--experiment", default=None, help="default: the config's only one")
    parser.add_argument("--vocab", type=int, nargs="+", default=[8000, 5331])
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--length", type=int, default=16, help="tokens per row (L)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="steps per round and size")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    name, exp = load_experiment(args.config, args.experiment)
    cfg = apply_overrides(get_preset(exp["preset"]), exp.get("model_overrides") or {})
    max_tokens = int(exp["train"]["max_tokens"])
    rows = max(1, max_tokens // args.length)
    bf16 = args.precision == "bf16"
    setups = {
        v: make_step(exp["preset"], device="cpu", bf16=bf16, max_tokens=max_tokens,
                     length=args.length, padded=True, cfg=cfg, vocab=v)[0]
        for v in args.vocab
    }  # fmt: skip
    for v in args.vocab:  # warm-up: kernels and allocator
        seconds_per_step(setups[v], 3)
    times: dict[int, list[float]] = {v: [] for v in args.vocab}
    for _ in range(args.rounds):
        for v in args.vocab:
            times[v].append(seconds_per_step(setups[v], args.steps))

    first = statistics.median(times[args.vocab[0]])
    print(f"{name}: d_model {cfg.d_model}, N {cfg.N}, d_ff {cfg.d_ff}, {rows} x {args.length}, "
          f"{args.precision}, {torch.get_num_threads()} threads")  # fmt: skip
    print(f"{'vocabulary':>10}  {'ms per step, each round':<36}  {'median':>7}  {'ratio':>5}")
    rows_out = []
    for v in args.vocab:
        median = statistics.median(times[v])
        each = " ".join(f"{t * 1e3:.1f}" for t in times[v])
        print(f"{v:>10}  {each:<36}  {median * 1e3:7.1f}  {median / first:5.2f}")
        ratios = [t / f for t, f in zip(times[v], times[args.vocab[0]], strict=True)]
        rows_out.append({"vocab": v, "ms_per_step": [t * 1e3 for t in times[v]],
                         "median_ms": median * 1e3, "ratio_to_first": median / first,
                         "round_ratios": ratios})  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "experiment": name, "precision": args.precision, "rows": rows, "length": args.length,
        "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "load_before": os.getloadavg()[0], "results": rows_out,
    }, indent=2) + "\n")  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
