"""The CPU fast path ``parallel_batches`` on and off: beam-search decoding by the torch engine
(``Translator.translate``) with T batches at once on one thread each, against one batch at a
time on all T threads (``--threads``, default 2). Every other fast path stays on.

For each source file and precision (fp32; int8 with ``--int8``), the same ``Translator``
translates the file ``--runs`` times per setting, the settings alternating; the table gives
sentences/s (median) and the ratio, and whether the translations are identical.

    python benchmarks/bench_parallel_batches.py --model results/runs/E/averaged.pt \\
      --spm-model results/spm/D/P/spm.model --sources results/data/D/P/test_2016_flickr.en \\
      results/data/D/P/valid.en --int8

Writes ``benchmarks/out/parallel_batches.json`` with the machine and every run's seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from transformer_nmt import fast_paths
from transformer_nmt.cli.arguments import add_search_arguments, search_settings
from transformer_nmt.inference.translator import Translator
from transformer_nmt.io_utils import read_lines, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage_process import allocator_as_in_the_stages, machine  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "parallel_batches.json"
OFF = ",".join(name for name in fast_paths.FAST_PATHS if name != "parallel_batches")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--spm-model", type=Path, required=True)
    parser.add_argument("--sources", type=Path, nargs="+", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--int8", action="store_true", help="also int8 weights (--quantize)")
    parser.add_argument("--out", type=Path, default=OUT)
    add_search_arguments(parser)
    args = parser.parse_args()
    print(f"memory: {allocator_as_in_the_stages()}")
    torch.set_num_threads(args.threads)
    settings = search_settings(args)
    rows = []
    print(f"{'source':<24} {'weights':<7} {'on sent/s':>10} {'off sent/s':>11} {'on/off':>7} same")
    for source in args.sources:
        lines = read_lines(source)
        for quantize in [None, "int8"] if args.int8 else [None]:
            translator = Translator(args.model, args.spm_model, settings, "cpu", quantize)
            seconds: dict[str, list[float]] = {"on": [], "off": []}
            outputs = {}
            for setting in ["on", "off"] * args.runs:
                os.environ[fast_paths.ENV] = "on" if setting == "on" else OFF
                start = time.perf_counter()
                outputs[setting] = translator.translate(lines)
                seconds[setting].append(time.perf_counter() - start)
            os.environ[fast_paths.ENV] = "on"
            on, off = (len(lines) / statistics.median(seconds[s]) for s in ("on", "off"))
            row = {"source": str(source), "weights": quantize or "fp32", "sentences": len(lines),
                   "seconds": seconds, "on_sentences_per_s": on, "off_sentences_per_s": off,
                   "ratio": on / off, "identical": outputs["on"] == outputs["off"]}  # fmt: skip
            rows.append(row)
            print(f"{source.name:<24} {row['weights']:<7} {on:>10.1f} {off:>11.1f} "
                  f"{on / off:>6.2f}x {row['identical']}", flush=True)  # fmt: skip
    write_json(args.out, {"benchmark": "parallel_batches", "command": " ".join(sys.argv),
                          "machine": machine(), "threads": args.threads, "runs": args.runs,
                          "rows": rows})  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
