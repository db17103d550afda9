"""Decoding speed (§6.1 search): sentences/s and target tokens/s of greedy and beam-4 search,
with the decoder's key/value cache and with full recomputation of the prefix at every step.

Random weights (speed does not depend on them), but every output is forced to exactly
``--out-len`` tokens so that cached and uncached runs do the same work: sources have
``--src-len`` tokens, ``max_len_b = out_len - src_len`` caps the output at ``out_len`` tokens
(where EOS is forced) and ``min_len = out_len`` forbids EOS before it. Every hypothesis of a
beam therefore runs ``out_len + 1`` decoder steps. Target tokens/s counts the ``out_len`` output
tokens of the returned best hypothesis per sentence (not the K beam hypotheses explored).

Presets ``tiny`` and ``base`` with a ``--vocab-size`` shared vocabulary (default 8000, the
Multi30k demo size); fp32 on CPU with one thread by default (``--threads``; ``--device cuda``
on a GPU). ``--quick`` measures ``tiny`` only with fewer sentences.

Usage: ``python benchmarks/bench_decoding.py [--quick] [--batch 8] [--presets tiny base]``;
prints a table and writes ``benchmarks/out/decoding.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from harness import allocator_as_in_the_stages, machine

from transformer_nmt.model.config import get_preset
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.search import beam_search, greedy_search

OUT = Path(__file__).resolve().parent / "out" / "decoding.json"
PAD, BOS, EOS = 0, 2, 3


def measure(
    model, src, *, beam: int, use_cache: bool, out_len: int, repeats: int
) -> tuple[float, float]:
    """Best-of-``repeats`` wall time and process CPU time of one search over ``src``, in
    seconds (CPU time is less sensitive to other processes on a loaded machine)."""
    src_len = src.shape[1]
    kwargs = dict(
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
        max_len_b=out_len - src_len,
        min_len=out_len,
        use_cache=use_cache,
    )
    best = best_cpu = float("inf")
    for _ in range(repeats):
        if src.is_cuda:
            torch.cuda.synchronize()
        start, cpu_start = time.perf_counter(), time.process_time()
        if beam == 1:
            outputs = greedy_search(model, src, **kwargs)
        else:
            outputs = [h[0].tokens for h in beam_search(model, src, beam_size=beam, **kwargs)]
        if src.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - cpu_start)
        assert all(len(out) == out_len for out in outputs), "outputs were not forced to out_len"
    return best, best_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "base"])
    parser.add_argument("--batch", type=int, default=8, help="sentences per search call")
    parser.add_argument("--src-len", type=int, default=20, help="source tokens (EOS included)")
    parser.add_argument("--out-len", type=int, default=50, help="forced output tokens")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=1, help="best of this many runs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads on CPU (default 1: on a small shared machine more threads "
        "spin against other processes and make timings erratic); 0 = torch's default",
    )
    parser.add_argument("--quick", action="store_true", help="tiny only, 4 sentences")
    parser.add_argument(
        "--quantize", choices=("int8",), default=None, help="translate --quantize (CPU only)"
    )
    parser.add_argument(
        "--cache-only",
        action="store_true",
        help="measure the cached search only (no full recomputation, no cache speed-up)",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        args.presets, args.batch = ["tiny"], 4
    if args.out_len <= args.src_len:
        parser.error("--out-len must exceed --src-len (max_len_b = out_len - src_len)")

    print(f"memory: {allocator_as_in_the_stages()}")  # as translate sets it
    device = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, args.vocab_size, (args.batch, args.src_len), generator=g)
    src[:, -1] = EOS
    src = src.to(device)

    rows = []
    header = f"{'preset':<6} {'search':<7} {'cache':<5} {'seconds':>8} {'sent/s':>8} {'tok/s':>9}"
    print(header)
    print("-" * len(header))
    for preset in args.presets:
        torch.manual_seed(0)
        model = Transformer(get_preset(preset), vocab_size=args.vocab_size, pad_id=PAD)
        model = model.to(device).eval()
        if args.quantize:
            # imported here so that the script also runs on older checkouts (bench_ab.py)
            from transformer_nmt.inference.translator import quantize_model

            model = quantize_model(model, args.quantize, device)
        for beam in (1, 4):
            for use_cache in (True,) if args.cache_only else (True, False):
                seconds, cpu_seconds = measure(
                    model,
                    src,
                    beam=beam,
                    use_cache=use_cache,
                    out_len=args.out_len,
                    repeats=args.repeats,
                )
                row = {
                    "preset": preset,
                    "search": "greedy" if beam == 1 else f"beam{beam}",
                    "beam_size": beam,
                    "use_cache": use_cache,
                    "quantize": args.quantize,
                    "seconds": seconds,
                    "sentences_per_s": args.batch / seconds,
                    "cpu_seconds": cpu_seconds,
                    "sentences_per_cpu_s": args.batch / cpu_seconds,
                    "target_tokens_per_s": args.batch * args.out_len / seconds,
                }
                rows.append(row)
                print(
                    f"{preset:<6} {row['search']:<7} {'yes' if use_cache else 'no':<5} "
                    f"{seconds:>8.2f} {row['sentences_per_s']:>8.2f} "
                    f"{row['target_tokens_per_s']:>9.1f}",
                    flush=True,
                )

    speedups = {}
    for preset in args.presets:
        for search in ("greedy", "beam4"):
            pair = [r for r in rows if (r["preset"], r["search"]) == (preset, search)]
            t = {r["use_cache"]: r["seconds"] for r in pair}
            if len(t) < 2:
                continue
            speedups[f"{preset}/{search}"] = t[False] / t[True]
    print()
    for key, ratio in speedups.items():
        print(f"cache speed-up {key}: {ratio:.2f}x")

    payload = {
        "benchmark": "decoding",
        "device": str(device),
        "machine": machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "src_len": args.src_len,
        "out_len": args.out_len,
        "vocab_size": args.vocab_size,
        "repeats": args.repeats,
        "results": rows,
        "cache_speedup": speedups,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
