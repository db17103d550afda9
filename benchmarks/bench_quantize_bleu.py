"""BLEU change of ``translate --quantize int8`` (int8 dynamic quantisation of the linear layers,
CPU decoding) against fp32, with the same §6.1 beam search (beam 4, α 0.6); with ``--bf16``
also fp32 weights decoding under bf16 autocast (for CPUs with AVX512-BF16 or AMX).

With ``--model --spm-model --src --ref``: a trained model file on a test set. Without: a small
model trained here for ``--updates`` updates on a synthetic word-by-word language pair (a
15-word lexicon, sentences of 1-8 words; the toy of tests/test_ct2.py), scored on
``--sentences`` held-out sentences. Reports both BLEU scores, the share of identical
translations and the decoding time of each (best of one run, one torch thread).

Usage: ``python benchmarks/bench_quantize_bleu.py [--updates 300] [--sentences 300]``; prints a
table and writes ``benchmarks/out/quantize_bleu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent / "out" / "quantize_bleu.json"
LEXICON = {
    "ein": "a", "mann": "man", "eine": "a", "frau": "woman", "hund": "dog", "läuft": "runs",
    "spielt": "plays", "im": "in", "park": "park", "auf": "on", "der": "the",
    "straße": "street", "mit": "with", "einem": "one", "ball": "ball",
}  # fmt: skip


def toy_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = sorted(LEXICON)
    out = []
    for _ in range(n):
        src = [rng.choice(words) for _ in range(rng.randint(1, 8))]
        out.append((" ".join(src), " ".join(LEXICON[w] for w in src)))
    return out


def train_toy(root: Path, updates: int) -> tuple[Path, Path]:
    """SentencePiece + a small Transformer trained on the toy pair; returns (model, spm)."""
    import sentencepiece as spm

    from transformer_nmt.data.batch import flatten, training_batch
    from transformer_nmt.data.spm import train_spm
    from transformer_nmt.data.vocab import PAD_ID, load_vocab_info
    from transformer_nmt.model.config import ModelConfig
    from transformer_nmt.model.transformer import Transformer
    from transformer_nmt.runs.checkpoints import save_model_file
    from transformer_nmt.training.objective import label_smoothed_cross_entropy
    from transformer_nmt.training.optimizer import build_optimizer, build_scheduler

    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(s for p in toy_pairs(300, 0) for s in p) + "\n", encoding="utf-8")
    train_spm([corpus], root / "spm", vocab_size=320, sample_sentences=600, seed=1, num_threads=1)
    sp = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
    data = [(sp.encode(a), sp.encode(b)) for a, b in toy_pairs(2000, 0)]
    cfg = ModelConfig(N=2, d_model=128, d_ff=256, h=4, d_k=32, d_v=32, p_drop=0.0)
    torch.manual_seed(0)
    model = Transformer(cfg, vocab_size=sp.get_piece_size(), pad_id=PAD_ID)
    optimizer = build_optimizer(model.parameters())
    scheduler = build_scheduler(optimizer, d_model=cfg.d_model, warmup=100, scale=0.15)
    rng = random.Random(2)
    model.train()
    for _ in range(updates):
        index = rng.sample(range(len(data)), 64)
        src, tgt = flatten([data[i][0] for i in index]), flatten([data[i][1] for i in index])
        batch = {k: torch.from_numpy(v) for k, v in training_batch(*src, *tgt, index).items()}
        out = label_smoothed_cross_entropy(
            model(batch["src"], batch["tgt_in"]), batch["tgt_out"], eps=0.1, pad_id=PAD_ID
        )
        optimizer.zero_grad()
        (out.loss / out.ntokens).backward()
        optimizer.step()
        scheduler.step()
    save_model_file(
        root / "model.pt", model_config=cfg.to_dict(), state_dict=model.state_dict(),
        vocab=load_vocab_info(root / "spm.model").to_dict(), step=updates, source_checkpoints=[],
    )  # fmt: skip
    return root / "model.pt", root / "spm.model"


def main() -> None:
    import sacrebleu

    from transformer_nmt.inference.translator import Translator
    from transformer_nmt.search import SearchSettings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a model file (default: train the toy)")
    parser.add_argument("--spm-model", type=Path)
    parser.add_argument("--src", type=Path, help="source sentences, one a line")
    parser.add_argument("--ref", type=Path, help="reference translations")
    parser.add_argument("--updates", type=int, default=300, help="toy model training updates")
    parser.add_argument("--sentences", type=int, default=300, help="toy test sentences")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--bf16", action="store_true",
        help="also decode with fp32 weights under bf16 autocast (CPUs with AVX512-BF16 or AMX)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            model, spm_model = train_toy(Path(tmp), args.updates)
            pairs = toy_pairs(args.sentences, seed=1)
            lines, refs = [s for s, _ in pairs], [t for _, t in pairs]
        else:
            model, spm_model = args.model, args.spm_model
            lines = args.src.read_text(encoding="utf-8").splitlines()
            refs = args.ref.read_text(encoding="utf-8").splitlines()
        settings = SearchSettings(beam=4, alpha=0.6)
        rows, outputs = [], {}
        # (name, quantize, bf16 autocast): fp32 first, the reference of the others
        modes = [("fp32", None, False), ("int8", "int8", False)]
        modes += [("bf16", None, True)] if args.bf16 else []
        for name, quantize, bf16 in modes:
            translator = Translator(model, spm_model, settings, device="cpu", quantize=quantize)
            start, cpu_start = time.perf_counter(), time.process_time()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                hyps = translator.translate(lines)
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
            outputs[name] = hyps
            same_as_fp32 = sum(a == b for a, b in zip(outputs["fp32"], hyps, strict=True))
            rows.append({"quantize": name,
                         "bleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
                         "seconds": seconds, "cpu_seconds": cpu_seconds,
                         "identical": same_as_fp32 / len(lines)})  # fmt: skip
            load.append(os.getloadavg()[0])
    same = rows[1]["identical"]
    print(f"{'model':<6} {'BLEU':>7} {'seconds':>8} {'CPU s':>7} {'vs fp32':>8} {'same':>6}")
    for row in rows:
        print(f"{row['quantize']:<6} {row['bleu']:>7.2f} {row['seconds']:>8.1f} "
              f"{row['cpu_seconds']:>7.1f} {rows[0]['seconds'] / row['seconds']:>7.2f}x "
              f"{row['identical']:>6.1%}")  # fmt: skip
    delta = rows[1]["bleu"] - rows[0]["bleu"]
    print(f"int8 - fp32 BLEU: {delta:+.2f}; identical translations: {same:.1%} of {len(lines)}")
    print(f"1-min load average: {min(load):.1f} to {max(load):.1f}")
    payload = {"model": str(args.model or f"toy ({args.updates} updates)"), "sentences": len(lines),
               "rows": rows, "bleu_delta": delta, "identical": same, "threads": args.threads,
               "load_average_1min": load}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
