"""Peak memory and time of the §3.4 output projection + §5.4 label-smoothed loss, forward and
backward, computed at once (the paper's path) or ``train.loss_chunk_tokens`` at a time.

The part of a training step whose memory grows with tokens x vocabulary: the decoder output
[tokens, d_model] times the [V, d_model] (shared) embedding matrix gives [tokens, V] logits,
of which autograd keeps float32 copies. Each variant runs in a fresh process and reports the
growth of its peak resident memory (``ru_maxrss``) during one forward + backward, beyond the
inputs, weights and gradient buffers (allocated before measuring), and the best-of-``--repeats``
wall time (measured after the peak, in the same process).

Usage: ``python benchmarks/bench_loss_memory.py [--tokens 4096] [--vocab 37000]
[--chunks 0 1024 256]`` (0 = all at once); prints a table and writes
``benchmarks/out/loss_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out" / "loss_memory.json"


def child(tokens: int, vocab: int, d_model: int, chunk: int, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F

    from transformer_nmt.training.objective import (
        chunked_label_smoothed_cross_entropy,
        label_smoothed_cross_entropy,
    )

    torch.manual_seed(0)
    weight = (torch.randn(vocab, d_model) * d_model**-0.5).requires_grad_()  # [V, d_model]
    hidden = torch.randn(1, tokens, d_model, requires_grad=True)  # [B=1, T, d_model]
    target = torch.randint(4, vocab, (1, tokens))

    def project(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)

    def step() -> float:
        if chunk:
            out = chunked_label_smoothed_cross_entropy(
                hidden, project, target, chunk_tokens=chunk, eps=0.1, pad_id=0
            )
        else:
            out = label_smoothed_cross_entropy(project(hidden), target, eps=0.1, pad_id=0)
        out.loss.backward()
        return float(out.loss)

    weight.grad = torch.zeros_like(weight)  # gradient buffers exist in training anyway
    hidden.grad = torch.zeros_like(hidden)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    loss = step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return {"chunk_tokens": chunk, "peak_growth_mib": (peak - before) / 1024, "seconds": best,
            "loss": loss}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096, help="target tokens in the batch")
    parser.add_argument("--vocab", type=int, default=37000, help="V (WMT en-de: 37k)")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 1024, 256])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        import torch

        torch.set_num_threads(args.threads)
        row = child(args.tokens, args.vocab, args.d_model, args.child, args.repeats)
        print(json.dumps(row))
        return

    load = [os.getloadavg()[0]]
    rows = []
    logits_mib = args.tokens * args.vocab * 4 / 2**20
    print(
        f"{args.tokens} tokens x {args.vocab} vocabulary: one fp32 logits copy {logits_mib:.0f} MiB"
    )
    print(f"{'chunk':>7} {'peak growth MiB':>16} {'seconds':>9} {'loss':>12}")
    for chunk in args.chunks:
        command = [sys.executable, __file__, "--tokens", str(args.tokens), "--vocab",
                   str(args.vocab), "--d-model", str(args.d_model), "--repeats",
                   str(args.repeats), "--threads", str(args.threads),
                   "--child", str(chunk)]  # fmt: skip
        result = subprocess.run(command, check=True, capture_output=True, text=True)
        row = json.loads(result.stdout.strip().splitlines()[-1])
        rows.append(row)
        name = "all" if chunk == 0 else str(chunk)
        print(
            f"{name:>7} {row['peak_growth_mib']:>16.0f} {row['seconds']:>9.2f} {row['loss']:>12.1f}"
        )
        load.append(os.getloadavg()[0])
    meta = {"tokens": args.tokens, "vocab": args.vocab, "d_model": args.d_model,
            "logits_mib_fp32": logits_mib, "threads": args.threads,
            "machine": platform.machine(), "load_average_1min": load}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"1-min load average: {min(load):.1f} to {max(load):.1f}; wrote {args.out}")


if __name__ == "__main__":
    main()
