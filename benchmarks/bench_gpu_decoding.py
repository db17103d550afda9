"""Beam-search decoding of real sentences on a GPU (§6.1: beam 4, α 0.6, +50): sentences/s and
target tokens/s of a trained model (``results/runs/E/averaged.pt``) on a test set, for several
batch sizes (``--max-tokens``: source tokens per batch, as ``translate --max-tokens``), so that
the table shows where larger batches stop paying. Each size: one warm-up translation, then the
median of ``--runs`` (``bench_ct2_decoding.timed``); target tokens are the SentencePiece pieces
of the translations plus EOS. With ``--reference``, each size's sacreBLEU too: batching must not
change the translations beyond float rounding.

Usage: ``python benchmarks/bench_gpu_decoding.py --model M --spm-model S --source test.en
[--reference test.de] [--max-tokens 4096 16384 65536] [--runs 3] [--device cuda]``; prints a
table and writes ``benchmarks/out/gpu_decoding.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import sacrebleu
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ct2_decoding import timed  # noqa: E402
from harness import machine  # noqa: E402

from transformer_nmt.inference.translator import Translator  # noqa: E402
from transformer_nmt.io_utils import read_lines, write_json  # noqa: E402
from transformer_nmt.search import SearchSettings  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "gpu_decoding.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--spm-model", type=Path, required=True)
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--reference", type=Path, help="the references, for each size's BLEU")
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    lines = read_lines(args.source)
    refs = read_lines(args.reference) if args.reference else None
    rows = []
    for max_tokens in args.max_tokens:
        settings = SearchSettings(beam=args.beam, max_tokens=max_tokens)
        translator = Translator(args.model, args.spm_model, settings, device=args.device)
        if translator.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        seconds, out = timed(translator, lines, args.runs)
        tokens = sum(len(translator.sp.encode(line)) + 1 for line in out)  # + EOS
        row = {
            "max_tokens": max_tokens,
            "beam": args.beam,
            "sentences": len(lines),
            "seconds": seconds,
            "sentences_per_s": len(lines) / seconds,
            "tgt_tokens_per_s": tokens / seconds,
        }
        if translator.device.type == "cuda":
            row["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        if refs is not None:
            row["bleu"] = sacrebleu.corpus_bleu(out, [refs]).score
        rows.append(row)
        print(row, flush=True)

    print(f"{'max_tokens':>10} {'sent/s':>9} {'tgt tok/s':>10} {'peak GiB':>9} {'BLEU':>6}")
    for r in rows:
        mem = f"{r['peak_memory_gib']:.2f}" if "peak_memory_gib" in r else "-"
        bleu = f"{r['bleu']:.2f}" if "bleu" in r else "-"
        print(
            f"{r['max_tokens']:>10} {r['sentences_per_s']:>9.1f} {r['tgt_tokens_per_s']:>10.0f} "
            f"{mem:>9} {bleu:>6}"
        )
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    meta = {"machine": machine(), "device": device, "torch": torch.__version__,
            "model": str(args.model), "source": str(args.source), "runs": args.runs}  # fmt: skip
    write_json(args.out, {"meta": meta, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
