"""Checkpoints at a model's real size on a CPU: writing a full checkpoint and making it
weights-only, loading the full one for a resume, and averaging a §6.1 window of them.

A run keeps ``keep_checkpoints`` checkpoints for averaging: the newest full (fp32 weights and
Adam's two moments, as Lightning writes it through ``training.trainer.AtomicCheckpointIO``), the
older ones weights-only (``runs.checkpoints.demote_to_weights_only``). This script builds that
window for a preset (default ``big``, V = 37,000: WMT14 EN-DE) from random weights, then, each
in a fresh process, measures:

- ``write_full``: one full checkpoint written atomically (s, bytes);
- ``demote``: that file rewritten weights-only (s, bytes);
- ``load_for_resume``: ``load_checkpoint`` of the full one (s, peak RSS growth);
- ``average``: the ``average`` stage over the whole window, as the pipeline runs it (s, the
  process's peak RSS, imports included, against the model's fp32 weights).

Usage: ``python benchmarks/bench_checkpoints.py [--preset big] [--vocab 37000] [--count 20]
[--dir /tmp/ckpt_bench] [--src src] [--keep] [--reuse]`` (``--src``: the package tree the
measuring processes import, for an A/B against another commit's ``src``: build the window once
with ``--keep``, then measure it with ``--reuse --src <other tree>``). Prints a table and writes
``benchmarks/out/checkpoints.json``. Needs ``count - 1`` weights-only files and one full one on
disk (big: ~19 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out" / "checkpoints.json"
REPO = Path(__file__).resolve().parents[1]
VOCAB = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3, "sha256": "0" * 64}


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def build_window(preset: str, vocab: int, count: int, directory: Path) -> dict:
    """``count - 1`` weights-only checkpoints and a full newest one in ``directory``; returns
    the write and demotion figures of one file."""
    import torch

    from transformer_nmt.model.config import get_preset
    from transformer_nmt.model.transformer import Transformer
    from transformer_nmt.runs import checkpoints as ck
    from transformer_nmt.training.trainer import AtomicCheckpointIO

    torch.manual_seed(0)
    cfg = get_preset(preset)
    model = Transformer(cfg, vocab_size=vocab, pad_id=0)
    params = list(model.parameters())
    # Adam's state as torch.optim.Adam's state_dict holds it: a step and two fp32 moments each
    state = {i: {"step": torch.tensor(1000.0), "exp_avg": torch.randn_like(p),
                 "exp_avg_sq": torch.rand_like(p)} for i, p in enumerate(params)}  # fmt: skip
    payload = {
        "epoch": 0,
        "global_step": 1000,
        "pytorch-lightning_version": "2",
        "state_dict": {f"{ck.MODEL_PREFIX}{k}": v for k, v in model.state_dict().items()},
        "loops": {"fit_loop": {}},
        "callbacks": {"StepCheckpoint": {}},
        "optimizer_states": [{"state": state, "param_groups": [{"lr": 1e-4, "params": []}]}],
        "lr_schedulers": [{"last_epoch": 1000}],
        "hparams_name": "kwargs",
        "hyper_parameters": {"model_config": cfg.to_dict(), "vocab": {**VOCAB, "size": vocab}},
        ck.LEARNING_KEY: {"fingerprint": "bench"},
    }
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    weights_bytes = sum(p.numel() * p.element_size() for p in params)
    first = directory / ck.checkpoint_name(1000)
    start = time.perf_counter()
    AtomicCheckpointIO().save_checkpoint(payload, first)
    write_s = time.perf_counter() - start
    full_bytes = first.stat().st_size
    start = time.perf_counter()
    assert ck.demote_to_weights_only(first)
    demote_s = time.perf_counter() - start
    for step in range(1001, 1000 + count - 1):
        shutil.copyfile(first, directory / ck.checkpoint_name(step))
    AtomicCheckpointIO().save_checkpoint(payload, directory / ck.checkpoint_name(1000 + count - 1))
    return {
        "params": sum(p.numel() for p in params),
        "weights_bytes": weights_bytes,
        "write_full_s": write_s,
        "full_bytes": full_bytes,
        "demote_s": demote_s,
        "weights_only_bytes": first.stat().st_size,
    }


def load_for_resume(directory: Path) -> dict:
    """``load_checkpoint`` of the newest (full) checkpoint in this (fresh) process."""
    from transformer_nmt.runs import checkpoints as ck

    newest = ck.list_checkpoints(directory)[-1]
    before = _rss_mib()
    start = time.perf_counter()
    payload = ck.load_checkpoint(newest)
    seconds = time.perf_counter() - start
    assert "optimizer_states" in payload
    return {"seconds": seconds, "rss_growth_mib": _rss_mib() - before}


def average_stage(directory: Path, count: int, env: dict) -> dict:
    """The ``average`` stage as the pipeline runs it, in its own process: wall time and the
    process's peak RSS (imports included)."""
    out = directory / "averaged.pt"
    command = [sys.executable, "-m", "transformer_nmt", "average", "--checkpoint-dir",
               str(directory), "--last", str(count), "--out", str(out)]  # fmt: skip
    log = directory / "average.log"
    start = time.perf_counter()
    with open(log, "wb") as handle:
        proc = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"average failed: {log.read_text()[-2000:]}")
    return {"seconds": seconds, "peak_rss_mib": usage.ru_maxrss / 1024, "files": count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="big")
    parser.add_argument("--vocab", type=int, default=37_000)
    parser.add_argument("--count", type=int, default=20, help="checkpoints averaged (§6.1: 20)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/transformer_nmt_ckpt_bench"))
    parser.add_argument("--src", type=Path, default=REPO / "src", help="package tree measured")
    parser.add_argument("--keep", action="store_true", help="keep the window's files")
    parser.add_argument(
        "--reuse", action="store_true", help="measure a window kept by --keep (with --out's build)"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "build":
        row = build_window(args.preset, args.vocab, args.count, args.dir)
        print(json.dumps(row))
        return
    if args.child == "load_for_resume":
        print(json.dumps(load_for_resume(args.dir)))
        return

    env = {**os.environ, "PYTHONPATH": str(args.src.resolve())}
    common = ["--preset", args.preset, "--vocab", str(args.vocab), "--count", str(args.count),
              "--dir", str(args.dir)]  # fmt: skip

    def child(kind: str) -> dict:
        command = [sys.executable, __file__, *common, "--child", kind]
        result = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
        return json.loads(result.stdout.strip().splitlines()[-1])

    built = child("build") if not args.reuse else json.loads(args.out.read_text())["build"]
    weights_mib = built["weights_bytes"] / 2**20
    rows = {"load_for_resume": child("load_for_resume"),
            "average": average_stage(args.dir, args.count, env)}  # fmt: skip
    window_old = args.count * built["full_bytes"]
    window_new = (args.count - 1) * built["weights_only_bytes"] + built["full_bytes"]
    print(f"{args.preset}, V = {args.vocab:,}: {built['params'] / 1e6:.1f}M parameters, "
          f"fp32 weights {weights_mib:,.0f} MiB; package: {args.src}")  # fmt: skip
    print(f"{'step':<28} {'seconds':>8} {'size / RSS growth':>20}")
    print(f"{'write full checkpoint':<28} {built['write_full_s']:>8.1f} "
          f"{built['full_bytes'] / 2**30:>16.2f} GiB")  # fmt: skip
    print(f"{'make it weights-only':<28} {built['demote_s']:>8.1f} "
          f"{built['weights_only_bytes'] / 2**30:>16.2f} GiB")  # fmt: skip
    resume, average = rows["load_for_resume"], rows["average"]
    growth, peak = resume["rss_growth_mib"], average["peak_rss_mib"]
    print(f"{'load full one for resume':<28} {resume['seconds']:>8.1f} "
          f"{growth:>9,.0f} MiB more = {growth / weights_mib:.2f}x weights")  # fmt: skip
    label = f"average stage ({args.count} files)"
    print(f"{label:<28} {average['seconds']:>8.1f} "
          f"{peak:>9,.0f} MiB peak = {peak / weights_mib:.2f}x weights")  # fmt: skip
    print(
        f"window of {args.count}: {window_new / 2**30:.1f} GiB "
        f"({window_new / window_old:.0%} of {window_old / 2**30:.1f} GiB all full)"
    )
    meta = {
        "preset": args.preset, "vocab": args.vocab, "count": args.count, "src": str(args.src),
        "machine": platform.machine(), "python": platform.python_version(),
        "window_bytes": window_new, "window_bytes_all_full": window_old,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "build": built, **rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
