"""Data stages at WMT14 EN-DE or EN-FR scale: time, throughput and peak memory of each stage.

A synthetic corpus with the shape of WMT14 EN-DE (4.5M pairs, ~25 words per side, Zipfian
word frequencies, a few lines with bytes that are not UTF-8 or control characters as in Common
Crawl), packed into a tar archive as the WMT training archives are, goes through the real stage
CLIs, each in its own subprocess: download (from an HTTP server on 127.0.0.1; sha256 pinned)
-> prepare (archive reading, lenient decoding, cleaning, dedupe) -> spm-train (the recipe's
10M-sentence sample by default) -> encode (``--workers``) -> one pass of the training
DataLoader. Peak memory is the largest sum of PSS (proportional set size: resident memory with
shared pages split among their processes) over the stage's process tree, polled from /proc
every 50 ms. File-backed pages of the memory-mapped arrays count in it although the kernel can
drop them at will, so the anonymous part is reported too.

    python benchmarks/bench_data.py                 # full size (4.5M pairs)
    python benchmarks/bench_data.py --pairs 450000  # 10% (a quick run)
    python benchmarks/bench_data.py --loader-only   # the loader alone on 4.5M pairs of arrays
    python benchmarks/bench_data.py --layout en-fr --pairs 36000000  # WMT14 EN-FR (§5.1: 36M)

``--layout en-fr`` splits the pairs among the WMT14 EN-FR training corpora in their real
proportions and archives, as the package's registry names them (Gigaword's gzip members in a
plain tar, UN, Common Crawl, Europarl and News Commentary as tgz members). ``--encode-workers
1,2`` and ``--prepare-workers 1,2`` run the encode or prepare stage once per worker count (the
speed-up of the cores it is given; outputs are checked to be byte-identical).

Prints a table and writes benchmarks/out/data.json. Targets: encode < 2 GiB, loader
< 1 GiB, loader tokens/s far above the ~300k tokens/s one H100 trains on; every data
stage's peak within what profiles/slurm asks for a data job (``default-resources.mem_mb``).
"""

from __future__ import annotations

import argparse
import functools
import gzip
import http.server
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import harness
import numpy as np
import yaml
from harness import OUT, REPO

H100_TOKENS_PER_S = 300_000
RECIPES = {
    "en-de": REPO / "config" / "experiments" / "wmt14_en_de_base.yaml",
    "en-fr": REPO / "config" / "experiments" / "wmt14_en_fr_base.yaml",
}
SLURM_PROFILE = REPO / "profiles" / "slurm" / "config.yaml"
ARCHIVE = "training-synthetic.tar"  # members as in Europarl's tgz: training/<corpus>.de-en.<lang>
# Lines of each WMT14 EN-FR training corpus as distributed (40.8M pairs; §5.1's 36M is after
# cleaning): the shares in which --layout en-fr splits its pairs.
EN_FR_CORPUS_PAIRS = {
    "europarl_v7": 2_007_723,
    "commoncrawl": 3_244_152,
    "un": 12_886_831,
    "news_commentary_v9": 183_251,
    "giga_fren": 22_520_376,
}
ALPHABETS = {"en": "etaoinshrdlucmfwyp", "de": "enisratdhulcgmobwfkzä", "fr": "esaitnrulodcmpévq"}


def recipe_spm_sample(layout: str) -> int:
    """The WMT14 recipe's SentencePiece sample (10M sentences for EN-DE and EN-FR)."""
    config = yaml.safe_load(RECIPES[layout].read_text(encoding="utf-8"))
    return int(config["data"][f"wmt14_{layout.replace('-', '_')}"][layout]["spm_sample_sentences"])


def slurm_data_job_mb() -> int:
    """What the SLURM profile asks for a job without its own resources (the data stages)."""
    text = SLURM_PROFILE.read_text(encoding="utf-8")
    profile = yaml.safe_load("\n".join(ln for ln in text.splitlines() if "?" not in ln))
    return int(profile["default-resources"]["mem_mb"])


LOADER_SCRIPT = """
import json, sys, time
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.data.vocab import PAD_ID
bin_dir, max_tokens, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seconds = float(sys.argv[4])
world = int(sys.argv[5])  # rank 0 of `world` (its share)
src, tgt = sys.argv[6], sys.argv[7]
dm = TranslationDataModule(bin_dir, src, tgt, max_tokens=max_tokens, num_workers=workers)
dm.rank_and_world_size = lambda: (0, world)
t0 = time.perf_counter()
loader = dm.train_dataloader()
setup_s = time.perf_counter() - t0
real = padded = sentences = batches = tgt_real = 0
t0 = time.perf_counter()
first_batch_s = None
for batch in loader:
    if first_batch_s is None:  # the epoch's start-up: sampler, workers, first batch
        first_batch_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        continue
    tgt = int((batch["tgt_out"] != PAD_ID).sum())
    real += int((batch["src"] != PAD_ID).sum()) + tgt
    tgt_real += tgt
    padded += batch["src"].numel() + batch["tgt_out"].numel()
    sentences += len(batch["index"])
    batches += 1
    if time.perf_counter() - t0 > seconds:
        break
elapsed = time.perf_counter() - t0
print(json.dumps(dict(setup_s=setup_s, first_batch_s=first_batch_s, seconds=elapsed,
                      batches=batches, sentences=sentences, real_tokens=real,
                      tgt_real_tokens=tgt_real, padded_tokens=padded, epoch_batches=len(loader),
                      max_tokens=max_tokens, workers=workers, world_size=world)))
"""
# --feed: the WMT14 recipes' micro-batches as plan sizes them on H100s (max_tokens: auto):
# one GPU's (base and big alike) and rank 0's share of eight; 1 and 2 DataLoader workers.
FEED_SETUPS = ((24_960, 1), (3_072, 8))
FEED_WORKERS = (1, 2)


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


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


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


def make_corpus(
    outputs: list[tuple[int, Path, Path]],
    langs: tuple[str, str],
    seed: int,
    words_per_side: float,
    broken: float,
) -> None:
    """Synthetic pairs into each (pairs, source file, target file) of ``outputs``, ~words_per_side
    words per side (a ``broken`` share of the source lines with a byte that is not UTF-8, as
    many target ones with a control character)."""
    rng = np.random.default_rng(seed)
    n_words = 60_000
    zipf = 1.0 / np.arange(1, n_words + 1) ** 1.1
    zipf /= zipf.sum()

    def vocabulary(alphabet: str) -> list[str]:
        letters = np.array(list(alphabet))
        lengths = rng.integers(2, 11, size=n_words)
        return ["".join(rng.choice(letters, size=k)) for k in lengths]

    vocab = [vocabulary(ALPHABETS[lang]) for lang in langs]
    chunk = 100_000
    utf8 = {"encoding": "utf-8", "errors": "surrogateescape"}  # \udcff: the lone byte 0xff
    for pairs, src_path, tgt_path in outputs:
        with open(src_path, "w", **utf8) as src, open(tgt_path, "w", **utf8) as tgt:
            for start in range(0, pairs, chunk):
                n = min(chunk, pairs - start)
                src_len = np.clip(rng.normal(words_per_side, 9, size=n), 1, 120).astype(int)
                tgt_len = np.clip(src_len * rng.uniform(0.8, 1.25, size=n), 1, 150).astype(int)
                for side, lens, handle in ((0, src_len, src), (1, tgt_len, tgt)):
                    ids = rng.choice(n_words, size=int(lens.sum()), p=zipf).tolist()
                    words = vocab[side]
                    out, pos = [], 0
                    for k in lens.tolist():
                        out.append(" ".join([words[i] for i in ids[pos : pos + k]]))
                        pos += k
                    for i in np.flatnonzero(rng.random(n) < broken).tolist():
                        out[i] += " \udcff" if side == 0 else " \x1b[0m"
                    handle.write("\n".join(out) + "\n")


def write_valid(train: tuple[Path, Path], valid: tuple[Path, Path], lines: int = 3000) -> None:
    """The first ``lines`` training pairs, without their bad bytes, as the valid set."""
    for src, dst in zip(train, valid, strict=True):
        with open(src, encoding="utf-8", errors="surrogateescape") as i, open(dst, "w") as o:
            for _ in range(lines):
                o.write(i.readline().replace("\udcff", "").replace("\x1b[0m", ""))


def en_fr_corpora(pairs: int) -> list[tuple[dict, int]]:
    """The registry's WMT14 EN-FR training corpora, each with its share of ``pairs``."""
    from transformer_nmt.data.registry import DEFAULT_REGISTRY, read_registry

    corpora = read_registry(DEFAULT_REGISTRY)["wmt14_en_fr"]["pairs"]["en-fr"]["splits"]["train"]
    total = sum(EN_FR_CORPUS_PAIRS.values())
    shares = [pairs * EN_FR_CORPUS_PAIRS[c["name"]] // total for c in corpora]
    shares[-1] += pairs - sum(shares)
    return list(zip(corpora, shares, strict=True))


def pack_archives(site: Path, members: list[tuple[dict, Path]]) -> None:
    """Each generated file into the archive and member its registry side names: a gzip side
    is compressed first; ``.tgz`` archives are gzipped tars, ``.tar`` plain ones. Level 1
    compression (the benchmark's generation time; reading costs about the same at any level)."""
    archives: dict[str, list[tuple[str, Path]]] = {}
    for side, path in members:
        if side["format"] == "gzip":
            packed = path.with_name(Path(side["member"]).name)
            with open(path, "rb") as i, gzip.open(packed, "wb", compresslevel=1) as o:
                shutil.copyfileobj(i, o, 1 << 20)
            path.unlink()
            path = packed
        archives.setdefault(side["file"], []).append((side["member"], path))
    for name, files in archives.items():
        level = {"compresslevel": 1} if name.endswith(".tgz") else {}
        with tarfile.open(site / name, "w:gz" if level else "w", **level) as tar:
            for member, path in files:
                tar.add(path, arcname=member)
                path.unlink()


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


def _speedup(stages: dict, stage: str, workers: list[int]) -> float:
    """How many times faster ``stage`` ran with the last worker count than with the first."""
    first, last = (stages[f"{stage}_workers{w}"]["seconds"] for w in (workers[0], workers[-1]))
    return first / last


def run_pipeline(args: argparse.Namespace, root: Path) -> tuple[dict, dict, Path]:
    """generate -> prepare -> spm-train -> encode; returns (stages, facts, bin_dir)."""
    site, raw, data, spm_dir = (root / d for d in ("site", "raw", "data", "spm"))
    site.mkdir()
    pair = args.layout
    langs = tuple(pair.split("-"))
    print(f"generating {args.pairs:,} synthetic {pair} pairs ...", flush=True)
    t0 = time.perf_counter()

    def side(file: str, member: str | None) -> dict:
        return {"file": file, "member": member, "format": "text"}

    if pair == "en-fr":  # the registry's corpora, archives and members
        shares = en_fr_corpora(args.pairs)
        corpora = [corpus for corpus, _ in shares]
    else:  # one corpus, members as in Europarl's tgz: training/<corpus>.de-en.<lang>
        member = "training/synthetic.de-en.{}"
        corpora = [{"name": "synthetic", **{x: side(ARCHIVE, member.format(x)) for x in langs}}]
        shares = [(corpora[0], args.pairs)]
    outputs = [(n, *(site / f"{c['name']}.{x}" for x in langs)) for c, n in shares]
    make_corpus(outputs, langs, seed=0, words_per_side=args.words, broken=args.broken)
    write_valid(outputs[0][1:], tuple(site / f"valid.{x}" for x in langs))
    pack_archives(site, [(c[x], site / f"{c['name']}.{x}") for c in corpora for x in langs])
    facts: dict = {"generate_seconds": time.perf_counter() - t0, "layout": pair}
    facts["corpora"] = {c["name"]: n for c, n in shares}
    valid = {"name": "synthetic_valid", **{x: side(f"valid.{x}", None) for x in langs}}
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        files = {f.name: {"url": f"{url}/{f.name}", "sha256": None} for f in site.iterdir()}
        registry = root / "datasets.yaml"
        registry.write_text(yaml.safe_dump({"synth": {"files": files, "pairs": {
            pair: {"splits": {"train": corpora, "valid": [valid]}}}}}))  # fmt: skip
        stages = {}
        stages["download"] = run_stage("download", harness.download_command(registry, "synth", raw))
    finally:
        server.shutdown()
        server.server_close()
    archives = {c[x]["file"] for c in corpora for x in langs}
    facts["archive_bytes"] = sum((raw / name).stat().st_size for name in archives)
    shutil.rmtree(site)
    counts = args.prepare_workers or [args.workers]
    for workers in counts:  # the last one's text feeds the later stages
        name = "prepare" if len(counts) == 1 else f"prepare_workers{workers}"
        out = data if workers == counts[-1] else root / f"data{workers}"
        stages[name] = run_stage(
            name, harness.prepare_command(registry, "synth", pair, raw, out, workers)
        )
        facts[f"{name}_pairs_per_s"] = args.pairs / stages[name]["seconds"]
    if len(counts) > 1:
        for workers in counts[:-1]:  # the outputs do not depend on the workers
            other = root / f"data{workers}"
            for path in sorted(data.iterdir()):
                if path.read_bytes() != (other / path.name).read_bytes():
                    raise SystemExit(f"prepare with {workers} workers wrote another {path.name}")
            shutil.rmtree(other)
        facts["prepare_speedup"] = _speedup(stages, "prepare", counts)
    report = json.loads((data / "clean_report.json").read_text())
    facts["kept_after_cleaning"] = kept = report["splits"]["train"]["kept"]
    facts["dropped"] = report["splits"]["train"]["dropped"]
    inputs = [data / f"train.{x}" for x in langs]
    stages["spm_train"] = run_stage(
        "spm-train",
        harness.spm_train_command(inputs, args.vocab_size, args.spm_sample, 1, spm_dir / "spm"),
    )
    texts = [data / f"{s}.{lang}" for s in ("train", "valid") for lang in langs]
    counts = args.encode_workers or [args.workers]
    for workers in counts:  # the last one's arrays feed the loaders
        bin_dir = root / f"bin{workers}"
        name = "encode" if len(counts) == 1 else f"encode_workers{workers}"
        stages[name] = run_stage(
            name, harness.encode_command(spm_dir / "spm.model", texts, bin_dir, workers)
        )
        facts[f"{name}_sentences_per_s"] = 2 * (kept + 3000) / stages[name]["seconds"]
        if workers != counts[-1]:
            shutil.rmtree(bin_dir)  # the disk: one set of arrays at a time
    if len(counts) > 1:
        facts["encode_speedup"] = _speedup(stages, "encode", counts)
    facts["download_mb_per_s"] = facts["archive_bytes"] / 1e6 / stages["download"]["seconds"]
    facts["train_tokens_both_sides"] = int(
        sum(np.load(bin_dir / f"train.{x}.tokens.npy", mmap_mode="r").shape[0] for x in langs)
    )
    return stages, facts, bin_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument(
        "--layout", choices=sorted(RECIPES), default="en-de",
        help="en-de: one synthetic tar member per side; en-fr: WMT14 EN-FR's corpora, "
        "archives and members from the package's registry, in their real proportions",
    )  # fmt: skip
    parser.add_argument("--words", type=float, default=25.0, help="mean words per side")
    parser.add_argument("--vocab-size", type=int, default=37_000)
    parser.add_argument("--spm-sample", type=int, default=None, help="default: the recipe's")
    parser.add_argument(
        "--broken", type=float, default=0.0005,
        help="share of lines with bad bytes (English) or control characters (German)",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--encode-workers", type=lambda s: [int(x) for x in s.split(",")], default=None,
        help="comma-separated worker counts: one encode stage each (default: --workers)",
    )  # fmt: skip
    parser.add_argument(
        "--prepare-workers", type=lambda s: [int(x) for x in s.split(",")], default=None,
        help="comma-separated worker counts: one prepare stage each (default: --workers)",
    )  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--loader-seconds", type=float, default=60.0)
    parser.add_argument(
        "--loader-only",
        action="store_true",
        help="skip prepare/spm/encode: write token arrays of the encoded corpus's shape "
        "(--pairs pairs, ~29 tokens per side as SentencePiece gives the synthetic text) and "
        "measure the loader alone",
    )
    parser.add_argument(
        "--feed",
        action="store_true",
        help="with --loader-only: the WMT14 recipes' micro-batches on H100s (24,960 tokens on "
        "one, 3,072 as rank 0 of eight) with 1 and 2 workers: target tokens/s per worker, the "
        "epoch's start-up, memory per process",
    )
    parser.add_argument("--work-dir", default=None, help="default: a temporary directory")
    args = parser.parse_args()
    if args.spm_sample is None:
        args.spm_sample = recipe_spm_sample(args.layout)
    if args.loader_only and args.layout != "en-de":
        parser.error("--loader-only writes EN-DE-shaped arrays; leave --layout out")

    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        root = Path(tmp)
        if args.loader_only:
            bin_dir = root / "bin"
            tokens = write_token_arrays(bin_dir, args.pairs, 29.0, args.vocab_size)
            stages, facts = {}, {"train_tokens_both_sides": tokens}
            langs = ["en", "de"]
        else:
            stages, facts, bin_dir = run_pipeline(args, root)
        langs = args.layout.split("-")
        loaders = {}
        setups = [(args.max_tokens, 1, w) for w in (0, 2)]
        if args.feed:
            setups = [(m, world, w) for m, world in FEED_SETUPS for w in FEED_WORKERS]
        for max_tokens, world, workers in setups:
            name = f"loader_workers{workers}"
            if args.feed:
                name = f"feed_{max_tokens}x{world}_workers{workers}"
            stages[name] = run_stage(
                name,
                [sys.executable, "-c", LOADER_SCRIPT, str(bin_dir), str(max_tokens)]
                + [str(workers), str(args.loader_seconds), str(world), *langs],
            )
            loaders[name] = json.loads(stages[name].pop("stdout").strip().splitlines()[-1])
            # per process of the loader's tree (the main one and its workers)
            loaders[name]["peak_pss_per_process"] = stages[name]["peak_pss"] / (workers + 1)
            loaders[name]["peak_anon_per_process"] = stages[name]["peak_pss_anon"] / (workers + 1)
        for stage in stages.values():
            stage.pop("stdout", None)

    results = {
        "pairs": args.pairs,
        "cpu_cores": len(os.sched_getaffinity(0)),
        "slurm_data_job_mem_mb": slurm_data_job_mb(),
        **facts,
        "stages": stages,
        "loaders": {
            name: {
                **r,
                "real_tokens_per_s": r["real_tokens"] / r["seconds"],
                "padded_tokens_per_s": r["padded_tokens"] / r["seconds"],
                "padding_share": 1 - r["real_tokens"] / r["padded_tokens"],
                "vs_h100": r["real_tokens"] / r["seconds"] / H100_TOKENS_PER_S,
                "tgt_tokens_per_s_per_worker": r["tgt_real_tokens"]
                / r["seconds"]
                / max(r["workers"], 1),
            }
            for name, r in loaders.items()
        },
        "settings": vars(args),
    }
    harness.write_result(OUT / "data.json", results)

    gib = 2**30
    tokens = results["train_tokens_both_sides"]
    print(f"\nWMT14 {args.layout.upper()}-shaped synthetic corpus: {args.pairs:,} pairs, "
          f"{tokens:,} train tokens")  # fmt: skip
    print(f"{'stage':<18}{'seconds':>9}{'peak PSS GiB':>14}{'anon GiB':>10}  throughput")
    for name, s in stages.items():
        if name.startswith("encode"):
            rate = f"{results[name + '_sentences_per_s']:,.0f} sentences/s"
        elif name.startswith("prepare"):
            rate = f"{results[name + '_pairs_per_s']:,.0f} pairs/s"
        elif name == "download":
            rate = f"{results['download_mb_per_s']:,.0f} MB/s (127.0.0.1), sha256 pinned"
        elif name in results["loaders"]:
            r = results["loaders"][name]
            rate = (
                f"{r['real_tokens_per_s']:,.0f} tokens/s "
                f"({r['vs_h100']:.1f}x an H100's ~300k; {r['padding_share']:.1%} padding)"
            )
            if args.feed:
                rate = (
                    f"{r['tgt_tokens_per_s_per_worker']:,.0f} target tokens/s per worker, "
                    f"start-up {r['setup_s'] + r['first_batch_s']:.1f} s, "
                    f"{r['peak_anon_per_process'] / 2**20:,.0f} MiB anon per process"
                )
        else:
            rate = ""
        print(
            f"{name:<18}{s['seconds']:>9.1f}{s['peak_pss'] / gib:>14.2f}"
            f"{s['peak_pss_anon'] / gib:>10.2f}  {rate}"
        )
    if "dropped" in results:
        print(f"train pairs dropped by reason: {results['dropped']}")
    mb = results["slurm_data_job_mem_mb"]
    for stage, workers in (("prepare", args.prepare_workers), ("encode", args.encode_workers)):
        if f"{stage}_speedup" in results:
            print(f"{stage}: {results[stage + '_speedup']:.2f}x faster with {workers[-1]} "
                  f"workers than with {workers[0]}")  # fmt: skip
    for name in stages:
        if not name.startswith(("loader", "feed")):
            peak = stages[name]["peak_pss"] / 2**20
            verdict = "fits" if peak < mb else "DOES NOT FIT"
            print(f"{name}: peak {peak:,.0f} MiB vs profiles/slurm mem_mb {mb:,}: {verdict}")
    print(f"\nwrote {OUT / 'data.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
