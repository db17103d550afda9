"""Decoding speed of our beam search (``translation.Translator``) against CTranslate2
(``ct2.Ct2Translator``) on the same weights, the same sentences and the same search settings.

Either a trained model (``--model averaged.pt --spm-model spm.model --source test.en``, e.g. a
pipeline run's ``results/runs/E/averaged.pt``, ``results/spm/D/P/spm.model`` and
``results/data/D/P/test_2016_flickr.en``; a Lightning checkpoint works too) or, without
``--model``, a synthetic set: random ``--preset`` weights with a SentencePiece model trained on
random word sequences. Random weights rarely emit EOS, so every output runs to its length cap
(``max_len_b`` tokens beyond the source): a heavy, but the same, workload for both engines.

The model is exported with ``ct2.export_ct2`` into a temporary directory: float32 by default,
or with ``--quantize int8`` int8 weights on both sides (ours: the translate stage's dynamic
quantisation of the linear layers; CTranslate2: its own int8 conversion), so that each
precision class is compared with itself. For each intra-op thread count (``--threads 1 2``:
torch.set_num_threads and CTranslate2's ``intra_threads``), each engine translates the
sentences ``--runs`` times (after one warm-up run); the median wall time gives sentences/s, and
the ratio CTranslate2 / torch. Both engines batch by ``--max-tokens`` the same way. The share
of identical outputs is reported too (the length penalties differ: docs in
``transformer_nmt.inference.ct2``).

``--ct2-best`` gives CTranslate2 its best documented CPU settings within the same thread budget:
every compute type of the precision class that this CPU supports
(``ctranslate2.get_supported_compute_types``: float32/bfloat16 for float, int8/int8_float32/
int8_bfloat16 for int8), and for a budget of T > 1 threads also T batches at once on one
thread each (``inter_threads=T, intra_threads=1``, its parallel.md; every batch is submitted
asynchronously). Each setting is timed; the table marks CTranslate2's fastest, and ``best``
in the JSON compares ours with it.

Usage: ``python benchmarks/bench_ct2_decoding.py [--model M --spm-model S --source F]
[--sentences 200] [--runs 3] [--threads 1 2] [--beam 4] [--quantize int8] [--ct2-best]``;
prints a table and writes ``benchmarks/out/ct2_decoding.json`` (with the load average, to judge
a loaded machine).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from transformer_nmt.cli.arguments import add_search_arguments, search_settings
from transformer_nmt.inference.ct2 import Ct2Translator, export_ct2, import_ctranslate2
from transformer_nmt.inference.translator import Translator
from transformer_nmt.io_utils import read_lines, write_json
from transformer_nmt.runs.checkpoints import save_model_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import allocator_as_in_the_stages, machine  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "ct2_decoding.json"


def synthetic(root: Path, preset: str, sentences: int) -> tuple[Path, Path, list[str]]:
    """A SentencePiece model on random words, random ``preset`` weights, random sentences."""
    from transformer_nmt.data.spm import train_spm
    from transformer_nmt.data.vocab import PAD_ID, load_vocab_info
    from transformer_nmt.model.config import get_preset
    from transformer_nmt.model.transformer import Transformer

    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(2000)]
    lines = [" ".join(rng.choices(words, k=rng.randint(4, 20))) for _ in range(4000)]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    train_spm([root / "corpus.txt"], root / "spm", vocab_size=2000, sample_sentences=4000, seed=1)
    vocab = load_vocab_info(root / "spm.model")
    torch.manual_seed(0)
    cfg = get_preset(preset)
    model = Transformer(cfg, vocab_size=vocab.size, pad_id=PAD_ID)
    save_model_file(
        root / "model.pt", model_config=cfg.to_dict(), state_dict=model.state_dict(),
        vocab=vocab.to_dict(), step=0, source_checkpoints=[],
    )  # fmt: skip
    return root / "model.pt", root / "spm.model", lines[:sentences]


FLOAT_TYPES = ("float32", "bfloat16")
INT8_TYPES = ("int8", "int8_float32", "int8_bfloat16")


def ct2_settings(ctranslate2, quantize: str | None, threads: int, best: bool):
    """(compute_type, intra_threads, inter_threads) to time for a budget of ``threads``: the
    export's own weights on all threads, or with ``best`` every supported compute type of the
    precision class, on ``threads`` intra-op threads and (T > 1) on T one-thread workers."""
    if not best:
        return [("default", threads, 1)]
    supported = set(ctranslate2.get_supported_compute_types("cpu"))
    types = [t for t in (INT8_TYPES if quantize else FLOAT_TYPES) if t in supported]
    splits = [(threads, 1)] + ([(1, threads)] if threads > 1 else [])
    return [(t, intra, inter) for t in types for intra, inter in splits]


def timed(translator, lines: list[str], runs: int) -> tuple[float, list[str]]:
    """Median seconds of ``runs`` translations of ``lines`` (after a warm-up) and the output."""
    out = translator.translate(lines)  # warm-up
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        translator.translate(lines)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="model file (default: synthetic)")
    parser.add_argument("--spm-model", type=Path, help="with --model: its SentencePiece model")
    parser.add_argument("--source", type=Path, help="with --model: source sentences")
    parser.add_argument("--preset", default="tiny", help="synthetic weights (tiny)")
    parser.add_argument("--sentences", type=int, default=200, help="first N sentences (200)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per engine (median)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    add_search_arguments(parser)  # translate's own flags and §6.1 defaults
    parser.add_argument(
        "--quantize", choices=["none", "int8"], default="none",
        help="weights on both sides: none (float32) or int8 (default none)",
    )  # fmt: skip
    parser.add_argument(
        "--ct2-best", action="store_true",
        help="CTranslate2 at each supported compute type of the class and thread split",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    print(f"memory: {allocator_as_in_the_stages()}")
    quantize = None if args.quantize == "none" else args.quantize
    if args.model is not None and (args.spm_model is None or args.source is None):
        parser.error("--model needs --spm-model and --source")
    ctranslate2 = import_ctranslate2()
    settings = search_settings(args)

    with tempfile.TemporaryDirectory(prefix="bench_ct2_") as tmp:
        root = Path(tmp)
        if args.model is None:
            model, spm_model, lines = synthetic(root, args.preset, args.sentences)
        else:
            model, spm_model = args.model, args.spm_model
            lines = [line for line in read_lines(args.source) if line.strip()][: args.sentences]
        export_ct2(model, spm_model, root / "ct2", quantization=quantize)
        ours = Translator(model, spm_model, settings, device="cpu", quantize=quantize)
        rows, best = [], []
        header = f"{'threads':>7} {'engine':<42} {'sent/s':>7} {'ours/it':>7} {'same':>5}"
        print(header)
        print("-" * len(header))
        for threads in args.threads:
            torch.set_num_threads(threads)
            t_torch, out_torch = timed(ours, lines, args.runs)
            print(f"{threads:>7} {'ours (torch)':<42} {len(lines) / t_torch:>7.1f}", flush=True)
            candidates = []
            for compute_type, intra, inter in ct2_settings(ctranslate2, quantize, threads,
                                                           args.ct2_best):  # fmt: skip
                theirs = Ct2Translator(
                    root / "ct2", spm_model, settings, "cpu", threads=intra,
                    inter_threads=inter, compute_type=compute_type,
                )  # fmt: skip
                t_ct2, out_ct2 = timed(theirs, lines, args.runs)
                same = sum(a == b for a, b in zip(out_torch, out_ct2, strict=True)) / len(lines)
                row = {
                    "threads": threads,
                    "ct2_compute_type": compute_type,
                    "ct2_intra_threads": intra,
                    "ct2_inter_threads": inter,
                    "torch_seconds": t_torch,
                    "ct2_seconds": t_ct2,
                    "torch_sentences_per_s": len(lines) / t_torch,
                    "ct2_sentences_per_s": len(lines) / t_ct2,
                    "ct2_speedup": t_torch / t_ct2,
                    "identical_outputs": same,
                }
                rows.append(row)
                candidates.append(row)
                label = f"ct2 {compute_type}, {inter} worker(s) x {intra} thread(s)"
                print(
                    f"{threads:>7} {label:<42} {row['ct2_sentences_per_s']:>7.1f} "
                    f"{t_ct2 / t_torch:>6.2f}x {same:>5.0%}",
                    flush=True,
                )
            fastest = min(candidates, key=lambda r: r["ct2_seconds"])
            best.append({
                "threads": threads,
                "torch_sentences_per_s": fastest["torch_sentences_per_s"],
                "ct2_sentences_per_s": fastest["ct2_sentences_per_s"],
                "ct2_setting": {k: fastest[k] for k in
                                ("ct2_compute_type", "ct2_intra_threads", "ct2_inter_threads")},
                "ours_over_ct2": fastest["ct2_seconds"] / t_torch,
            })  # fmt: skip
            print(f"{threads:>7} ours / CTranslate2's fastest: {best[-1]['ours_over_ct2']:.2f}x")

    payload = {
        "benchmark": "ct2_decoding",
        "model": str(args.model) if args.model else f"synthetic random {args.preset}",
        "source": str(args.source) if args.source else "synthetic",
        "sentences": len(lines),
        "settings": {"beam": args.beam, "alpha": args.alpha, "max_len_b": args.max_len_b,
                     "max_tokens": args.max_tokens, "early_stop": args.early_stop},
        "quantize": args.quantize,
        "runs": args.runs,
        "machine": machine(),
        "loadavg": os.getloadavg(),
        "torch": torch.__version__,
        "ctranslate2": ctranslate2.__version__,
        "results": rows,
        "best": best,
    }  # fmt: skip
    write_json(args.out, payload)
    print(f"\nload average {os.getloadavg()}; wrote {args.out}")


if __name__ == "__main__":
    main()
