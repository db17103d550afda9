"""R-Drop's cost (``train.rdrop_alpha``): its consistency term written out
(``objective.symmetric_kl``) against autograd through log_softmax, and a whole training step
of the CPU recipe's model with R-Drop against one without.

Rows, alternating A, B, A, B, ... in one process so that a shared machine's drift hits all
alike; median milliseconds of forward + backward (+ Adam for the steps):
- ``kl written out`` / ``kl autograd``: the symmetric KL of two passes' bf16 logits
  [2 x rows, V], and ``cross-entropy``: §5.4's loss of the same [2 x rows, V] logits;
- ``step plain``: the recipe's model (``config/experiments/multi30k_en_de_cpu.yaml``'s shape)
  on ``--tokens`` target tokens, bf16 autocast; ``step rdrop``: on half as many, twice over
  (R-Drop's rows), alpha 5.

Usage: ``python benchmarks/bench_rdrop.py [--rows 2048] [--vocab 8000] [--tokens 4096]
[--repeats 8] [--threads 2]`` (repository root, ``PYTHONPATH=src``); writes
``benchmarks/out/rdrop.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from transformer_nmt.io_utils import write_json
from transformer_nmt.model.config import apply_overrides, get_preset
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.training.objective import (
    label_smoothed_cross_entropy,
    model_loss,
    symmetric_kl,
)
from transformer_nmt.training.optimizer import build_optimizer

OUT = Path(__file__).resolve().parent / "out" / "rdrop.json"
# the CPU recipe's model_overrides (config/experiments/multi30k_en_de_cpu.yaml)
RECIPE_MODEL = {"norm_first": True, "d_model": 128, "N": 4, "d_ff": 256, "d_k": 32, "d_v": 32,
                "p_drop": 0.3}  # fmt: skip
WIDTH = 16  # tokens per sentence of the step's random batches (Multi30k's are ~13-15)


def _autograd_kl(logits: torch.Tensor) -> torch.Tensor:
    """The reference: sum_k (p_1 - p_2)(log p_1 - log p_2) through autograd, float32."""
    log_p1, log_p2 = logits.float().log_softmax(dim=-1).chunk(2)
    return ((log_p1.exp() - log_p2.exp()) * (log_p1 - log_p2)).sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2048, help="target tokens of one pass")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--tokens", type=int, default=4096, help="the plain step's tokens")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    torch.manual_seed(0)
    logits = (3 * torch.randn(2 * args.rows, args.vocab)).bfloat16().requires_grad_(True)
    target = torch.randint(4, args.vocab, (1, 2 * args.rows))
    keep = torch.ones(args.rows, dtype=torch.bool)

    cfg = apply_overrides(get_preset("tiny"), RECIPE_MODEL)
    model = Transformer(cfg, vocab_size=args.vocab, pad_id=0).train()
    optimizer = build_optimizer(model.parameters())
    for group in optimizer.param_groups:
        group["lr"] = 1e-4  # a trained-like scale: lr 1 (no schedule) blows the logits up

    def batch(tokens: int) -> dict[str, torch.Tensor]:
        return {k: torch.randint(4, args.vocab, (tokens // WIDTH, WIDTH)) for k in
                ("src", "tgt_in", "tgt_out")}  # fmt: skip

    plain_batch, half_batch = batch(args.tokens), batch(args.tokens // 2)

    def step(data: dict[str, torch.Tensor], alpha: float) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model_loss(model, data, eps=0.1, pad_id=0, rdrop_alpha=alpha).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    cases: dict[str, Callable[[], None]] = {
        "kl written out": lambda: symmetric_kl(logits[None], keep).backward(),
        "kl autograd": lambda: _autograd_kl(logits).backward(),
        "cross-entropy": lambda: label_smoothed_cross_entropy(logits[None], target).loss.backward(),
        "step plain": lambda: step(plain_batch, 0.0),
        "step rdrop": lambda: step(half_batch, 5.0),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for run in cases.values():
        run()  # warm-up
    for _ in range(args.repeats):
        for name, run in cases.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
            logits.grad = None
    rows = [
        {"case": name, "median_ms": 1000 * statistics.median(t), "min_ms": 1000 * min(t),
         "max_ms": 1000 * max(t)}
        for name, t in times.items()
    ]  # fmt: skip
    median = {r["case"]: r["median_ms"] for r in rows}
    ratios = {
        "kl_autograd_over_written_out": median["kl autograd"] / median["kl written out"],
        "step_rdrop_over_plain": median["step rdrop"] / median["step plain"],
    }
    print(f"{'case':<16} {'median ms':>10} {'min':>8} {'max':>8}")
    for r in rows:
        print(f"{r['case']:<16} {r['median_ms']:>10.1f} {r['min_ms']:>8.1f} {r['max_ms']:>8.1f}")
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x")
    meta = {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": args.threads,
        "rows": args.rows,
        "vocab": args.vocab,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    write_json(args.out, {"meta": meta, "rows": rows, "ratios": ratios})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
