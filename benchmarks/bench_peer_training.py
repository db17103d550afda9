"""Training throughput against a peer toolkit (``--peer``: eole, the successor of OpenNMT-py,
or fairseq) on the same model shape, data, vocabulary, batch size and threads.

Data: the pipeline's own stages (Snakemake: download -> prepare -> spm-train -> encode) build
Multi30k EN-DE as in ``config/config.yaml``. Ours trains on those token arrays; the peer reads
the same token ids written back as SentencePiece pieces (one sentence per line, pieces joined by
spaces, no further transforms), with a vocabulary file of our model's 8,000 pieces in id order.
Pieces that contain whitespace (SentencePiece keeps a no-break space as a piece under our
identity normalisation) are renamed ``<piece_ID>`` in both files, so each sentence is the same
id sequence on both sides. The peer builds its vocabulary from that file: the same 8,000
pieces, with no extra specials (its pad/unk/bos/eos are set to our names).

Model and training (both): our ``tiny`` preset with the demo's pre-LN flag (d_model 256, 3+3
layers, 4 heads, d_ff 1024, dropout 0.1, shared embeddings and pre-softmax projection), label
smoothing 0.1, Adam (0.9, 0.98), the §5.3 inverse-sqrt schedule (``--warmup``, ``--lr-scale``),
``--max-tokens`` tokens per batch counting padding, one update per batch, ``--precision``
(fp32, or bf16 autocast with fp32 weights on both sides: ours ``bf16-mixed``, eole
``compute_dtype: bf16`` with its default ``use_amp``, torch's CPU autocast), ours with batch
widths rounded up to ``--pad-multiple`` (default 1: as they come), ``--threads``
intra-op threads (OMP/MKL variables and torch.set_num_threads through them), one process, no
data-loader workers. eole's settings are ``benchmarks/peers/eole_tiny.yaml``.

fairseq (``--peer fairseq``, fairseq-fixed 0.12.3.1: 0.12.2 installable on Python 3.11) reads
the same piece files binarised by ``fairseq-preprocess`` with a dictionary of our pieces in id
order (``dict.txt``; our four specials are fairseq's own <s>, <pad>, </s>, <unk>, so the
vocabulary is the same 8,000 entries) and trains ``--arch transformer`` at our shape
(``fairseq_args``): pre-LN (``--encoder/decoder-normalize-before``), all embeddings shared,
sinusoidal positions, dropout 0.1 on the residual paths and embeddings only, Adam (0.9, 0.98,
eps 1e-9), the same schedule (``inverse_sqrt`` with ``--warmup-init-lr 0`` and ``--lr`` set to
ours at the end of warmup: identical at every step), ``--max-tokens`` with our meaning
(batch size x longest side, padding counted), fp32 on the CPU. Where it cannot match: its
attention projections have biases (ours none: ~9k more parameters), LayerNorm epsilon 1e-5,
label smoothing spread over the V - 1 wrong classes (torch's over all V; at V = 8,000 the
same to 1e-4 of the loss). Its loss is logged in bits and is converted to nats here.
``--peer-workers`` sets its DataLoader workers (fairseq's default is 1).

Each run trains ``--steps`` updates from scratch, as a fresh process, and logs every
``--log-every`` updates; ours (``python -m transformer_nmt train``, what the pipeline runs) and
the peer's (``eole train``) runs alternate, and which goes first alternates too (the machine is
shared). Throughput of a run: the median of its log windows' target tokens/s (real tokens:
y + EOS, no padding; both toolkits count the same), leaving out the first window (start-up,
first allocations). The script also reads the training process's CPU time (user + system,
all threads, from ``/proc``) when each log line appears, giving target tokens per CPU-second:
on a machine shared with other jobs wall-clock rates mostly measure the share of the cores a
process got, CPU time much less so (ours has no per-window token count in its log: its windows
use the run's mean target tokens per batch). Loss: the label-smoothed cross-entropy per target
token in nats (both toolkits use the same definition,
``torch.nn.functional.cross_entropy(label_smoothing=0.1)``) of the last window, i.e. after the
same number of updates; the real target tokens per batch are reported for both, so "after the
same number of tokens" can be checked. Printed: a line per run, the medians over runs and the
ratios ours / peer; written: ``benchmarks/out/peer_training_<peer>.json`` with the load
average, machine and date.

The peer lives in its own virtual environment (``--peer-venv``, default
``benchmarks/.venv-peer-<peer>``, gitignored), never in the project's dependencies; create it
with ``benchmarks/peers/install_<peer>.sh``.

Usage: ``python benchmarks/bench_peer_training.py [--peer fairseq] [--steps 150] [--runs 3]
[--log-every 25]``
(run from the repository root, in the project's environment, with ``PYTHONPATH=src``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import yaml
from harness import OUT, REPO, Experiment, run_logged, summarise, thread_env

PEERS = REPO / "benchmarks" / "peers"
EXPERIMENT = "multi30k_en_de_tiny"
# --precision: (our train.precision, eole's compute_dtype)
PRECISIONS = {"fp32": ("32-true", "fp32"), "bf16": ("bf16-mixed", "bf16")}
# "Step 50/  150; acc: 12.3; ppl: 456.78; xent: 6.12; ...; bsz: 1234/1200/90; 1500/1400 tok/s;"
EOLE_LINE = re.compile(
    r"Step\s+(\d+)/\s*\d+; .*?xent: ([0-9.]+);.*?bsz:\s*([0-9.]+)/\s*([0-9.]+)/\s*([0-9.]+);"
    r"\s*([0-9.]+)/\s*([0-9.]+) tok/s"
)
# "... | train_inner | epoch 001:  25 / 113 loss=9.9, nll_loss=9.8, ppl=892, wps=2282.4, ups=1.2,
#  wpb=1878.6, bsz=61.2, num_updates=25, ..." (loss in bits per target token)
FAIRSEQ_LINE = re.compile(
    r"\| train_inner \| .*?\bloss=([0-9.]+),.*?\bwps=([0-9.]+),.*?\bwpb=([0-9.]+),"
    r".*?\bnum_updates=(\d+)"
)
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # its Dictionary's own first four entries
PEER_PROGRAMS = {"eole": "eole", "fairseq": "fairseq-train"}


# --- data: the pipeline's arrays, and the same ids as pieces for the peer -----------------------


def piece_names(spm_model: Path) -> list[str]:
    """Our SentencePiece model's pieces in id order; a piece with whitespace (which a text
    corpus or vocabulary file cannot hold) is renamed ``<piece_ID>``."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    names = []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        names.append(f"<piece_{i}>" if not piece or any(c.isspace() for c in piece) else piece)
    if len(set(names)) != len(names):
        sys.exit(f"{spm_model}: piece names are not unique after renaming")
    return names


class PieceCodec:
    """Text to and from our pieces as a peer reads and writes them (one sentence per line,
    pieces joined by spaces, the names of ``piece_names``, no EOS): ``encode`` is our
    SentencePiece model's ids as names; ``decode`` maps a peer's output pieces back to our ids
    (pieces we do not have are dropped and counted in ``unknown``) and detokenises them."""

    def __init__(self, spm_model: Path):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=str(spm_model))
        self.names = piece_names(spm_model)
        self.ids = {name: i for i, name in enumerate(self.names)}
        self.unknown = 0

    def encode(self, text: str) -> str:
        return " ".join(self.names[i] for i in self.sp.encode(text, out_type=int))

    def decode(self, pieces: str) -> str:
        ids = [self.ids.get(piece) for piece in pieces.split()]
        self.unknown += ids.count(None)
        return self.sp.decode([i for i in ids if i is not None])


def write_peer_data(exp: Experiment, out: Path) -> dict[str, Any]:
    """``train.{src,tgt}`` as pieces of our token arrays, and ``vocab.txt`` (piece, tab, count)."""
    from transformer_nmt.data.token_array import TokenArray

    out.mkdir(parents=True, exist_ok=True)
    names = piece_names(REPO / exp.spm)
    counts = [0] * len(names)
    sizes = {}
    for lang in (exp.src, exp.tgt):
        array = TokenArray(REPO / exp.bin_dir / f"train.{lang}")
        tmp = out / f"train.{lang}.tmp"
        with open(tmp, "w", encoding="utf-8", newline="\n") as handle:
            for ids in array:
                ids = ids.tolist()
                for i in ids:
                    counts[i] += 1
                handle.write(" ".join(names[i] for i in ids) + "\n")
        tmp.replace(out / f"train.{lang}")
        sizes[lang] = len(array)
    # Every piece, in id order; the count column only documents the corpus (no filtering).
    vocab = out / "vocab.txt"
    vocab.write_text("".join(f"{n}\t{c}\n" for n, c in zip(names, counts, strict=True)), "utf-8")
    # fairseq's: "piece count" lines after its own four specials (ours under the same names)
    if sorted(FAIRSEQ_SPECIALS) != sorted(n for n in names if n in FAIRSEQ_SPECIALS):
        sys.exit(f"{exp.spm}: expected the specials {FAIRSEQ_SPECIALS} among the pieces")
    rows = [(n, c) for n, c in zip(names, counts, strict=True) if n not in FAIRSEQ_SPECIALS]
    fairseq_dict = out / "dict.txt"
    fairseq_dict.write_text("".join(f"{n} {max(c, 1)}\n" for n, c in rows), "utf-8")
    return {"vocab": vocab, "vocab_size": len(names), "sentences": sizes, "dict": fairseq_dict}


def fairseq_binarise(args, data: dict[str, Any], dest: Path, valid: str = "",
                     tests: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """fairseq-preprocess of the piece files with our dictionary on both sides: ``train``, and
    the piece files ``valid`` and ``tests`` (prefixes in ``data["dir"]``) as fairseq's subsets
    valid, test, test1, ..."""
    cmd = [
        str(args.peer_venv / "bin" / "fairseq-preprocess"),
        "--source-lang", data["src"], "--target-lang", data["tgt"],
        "--trainpref", str(data["dir"] / "train"), "--destdir", str(dest),
        "--srcdict", str(data["dict"]), "--tgtdict", str(data["dict"]),
        "--workers", str(args.threads),
    ]  # fmt: skip
    if valid:
        cmd += ["--validpref", str(data["dir"] / valid)]
    if tests:
        cmd += ["--testpref", ",".join(str(data["dir"] / t) for t in tests)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=thread_env(args.threads))
    if proc.returncode != 0:
        sys.exit(f"fairseq-preprocess failed:\n{proc.stderr[-3000:]}")
    if f"[{data['src']}] Dictionary: {data['vocab_size']} types" not in proc.stderr + proc.stdout:
        sys.exit(f"fairseq's dictionary is not our {data['vocab_size']} pieces:\n{proc.stderr}")
    return dest


# --- runs ---------------------------------------------------------------------------------------


def ours(args) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Our side's model and training (the module doc), in place of the demo experiment's."""
    model_overrides = {"norm_first": True, "p_drop_relu": args.ours_relu_dropout}
    train = {
        "max_steps": args.steps,
        "max_tokens": args.max_tokens,
        "tokens_per_update": args.max_tokens,
        "warmup": args.warmup,
        "lr_scale": args.lr_scale,
        "seed": 1,
        "precision": PRECISIONS[args.precision][0],
        "pad_multiple": args.pad_multiple,
        "accelerator": "cpu",
        "devices": 1,
        "checkpoint_every_steps": args.steps,
        "keep_checkpoints": 1,
        "val_every_steps": args.steps,
        "log_every_steps": args.log_every,
        "num_workers": 0,
    }
    return lambda exp: {**exp, "preset": "tiny", "model_overrides": model_overrides, "train": train,
                        "average_last_k": 1}  # fmt: skip


def run_ours(args, exp: Experiment, run_dir: Path) -> dict[str, Any]:
    cmd = harness.train_command(exp, run_dir)
    return harness.timed_train(cmd, run_dir, args.threads, args.steps, args.log_every)


def fairseq_args(args, data: dict[str, Any], bin_dir: Path) -> list[str]:
    """``fairseq-train`` at our ``tiny`` shape and training settings (see the module doc)."""
    from transformer_nmt.model.config import get_preset

    tiny, warmup = get_preset("tiny"), args.warmup
    peak_lr = args.lr_scale * tiny.d_model**-0.5 * warmup**-0.5  # ours (§5.3) at step = warmup
    shape = ["--encoder-layers", str(tiny.N), "--decoder-layers", str(tiny.N)]
    for side in ("encoder", "decoder"):
        shape += [f"--{side}-embed-dim", str(tiny.d_model), f"--{side}-ffn-embed-dim",
                  str(tiny.d_ff), f"--{side}-attention-heads", str(tiny.h),
                  f"--{side}-normalize-before"]  # fmt: skip
    return [
        str(bin_dir), "--task", "translation", "--source-lang", data["src"],
        "--target-lang", data["tgt"], "--arch", "transformer", "--share-all-embeddings", *shape,
        "--dropout", "0.1", "--attention-dropout", "0", "--activation-dropout", "0",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(warmup),
        "--warmup-init-lr", "0", "--lr", repr(peak_lr), "--clip-norm", "0",
        "--max-tokens", str(args.max_tokens), "--required-batch-size-multiple", "1",
        "--max-update", str(args.steps), "--log-interval", str(args.log_every),
        "--log-format", "simple", "--cpu", "--no-save", "--disable-validation",
        "--num-workers", str(args.peer_workers), "--seed", "1",
    ]  # fmt: skip


def run_fairseq(args, train_args: list[str], run_dir: Path) -> dict[str, Any]:
    cmd = [str(args.peer_venv / "bin" / "fairseq-train"), *train_args]
    log, cpu = run_logged(cmd, run_dir, args.threads, FAIRSEQ_LINE)
    windows = [
        {
            "step": int(m[4]),
            "loss": float(m[1]) * math.log(2),  # bits -> nats
            "tgt_tokens_per_s": float(m[2]),
            "tgt_tokens": float(m[3]) * args.log_every,  # mean target tokens/batch x batches
        }
        for m in FAIRSEQ_LINE.finditer(log)
    ]
    tgt_per_batch = sum(w["tgt_tokens"] for w in windows) / max(windows[-1]["step"], 1)
    return summarise(windows, cpu, args.steps, args.log_every, tgt_per_batch)


# What our runs depend on: an earlier output with these settings equal measured the same runs.
OURS_SETTINGS = ("steps", "log_every", "max_tokens", "threads", "pad_multiple", "precision",
                 "ours_relu_dropout", "warmup", "lr_scale")  # fmt: skip


def reused_ours_runs(path: Path, args) -> list[dict[str, Any]]:
    """``--ours-from``: our runs from an earlier output of this script (another peer's run on
    this machine), so one ``make bench`` trains ours once for both peers. Its settings for our
    side must be this run's, and it must have ``--runs`` of them."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        settings, rows = earlier["settings"], earlier["runs"]["ours"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        sys.exit(f"--ours-from {path}: not an output of bench_peer_training.py ({err}); "
                 "leave --ours-from out to train ours here")  # fmt: skip
    for key in OURS_SETTINGS:
        if settings.get(key) != getattr(args, key):
            sys.exit(f"--ours-from {path}: its {key} is {settings.get(key)!r}, this run's is "
                     f"{getattr(args, key)!r}; rerun it with the same settings or leave "
                     "--ours-from out")  # fmt: skip
    if len(rows) < args.runs:
        sys.exit(f"--ours-from {path}: {len(rows)} of our runs, --runs is {args.runs}")
    return rows[: args.runs]


def run_peer(args, cfg_path: Path, run_dir: Path) -> dict[str, Any]:
    cmd = [str(args.peer_venv / "bin" / "eole"), "train", "-config", str(cfg_path)]
    log, cpu = run_logged(cmd, run_dir, args.threads, EOLE_LINE)
    windows = [
        {
            "step": int(m[1]),
            "loss": float(m[2]),
            "tgt_tokens_per_s": float(m[7]),
            "tgt_tokens": float(m[4]) * args.log_every,  # mean real target tokens/batch x batches
        }
        for m in EOLE_LINE.finditer(log)
    ]
    tgt_per_batch = sum(w["tgt_tokens"] for w in windows) / max(windows[-1]["step"], 1)
    return summarise(windows, cpu, args.steps, args.log_every, tgt_per_batch)


def peer_config(args, data: dict[str, Any], work: Path) -> dict[str, Any]:
    cfg = yaml.safe_load((PEERS / "eole_tiny.yaml").read_text(encoding="utf-8"))
    cfg.update(
        src_vocab=str(data["vocab"]), tgt_vocab=str(data["vocab"]),
        src_vocab_size=data["vocab_size"], tgt_vocab_size=data["vocab_size"],
        save_data=str(work / "eole_save"), report_every=args.log_every,
    )  # fmt: skip
    cfg["data"]["corpus_1"].update(
        path_src=str(data["dir"] / f"train.{data['src']}"),
        path_tgt=str(data["dir"] / f"train.{data['tgt']}"),
    )
    cfg["training"].update(
        model_path=str(work / "eole_model"), train_steps=args.steps,
        batch_size=args.max_tokens, warmup_steps=args.warmup, learning_rate=args.lr_scale,
        compute_dtype=PRECISIONS[args.precision][1],
    )  # fmt: skip
    set_eole_init(cfg, args.eole_init)
    return cfg


def set_eole_init(cfg: dict[str, Any], method: str) -> None:
    """eole's ``param_init_method``: ``normal`` with std hidden_size^-0.5 (ours for the
    embeddings; eole applies it to every matrix), or ``xavier_uniform`` (eole's default)."""
    if method == "normal":
        std = cfg["model"]["hidden_size"] ** -0.5
        cfg["training"].update(param_init_method="normal", param_init=std)
    else:
        cfg["training"].update(param_init_method="xavier_uniform", param_init=0.0)


def peer_version(venv: Path, package: str = "eole") -> str:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         f"import importlib.metadata as m; print(m.version({package!r}), m.version('torch'))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    version, torch = proc.stdout.split()
    return f"{package} {version} (torch {torch})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="updates per run (150)")
    parser.add_argument("--runs", type=int, default=3, help="runs per toolkit (median)")
    parser.add_argument("--log-every", type=int, default=25, help="log window in updates")
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--pad-multiple", type=int, default=1,
        help="ours: batch widths rounded up to a multiple of this (train.pad_multiple; 1)",
    )  # fmt: skip
    parser.add_argument(
        "--precision", choices=sorted(PRECISIONS), default="fp32",
        help="both sides: fp32, or bf16 autocast (fp32 weights)",
    )  # fmt: skip
    parser.add_argument(
        "--ours-relu-dropout", type=float, default=0.0,
        help="ours: dropout after the FFN's ReLU (model.p_drop_relu; 0 as the demo). eole "
        "applies its dropout there too (dropout_1 of its MLP): 0.1 gives ours eole's placement",
    )  # fmt: skip
    parser.add_argument("--warmup", type=int, default=100, help="§5.3 warmup steps (demo: 100)")
    parser.add_argument("--lr-scale", type=float, default=0.5, help="schedule scale (demo: 0.5)")
    parser.add_argument(
        "--eole-init", choices=["xavier_uniform", "normal"], default="normal",
        help="eole's param_init_method: normal with std d_model^-0.5 (eole_tiny.yaml; ours "
        "for the embeddings, eole applies it to every weight matrix), or xavier_uniform, as "
        "runs before 2026-11-27 midday had it",
    )  # fmt: skip
    parser.add_argument("--peer", choices=sorted(PEER_PROGRAMS), default="eole")
    parser.add_argument("--peer-venv", type=Path, help="default benchmarks/.venv-peer-<peer>")
    parser.add_argument(
        "--peer-workers", type=int, default=1,
        help="fairseq's DataLoader workers (--num-workers; its default 1)",
    )  # fmt: skip
    parser.add_argument("--data-mirror", default=os.environ.get("TRANSFORMER_NMT_MIRROR"))
    parser.add_argument("--out", type=Path, help="default benchmarks/out/peer_training_<peer>.json")
    parser.add_argument(
        "--ours-from", type=Path,
        help="an earlier output of this script on this machine with the same settings for "
        "ours: its runs of ours are reported instead of training ours again",
    )  # fmt: skip
    args = parser.parse_args()
    if args.steps < 2 * args.log_every:
        parser.error("--steps must be at least two log windows (the first is left out)")
    if args.peer == "fairseq" and args.precision != "fp32":
        parser.error("fairseq has no CPU autocast (its --amp is CUDA's, --bf16 trains bf16 "
                     "weights): compare it in fp32")  # fmt: skip
    args.peer_venv = args.peer_venv or REPO / "benchmarks" / f".venv-peer-{args.peer}"
    args.out = args.out or OUT / f"peer_training_{args.peer}.json"
    # before the data work: a bad --ours-from fails at once
    ours_reused = reused_ours_runs(args.ours_from, args) if args.ours_from else None
    program = args.peer_venv / "bin" / PEER_PROGRAMS[args.peer]
    if not program.exists():
        sys.exit(f"{args.peer_venv}: no {program.name} there; run "
                 f"benchmarks/peers/install_{args.peer}.sh")  # fmt: skip

    exp = harness.load_experiment(REPO / "config" / "config.yaml", EXPERIMENT, ours(args))
    harness.build_data(exp, [], args.data_mirror)
    work = OUT / "peer_training"
    if work.exists():
        shutil.rmtree(work)
    data = write_peer_data(exp, work / "data")
    data.update(dir=work / "data", src=exp.src, tgt=exp.tgt)
    cfg_path = work / "eole_tiny.yaml"
    if args.peer == "eole":
        cfg_path.write_text(yaml.safe_dump(peer_config(args, data, work), sort_keys=False), "utf-8")
    else:
        train_args = fairseq_args(args, data, fairseq_binarise(args, data, work / "fairseq_bin"))

    load_before = os.getloadavg()
    results: dict[str, list[dict[str, Any]]] = {"ours": [], "peer": []}
    for i in range(args.runs):
        order = ("ours", "peer") if i % 2 == 0 else ("peer", "ours")
        for who in order:
            if who == "ours" and ours_reused is not None:
                results["ours"].append(ours_reused[i])
                print(f"run {i} ours: from {args.ours_from}", flush=True)
                continue
            run_dir = work / f"{who}_{i}"
            load = os.getloadavg()[0]
            started = time.perf_counter()
            if who == "ours":
                row = run_ours(args, exp, run_dir)
            elif args.peer == "fairseq":
                row = run_fairseq(args, train_args, run_dir)
            else:
                shutil.rmtree(work / "eole_model", ignore_errors=True)
                row = run_peer(args, cfg_path, run_dir)
            row.update(run=i, wall_seconds=time.perf_counter() - started, load_1min=load)
            results[who].append(row)
            print(
                f"run {i} {who:<4}: {row['tgt_tokens_per_s']:7.0f} tgt tok/s  "
                f"{row['tgt_tokens_per_cpu_s']:6.0f} per CPU-s  loss@"
                f"{row['final_step']} {row['final_loss']:.3f}  "
                f"{row['tgt_tokens_per_batch']:6.0f} tgt tok/batch  "
                f"wall {row['wall_seconds']:5.1f}s  load {load:.2f}",
                flush=True,
            )
    load_after = os.getloadavg()

    med = {
        who: {
            "tgt_tokens_per_s": statistics.median(r["tgt_tokens_per_s"] for r in rows),
            "tgt_tokens_per_cpu_s": statistics.median(r["tgt_tokens_per_cpu_s"] for r in rows),
            "final_loss": statistics.median(r["final_loss"] for r in rows),
            "tgt_tokens_per_batch": statistics.median(r["tgt_tokens_per_batch"] for r in rows),
        }
        for who, rows in results.items()
    }
    ratio = med["ours"]["tgt_tokens_per_s"] / med["peer"]["tgt_tokens_per_s"]
    cpu_ratio = med["ours"]["tgt_tokens_per_cpu_s"] / med["peer"]["tgt_tokens_per_cpu_s"]
    peer = peer_version(args.peer_venv, "fairseq-fixed" if args.peer == "fairseq" else "eole")
    print(f"\nmedian of {args.runs} runs, {args.steps} updates of {args.max_tokens} tokens, "
          f"{args.threads} threads, {args.precision}; peer {peer}")  # fmt: skip
    print(f"{'':<6} {'tgt tok/s':>10} {'per CPU-s':>10} {'loss@' + str(args.steps):>10} "
          f"{'tgt tok/batch':>14}")  # fmt: skip
    for who in ("ours", "peer"):
        m = med[who]
        print(f"{who:<6} {m['tgt_tokens_per_s']:>10.0f} {m['tgt_tokens_per_cpu_s']:>10.0f} "
              f"{m['final_loss']:>10.3f} {m['tgt_tokens_per_batch']:>14.0f}")  # fmt: skip
    print(f"ratio ours / peer: {ratio:.2f}x tokens/s, {cpu_ratio:.2f}x tokens per CPU-second "
          f"(load {load_before} -> {load_after})")  # fmt: skip

    payload = {
        "benchmark": "peer_training",
        "peer": peer,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": harness.machine(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "vocab_size": data["vocab_size"],
        "train_sentences": data["sentences"],
        "loss": "label-smoothed (eps 0.1) cross-entropy per real target token, nats, last window",
        "throughput": "median over log windows after the first of real target tokens/s "
        "(wall) and per CPU-second of the training process (user + system, all threads)",
        "runs": results,
        "median": med,
        "ratio_ours_over_peer": ratio,
        "cpu_ratio_ours_over_peer": cpu_ratio,
    }
    harness.write_result(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
