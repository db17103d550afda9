"""Data stages at WMT14 EN-DE scale: time, throughput and peak memory of each stage.

A synthetic corpus with the shape of WMT14 EN-DE (4.5M pairs, ~25 words per side, Zipfian
word frequencies) goes through the real stage CLIs, each in its own subprocess:
prepare (cleaning, dedupe) -> spm-train -> encode (``--workers``) -> one pass of the training
DataLoader. Peak memory is the largest sum of PSS (proportional set size: resident memory with
shared pages split among their processes) over the stage's process tree, polled from /proc
every 50 ms. File-backed pages of the memory-mapped arrays count in it although the kernel can
drop them at will, so the anonymous part is reported too.

    python benchmarks/bench_data.py                 # full size (4.5M pairs)
    python benchmarks/bench_data.py --pairs 200000  # quick run
    python benchmarks/bench_data.py --loader-only   # the loader alone on 4.5M pairs of arrays

Prints a table and writes benchmarks/out/data.json. Targets (issue 3): encode < 2 GiB, loader
< 1 GiB, loader tokens/s far above the ~300k tokens/s one H100 trains on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "out"
H100_TOKENS_PER_S = 300_000

LOADER_SCRIPT = """
import json, sys, time
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.data.vocab import PAD_ID
bin_dir, max_tokens, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seconds = float(sys.argv[4])
dm = TranslationDataModule(bin_dir, "en", "de", max_tokens=max_tokens, num_workers=workers)
t0 = time.perf_counter()
loader = dm.train_dataloader()
setup_s = time.perf_counter() - t0
real = padded = sentences = batches = 0
t0 = time.perf_counter()
for batch in loader:
    real += int((batch["src"] != PAD_ID).sum()) + int((batch["tgt_out"] != PAD_ID).sum())
    padded += batch["src"].numel() + batch["tgt_out"].numel()
    sentences += len(batch["index"])
    batches += 1
    if time.perf_counter() - t0 > seconds:
        break
elapsed = time.perf_counter() - t0
print(json.dumps(dict(setup_s=setup_s, seconds=elapsed, batches=batches, sentences=sentences,
                      real_tokens=real, padded_tokens=padded, epoch_batches=len(loader))))
"""


def _tree_memory(pid: int) -> tuple[int, int]:
    """(Pss, Pss_Anon) in bytes summed over ``pid`` and its descendants.

    PSS splits each shared page among the processes mapping it, so forked DataLoader workers
    (copy-on-write copies of the parent) are not counted several times, as a sum of RSS would.
    """
    total = anon = 0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as handle:
                for line in handle:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                    elif line.startswith("Pss_Anon:"):
                        anon += int(line.split()[1]) * 1024
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as handle:
                    stack += [int(c) for c in handle.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total, anon


def run_stage(name: str, argv: list[str]) -> dict:
    """Run a subprocess, polling its process tree's PSS; returns time, peaks and stdout."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0, 0]

    def poll() -> None:
        while proc.poll() is None:
            rss, anon = _tree_memory(proc.pid)
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], anon)
            time.sleep(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    stdout, stderr = proc.communicate()
    thread.join()
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{name} failed ({proc.returncode}):\n{stderr[-3000:]}")
    print(f"  {name}: {seconds:.1f} s, peak PSS {peak[0] / 2**20:.0f} MiB", flush=True)
    return {"seconds": seconds, "peak_pss": peak[0], "peak_pss_anon": peak[1], "stdout": stdout}


def make_corpus(raw: Path, pairs: int, seed: int, words_per_side: float) -> None:
    """train.{en,de} with ~words_per_side words per side, plus small valid files."""
    rng = np.random.default_rng(seed)
    n_words = 60_000
    zipf = 1.0 / np.arange(1, n_words + 1) ** 1.1
    zipf /= zipf.sum()

    def vocabulary(alphabet: str) -> list[str]:
        letters = np.array(list(alphabet))
        lengths = rng.integers(2, 11, size=n_words)
        return ["".join(rng.choice(letters, size=k)) for k in lengths]

    vocab = {"en": vocabulary("etaoinshrdlucmfwyp"), "de": vocabulary("enisratdhulcgmobwfkzä")}
    chunk = 100_000
    with open(raw / "train.en", "w") as en, open(raw / "train.de", "w") as de:
        for start in range(0, pairs, chunk):
            n = min(chunk, pairs - start)
            src_len = np.clip(rng.normal(words_per_side, 9, size=n), 1, 120).astype(int)
            tgt_len = np.clip(src_len * rng.uniform(0.8, 1.25, size=n), 1, 150).astype(int)
            for lang, lens, handle in (("en", src_len, en), ("de", tgt_len, de)):
                ids = rng.choice(n_words, size=int(lens.sum()), p=zipf).tolist()
                words = vocab[lang]
                out, pos = [], 0
                for k in lens.tolist():
                    out.append(" ".join([words[i] for i in ids[pos : pos + k]]))
                    pos += k
                handle.write("\n".join(out) + "\n")
    for lang in ("en", "de"):
        with open(raw / f"train.{lang}") as src, open(raw / f"valid.{lang}", "w") as dst:
            for _ in range(3000):
                dst.write(src.readline())


def write_token_arrays(bin_dir: Path, pairs: int, mean_tokens: float, vocab_size: int) -> int:
    """``--loader-only``: train.{en,de} token arrays shaped like the encoded corpus, directly."""
    from transformer_nmt.data.token_array import TokenArrayWriter

    rng = np.random.default_rng(0)
    total = 0
    for lang in ("en", "de"):
        with TokenArrayWriter(bin_dir / f"train.{lang}", vocab_size) as writer:
            for start in range(0, pairs, 500_000):
                n = min(500_000, pairs - start)
                lengths = np.clip(rng.normal(mean_tokens, 12, size=n), 1, 250).astype(np.int64)
                writer.write_flat(rng.integers(4, vocab_size, size=int(lengths.sum())), lengths)
                total += int(lengths.sum())
    return total


def run_pipeline(args: argparse.Namespace, root: Path) -> tuple[dict, dict, Path]:
    """generate -> prepare -> spm-train -> encode; returns (stages, facts, bin_dir)."""
    raw, data, spm_dir, bin_dir = (root / d for d in ("raw", "data", "spm", "bin"))
    raw.mkdir()
    print(f"generating {args.pairs:,} synthetic pairs ...", flush=True)
    t0 = time.perf_counter()
    make_corpus(raw, args.pairs, seed=0, words_per_side=args.words)
    facts: dict = {"generate_seconds": time.perf_counter() - t0}
    corpus = {
        "name": "synthetic",
        "en": {"file": "train.en", "format": "text"},
        "de": {"file": "train.de", "format": "text"},
    }
    valid = {
        "name": "synthetic_valid",
        "en": {"file": "valid.en", "format": "text"},
        "de": {"file": "valid.de", "format": "text"},
    }
    files = {f.name: {"url": f"file://{f}", "sha256": None} for f in sorted(raw.iterdir())}
    splits = {"train": [corpus], "valid": [valid]}
    registry = root / "datasets.yaml"
    registry.write_text(
        yaml.safe_dump({"synth": {"files": files, "pairs": {"en-de": {"splits": splits}}}})
    )
    # record the sums as the download stage would have
    from transformer_nmt.io_utils import sha256_file

    lock = {f.name: sha256_file(f) for f in raw.iterdir()}
    (raw / "checksums.lock.json").write_text(json.dumps(lock))

    py = [sys.executable, "-m", "transformer_nmt"]
    stages = {}
    stages["prepare"] = run_stage(
        "prepare",
        py
        + ["prepare", "--registry", str(registry), "--dataset", "synth", "--pair", "en-de"]
        + ["--raw-dir", str(raw), "--out-dir", str(data)],
    )
    report = json.loads((data / "clean_report.json").read_text())
    facts["kept_after_cleaning"] = kept = report["splits"]["train"]["kept"]
    stages["spm_train"] = run_stage(
        "spm-train",
        py
        + ["spm-train", "--inputs", str(data / "train.en"), str(data / "train.de")]
        + ["--vocab-size", str(args.vocab_size), "--sample-sentences", str(args.spm_sample)]
        + ["--seed", "1", "--model-prefix", str(spm_dir / "spm")],
    )
    texts = [str(data / f"{s}.{lang}") for s in ("train", "valid") for lang in ("en", "de")]
    stages["encode"] = run_stage(
        "encode",
        py
        + ["encode", "--spm-model", str(spm_dir / "spm.model"), "--inputs", *texts]
        + ["--out-dir", str(bin_dir), "--workers", str(args.workers)],
    )
    facts["prepare_pairs_per_s"] = args.pairs / stages["prepare"]["seconds"]
    facts["encode_sentences_per_s"] = 2 * (kept + 3000) / stages["encode"]["seconds"]
    facts["train_tokens_both_sides"] = int(
        sum(
            np.load(bin_dir / f"train.{lang}.tokens.npy", mmap_mode="r").shape[0]
            for lang in ("en", "de")
        )
    )
    return stages, facts, bin_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--words", type=float, default=25.0, help="mean words per side")
    parser.add_argument("--vocab-size", type=int, default=37_000)
    parser.add_argument("--spm-sample", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--loader-seconds", type=float, default=60.0)
    parser.add_argument(
        "--loader-only",
        action="store_true",
        help="skip prepare/spm/encode: write token arrays of the encoded corpus's shape "
        "(--pairs pairs, ~29 tokens per side as SentencePiece gives the synthetic text) and "
        "measure the loader alone",
    )
    parser.add_argument("--work-dir", default=None, help="default: a temporary directory")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        root = Path(tmp)
        if args.loader_only:
            bin_dir = root / "bin"
            tokens = write_token_arrays(bin_dir, args.pairs, 29.0, args.vocab_size)
            stages, facts = {}, {"train_tokens_both_sides": tokens}
        else:
            stages, facts, bin_dir = run_pipeline(args, root)
        loaders = {}
        for workers in (0, 2):
            name = f"loader_workers{workers}"
            stages[name] = run_stage(
                name,
                [sys.executable, "-c", LOADER_SCRIPT, str(bin_dir), str(args.max_tokens)]
                + [str(workers), str(args.loader_seconds)],
            )
            loaders[name] = json.loads(stages[name].pop("stdout").strip().splitlines()[-1])
        for stage in stages.values():
            stage.pop("stdout", None)

    results = {
        "pairs": args.pairs,
        "cpu_cores": len(os.sched_getaffinity(0)),
        **facts,
        "stages": stages,
        "loaders": {
            name: {
                **r,
                "real_tokens_per_s": r["real_tokens"] / r["seconds"],
                "padded_tokens_per_s": r["padded_tokens"] / r["seconds"],
                "padding_share": 1 - r["real_tokens"] / r["padded_tokens"],
                "vs_h100": r["real_tokens"] / r["seconds"] / H100_TOKENS_PER_S,
            }
            for name, r in loaders.items()
        },
        "settings": vars(args),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "data.json").write_text(json.dumps(results, indent=2) + "\n")

    gib = 2**30
    tokens = results["train_tokens_both_sides"]
    print(f"\nWMT14 EN-DE-shaped synthetic corpus: {args.pairs:,} pairs, {tokens:,} train tokens")
    print(f"{'stage':<18}{'seconds':>9}{'peak PSS GiB':>14}{'anon GiB':>10}  throughput")
    for name, s in stages.items():
        if name == "encode":
            rate = f"{results['encode_sentences_per_s']:,.0f} sentences/s"
        elif name == "prepare":
            rate = f"{results['prepare_pairs_per_s']:,.0f} pairs/s"
        elif name in results["loaders"]:
            r = results["loaders"][name]
            rate = (
                f"{r['real_tokens_per_s']:,.0f} tokens/s "
                f"({r['vs_h100']:.1f}x an H100's ~300k; {r['padding_share']:.1%} padding)"
            )
        else:
            rate = ""
        print(
            f"{name:<18}{s['seconds']:>9.1f}{s['peak_pss'] / gib:>14.2f}"
            f"{s['peak_pss_anon'] / gib:>10.2f}  {rate}"
        )
    print(f"\nwrote {OUT / 'data.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
