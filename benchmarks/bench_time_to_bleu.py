"""Time to BLEU: train one experiment of a config for a wall-clock budget, then score every
checkpoint (and the average of the last K, §6.1) on the dev set and a test set; with
``--peer eole``, the same for the peer toolkit eole (the successor of OpenNMT-py) trained on the
same data, vocabulary, model shape and settings for the same budget.

The pipeline's own stages do the work, each as ``python -m transformer_nmt <stage>`` in a
subprocess: Snakemake builds the data (download → prepare → spm → encode) of the config, then
``train`` runs with the experiment's model and train settings except that ``max_steps`` is
raised (``--max-steps``, default: unbounded) and checkpoints are written every ``--every-steps``
optimizer steps or every ``--every-minutes`` minutes and all kept. When the budget is spent the
training process is interrupted (SIGINT, Lightning's graceful shutdown, which also saves the
step it stopped at), so the last checkpoint is the last one reached within the budget. Every
checkpoint is translated with the experiment's beam settings (§6.1: beam 4, alpha 0.6) by
``translate`` and scored by ``score`` (sacreBLEU); ``average`` builds the last-K average (K =
the experiment's ``average_last_k`` or ``--average-last``) at the end, or at every checkpoint
with ``--average-each``.

The peer (``--peer eole``; after our side, or alone with ``--peer-only``; needs
``--every-steps``): ``eole train`` in its own virtual environment (``--peer-venv``, made by
``benchmarks/peers/install_eole.sh``) on our training token ids written back as our
SentencePiece pieces with our vocabulary in id order (``bench_peer_training.write_peer_data``),
with ``benchmarks/peers/eole_tiny.yaml``'s settings, our model config's shape
(``bench_peer_decoding.eole_config``; pre-LN models only) and the experiment's settings mapped:
batch_size = max_tokens (tokens counting padding), accum_count = round(tokens_per_update /
max_tokens), eole's ``noam`` decay with learning_rate = lr_scale and warmup_steps = warmup,
Adam betas and epsilon, dropout = p_drop, attention_dropout = p_drop_attn, label smoothing =
eps_ls, gradient clipping, seed, fp32, no data-loader workers, no validation, a checkpoint
(``<model_path>/step_<N>/``) every ``--every-steps`` steps, all kept. It is stopped like ours
(SIGINT) at the budget or at ``--peer-max-steps`` (default ``--max-steps``: ours ends its
recipe, cool-down included, at ``--max-steps``, while eole's schedule has no end, so a longer
watch of the peer only favours it). What cannot be matched is listed in the output and
the JSON (eole's dropout after the FFN's ReLU, its data order). Each peer checkpoint is
translated by eole's own beam search (``benchmarks/peers/eole_decode.py``: beam, GNMT ``wu``
length penalty with alpha, batches of the experiment's ``max_tokens``; outputs capped at the
set's longest source + 1 + max_len_b, where ours caps each sentence at its |x EOS| + max_len_b)
from the sources as our SentencePiece pieces, its pieces are mapped back to our ids and decoded
by our SentencePiece model, and the text is scored by the same ``score`` stage as ours.

Minutes are measured from the start of the train process (so they include its start-up: imports
and loading the data) to the checkpoint's modification time: ours, the checkpoint file's; the
peer's, the latest of its ``step_<N>`` directory and the files in it. ``--threads`` (default:
``$OMP_NUM_THREADS``, else all cores) sets the OMP/MKL threads of every process of both sides.
"Minutes to reach dev BLEU X" (``--target-bleu``, default 30, on ``valid``, else the first set):
the first single checkpoint (not an average) at or above X, interpolated linearly between it and
the checkpoint before it; the ratio ours / peer of those minutes is printed when both reach it.

Runs go to ``benchmarks/out/time_to_bleu/<run>/`` (the peer's in its ``peer/``; deleted first
unless ``--resume``; ``--peer-only`` deletes only ``peer/``); the table (a row per side and
checkpoint) is printed, the JSON written to ``benchmarks/out/time_to_bleu_<run>.json`` (the
peer's rows, settings and eole config under ``peer``) and the figure of dev BLEU against minutes,
a line per side, to ``benchmarks/out/time_to_bleu_<run>.png``.

Usage (in the repository root, where Snakemake's ``results/`` lives, ``PYTHONPATH=src``):

    python benchmarks/bench_time_to_bleu.py --config config/config.yaml --minutes 12 \\
        --every-minutes 2 [--experiment multi30k_en_de_tiny] [--data-mirror ../shared/data] \\
        [--set train.lr_scale=0.5 --set model.p_drop=0.2] [--sets valid test_2016_flickr]

    python benchmarks/bench_time_to_bleu.py --minutes 12 --every-steps 50 --peer eole \\
        [--peer-only | --concurrent --threads 1] [--threads 2] [--target-bleu 30]

``--concurrent`` trains the two sides at the same time, each in its own process (on 2 cores with
``--threads 1``: a core each, the same conditions for both, half the wall time of one after
the other); scoring follows, one checkpoint at a time.

``--score-every-steps S`` scores only the checkpoints at multiples of S (and the last one).
``--set train.KEY=VALUE`` / ``--set model.KEY=VALUE`` override the experiment's train settings
or model overrides (values parsed as YAML); ``--max-steps`` bounds the run by steps as well.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import harness
import yaml
from harness import OUT, REPO, Experiment

UNBOUNDED_STEPS = 10_000_000


def apply_sets(exp: dict[str, Any], sets: list[str]) -> dict[str, Any]:
    """``train.KEY=VALUE`` / ``model.KEY=VALUE`` / ``translate.KEY=VALUE`` overrides (YAML
    values). ``translate.alpha: auto`` (the pipeline's dev search, after averaging) becomes the
    paper's fixed 0.6 here, so that every checkpoint is decoded alike: say another with
    ``--set translate.alpha=A``."""
    exp = json.loads(json.dumps(exp))
    sections = {"train": "train", "model": "model_overrides", "translate": "translate"}
    for item in sets:
        key, sep, value = item.partition("=")
        section, _, field = key.partition(".")
        if not sep or section not in sections or not field:
            sys.exit(
                f"--set {item!r}: expected train.KEY=VALUE, model.KEY=VALUE or translate.KEY=VALUE"
            )
        exp.setdefault(sections[section], {})[field] = yaml.safe_load(value)
    if exp["translate"].get("alpha") == "auto":
        from transformer_nmt.search import SearchSettings

        exp["translate"]["alpha"] = SearchSettings().alpha
        print(f"translate.alpha: auto -> {exp['translate']['alpha']} for every checkpoint")
    return exp


# --- stages -----------------------------------------------------------------------------------


def run_for_budget(
    cmd: list[str], log: Path, minutes: float, stop: signal.Signals = signal.SIGINT
) -> tuple[float, float]:
    """Run a training command until it ends or ``minutes`` have passed, then send it ``stop``
    (SIGINT: Lightning's graceful shutdown; eole's KeyboardInterrupt) and wait for it (SIGKILL
    after 2 minutes more). Returns (its start, epoch seconds; its wall seconds)."""
    started = time.time()
    with open(log, "a", encoding="utf-8") as handle:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=minutes * 60)
        except subprocess.TimeoutExpired:
            proc.send_signal(stop)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        else:
            if proc.returncode != 0:
                sys.exit(f"{Path(cmd[0]).name} train failed ({proc.returncode}); see {log}")
    return started, time.time() - started


def train(exp: Experiment, run_dir: Path, args) -> dict[str, Any]:
    """Train until the budget is spent; return {step: minutes since the train process began}."""
    every = {"checkpoint_every_steps": args.every_steps} if args.every_steps else {
        "checkpoint_every_steps": None, "checkpoint_every_minutes": args.every_minutes,
    }  # fmt: skip
    config = exp.train_config(
        max_steps=args.max_steps or UNBOUNDED_STEPS, keep_checkpoints=100_000, **every
    )
    cmd = harness.train_command(exp, run_dir, config)
    log = run_dir / "train.log"
    started, wall = run_for_budget(cmd, log, args.minutes)
    checkpoints = sorted((run_dir / "checkpoints").glob("step=*.ckpt"))
    if not checkpoints:
        sys.exit(f"no checkpoint was written within {args.minutes} minutes; see {log}")
    summary_path = run_dir / "train_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {
        "wall_seconds": wall,
        "summary": summary,
        "checkpoints": [
            {
                "path": str(path),
                "step": int(path.stem.split("=")[1]),
                "minutes": (path.stat().st_mtime - started) / 60,
            }
            for path in checkpoints
        ],
    }


def score_model(model: Path, exp: Experiment, sets: list[str], work: Path, tag: str) -> dict:
    """BLEU of ``model`` on each set (translate + score stages); {set: {bleu, chrf, seconds}}."""
    device = "cpu" if exp.settings["train"].get("accelerator") == "cpu" else "auto"
    scores = {}
    for test_set in sets:
        hyp = work / f"{tag}.{test_set}.hyp"
        started = time.time()
        harness.run_stage(
            harness.translate_command(exp, model, exp.text(test_set, exp.src), hyp, device),
            log=work / f"{tag}.{test_set}.translate.log",
        )
        scores[test_set] = score_hyp(hyp, test_set, exp, work, tag)
        scores[test_set]["translate_seconds"] = time.time() - started
    return scores


def score_hyp(
    hyp: Path, test_set: str, exp: Experiment, work: Path, tag: str, ref: str | None = None
) -> dict[str, float]:
    """sacreBLEU BLEU and chrF of the detokenised ``hyp`` by the pipeline's ``score`` stage,
    against ``test_set``'s reference (``ref``: another file of it)."""
    out = work / f"{tag}.{test_set}.scores.json"
    ref = ref or exp.text(test_set, exp.tgt)
    harness.run_stage(
        harness.score_command(exp, hyp, ref, out), log=work / f"{tag}.{test_set}.score.log"
    )
    payload = json.loads(out.read_text())
    return {
        "bleu": payload["bleu"]["score"],
        "chrf": payload["chrf"]["score"],
        "bleu_lc_tok": payload["bleu_lc_tok"]["score"],  # the Multi30k literature's kind
    }


def average(inputs: list[str], out: Path, work: Path) -> None:
    harness.run_stage(harness.average_command(inputs, out), log=work / f"{out.stem}.log")


# --- the peer: eole on the same data, vocabulary, model shape and settings ---------------------


def peer_train_config(exp: dict[str, Any], data: dict[str, Any], peer_dir: Path, args):
    """eole's training config for the experiment (``benchmarks/peers/eole_tiny.yaml`` with our
    model's shape and the experiment's settings mapped to eole's), and notes on what differs."""
    from types import SimpleNamespace

    from bench_peer_decoding import check_convertible, eole_config
    from bench_peer_training import peer_config, set_eole_init

    from transformer_nmt.model.config import model_config_from_spec
    from transformer_nmt.training.config import TrainConfig
    from transformer_nmt.training.rules import accumulation, resolve_precision

    spec = {"preset": exp["preset"], "overrides": exp.get("model_overrides") or {}}
    model = model_config_from_spec(spec)
    check_convertible(model.to_dict())
    train = TrainConfig.from_dict(exp["train"])
    if not isinstance(train.max_tokens, int):
        sys.exit("--peer needs an integer max_tokens (eole's batch_size), not 'auto'")
    notes = [
        f"eole drops out after the FFN's ReLU at its dropout ({model.p_drop}); ours at "
        f"p_drop_relu ({model.p_drop_relu})",
        f"gradient accumulation {accumulation(train)} = round(tokens_per_update / max_tokens); "
        "ours counts real target tokens per batch (its train.log)",
        "eole reads a shuffled bucket of the corpus; ours its own token-batch sampler",
    ]
    if resolve_precision(train) != "32-true":
        notes.append(f"ours trains in {resolve_precision(train)}, eole in fp32")
    if train.lr_cooldown_steps:
        notes.append(f"lr_cooldown_steps {train.lr_cooldown_steps}: eole has no cool-down")
    schedule = SimpleNamespace(
        log_every=train.log_every_steps,
        steps=args.peer_max_steps or args.max_steps or UNBOUNDED_STEPS,
        max_tokens=train.max_tokens, warmup=train.warmup, lr_scale=train.lr_scale,
        precision="fp32", eole_init="normal",
    )  # fmt: skip
    cfg = peer_config(schedule, data, peer_dir)
    cfg["seed"] = train.seed
    cfg["model"] = eole_config(model.to_dict(), data["vocab_size"], data["vocab"])["model"]
    set_eole_init(cfg, "normal")  # std from this model's d_model
    cfg["training"].update(
        save_checkpoint_steps=args.every_steps, keep_checkpoint=-1,
        accum_count=[accumulation(train)], adam_beta1=train.adam_betas[0],
        adam_beta2=train.adam_betas[1], adam_eps=train.adam_eps,
        max_grad_norm=train.clip_grad_norm or 0.0, label_smoothing=model.eps_ls,
        dropout=[model.p_drop], attention_dropout=[model.p_drop_attn],
    )  # fmt: skip
    return cfg, notes


def train_peer(exp: Experiment, peer_dir: Path, args) -> dict:
    """eole trained on our token ids (as pieces) for the budget; its checkpoints as ours."""
    from bench_peer_training import peer_version, write_peer_data

    data = write_peer_data(exp, peer_dir / "data")
    data.update(dir=peer_dir / "data", src=exp.src, tgt=exp.tgt)
    cfg, notes = peer_train_config(exp.settings, data, peer_dir, args)
    cfg_path = peer_dir / "eole_train.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    cmd = [str(args.peer_venv / "bin" / "eole"), "train", "-config", str(cfg_path)]
    log = peer_dir / "train.log"
    started, wall = run_for_budget(cmd, log, args.minutes)
    checkpoints = []
    for step_dir in (peer_dir / "eole_model").glob("step_*"):
        files = [step_dir / name for name in ("model.00.safetensors", "vocab.json", "config.json")]
        if not all(f.is_file() for f in files):  # interrupted while saving
            continue
        written = max(path.stat().st_mtime for path in [step_dir, *files])
        checkpoints.append(
            {
                "path": str(step_dir),
                "step": int(step_dir.name.split("_")[1]),
                "minutes": (written - started) / 60,
            }
        )
    if not checkpoints:
        sys.exit(f"eole wrote no checkpoint within {args.minutes} minutes; see {log}")
    return {
        "version": peer_version(args.peer_venv),
        "config": cfg,
        "notes": notes,
        "wall_seconds": wall,
        "checkpoints": sorted(checkpoints, key=lambda c: c["step"]),
    }


def peer_sources(exp: Experiment, sets: list[str], work: Path, max_len_b: int) -> dict[str, dict]:
    """Each set's source as our SentencePiece pieces (the peer's training format: no EOS added)
    and eole's one output cap: the longest |x EOS| + max_len_b (ours: per sentence)."""
    from bench_peer_training import PieceCodec

    codec = PieceCodec(REPO / exp.spm)
    sources = {}
    for test_set in sets:
        lines = (REPO / exp.text(test_set, exp.src)).read_text("utf-8").splitlines()
        encoded = [codec.encode(line) for line in lines]
        pieces = work / f"{test_set}.{exp.src}.pieces"
        pieces.write_text("".join(line + "\n" for line in encoded), "utf-8")
        cap = max(len(line.split()) + 1 for line in encoded) + max_len_b
        sources[test_set] = {"pieces": pieces, "max_length": cap}
    return {"sets": sources, "codec": codec}


def score_peer_model(step_dir: Path, exp: Experiment, sources, work: Path, tag: str, args) -> dict:
    """BLEU of an eole checkpoint on each set: eole's beam search (bench_peer_decoding's
    settings), its pieces decoded by our SentencePiece model, scored by ``score``."""
    from types import SimpleNamespace

    from bench_peer_decoding import time_eole

    tr = exp.settings["translate"]
    search = SimpleNamespace(
        peer_venv=args.peer_venv, beam=tr["beam"], alpha=tr["alpha"],
        max_tokens=tr["max_tokens"], runs=0,
    )  # fmt: skip
    codec = sources["codec"]
    scores = {}
    for test_set, source in sources["sets"].items():
        out, hyp = work / f"{tag}.{test_set}.pieces", work / f"{tag}.{test_set}.hyp"
        started = time.time()
        time_eole(search, step_dir, None, source["pieces"], source["max_length"], args.threads, out)
        seconds = time.time() - started
        codec.unknown = 0
        lines = out.read_text(encoding="utf-8").splitlines()
        hyp.write_text("".join(codec.decode(line) + "\n" for line in lines), "utf-8")
        scores[test_set] = score_hyp(hyp, test_set, exp, work, tag)
        scores[test_set].update(translate_seconds=seconds, unknown_pieces=codec.unknown)
    return scores


# --- results ----------------------------------------------------------------------------------


def minutes_to_bleu(points: list[tuple[float, float]], target: float) -> float | None:
    """Minutes at which BLEU first reaches ``target``, from (minutes, BLEU) checkpoints in
    training order: interpolated linearly between the last checkpoint below the target and the
    first at or above it; that checkpoint's minutes when it is the first one; None if none is."""
    previous = None
    for minutes, bleu in points:
        if bleu >= target:
            if previous is None:
                return minutes
            m0, b0 = previous
            return m0 + (target - b0) / (bleu - b0) * (minutes - m0)
        previous = (minutes, bleu)
    return None


def curve(rows: list[dict], test_set: str) -> list[tuple[float, float]]:
    """(minutes, BLEU) on ``test_set`` of the single checkpoints (not averages) of ``rows``."""
    return [
        (row["minutes"], row["scores"][test_set]["bleu"])
        for row in rows
        if "averaged_steps" not in row and test_set in row["scores"]
    ]


def plot(curves: dict[str, list[tuple[float, float]]], target: float, test_set: str, path: Path,
         title: str) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for side, points in curves.items():
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=side)
    ax.axhline(target, color="grey", linestyle=":", linewidth=1, label=f"BLEU {target:g}")
    ax.set_xlabel("training minutes (from the start of the train process)")
    ax.set_ylabel(f"BLEU on {test_set}")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "config" / "config.yaml")
    parser.add_argument("--experiment", help="experiment of the config (default: its only one)")
    parser.add_argument("--minutes", type=float, required=True, help="wall-clock training budget")
    interval = parser.add_mutually_exclusive_group()
    interval.add_argument("--every-minutes", type=float, default=2.0, help="checkpoint interval")
    interval.add_argument("--every-steps", type=int, help="checkpoint interval in steps")
    parser.add_argument("--max-steps", type=int, help="also stop at this step")
    parser.add_argument("--average-last", type=int, help="K (default: average_last_k)")
    parser.add_argument("--average-each", action="store_true", help="last-K average at every ckpt")
    parser.add_argument(
        "--score-every-steps", type=int, help="score only checkpoints at multiples of this step"
    )
    parser.add_argument("--sets", nargs="+", default=["valid", "test_2016_flickr"])
    parser.add_argument("--set", dest="sets_", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--data-mirror", default=os.environ.get("TRANSFORMER_NMT_MIRROR"))
    parser.add_argument("--name", help="name of the run (default: the experiment's)")
    parser.add_argument("--resume", action="store_true", help="keep the run directory")
    parser.add_argument("--out", type=Path, help="JSON path (default: benchmarks/out/...)")
    parser.add_argument(
        "--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count()),
        help="intra-op threads of every process, both sides ($OMP_NUM_THREADS, else all cores)",
    )  # fmt: skip
    parser.add_argument("--peer", choices=["eole"], help="also train and score the peer toolkit")
    parser.add_argument("--peer-only", action="store_true", help="the peer's side only")
    parser.add_argument("--peer-max-steps", type=int, help="the peer's step cap (--max-steps)")
    parser.add_argument(
        "--concurrent", action="store_true",
        help="train both sides at the same time (2 cores: --threads 1, a core each)",
    )  # fmt: skip
    parser.add_argument("--peer-venv", type=Path, default=REPO / "benchmarks" / ".venv-peer-eole")
    parser.add_argument("--target-bleu", type=float, default=30.0, help="on the valid set")
    args = parser.parse_args()
    if args.peer_only and not args.peer:
        parser.error("--peer-only needs --peer eole")
    if args.concurrent and (args.peer_only or not args.peer):
        parser.error("--concurrent needs --peer eole and both sides (not --peer-only)")
    if args.peer and not args.every_steps:
        parser.error("--peer needs --every-steps (eole checkpoints by steps only)")
    if args.peer and not (args.peer_venv / "bin" / "eole").exists():
        sys.exit(f"{args.peer_venv}: no eole there; run benchmarks/peers/install_eole.sh")
    os.environ.update(harness.thread_env(args.threads))  # every process: both sides, all stages

    config_path = args.config.resolve()
    exp = harness.load_experiment(config_path, args.experiment, lambda e: apply_sets(e, args.sets_))
    name, settings = exp.name, exp.settings
    run_name = args.name or name
    run_dir = OUT / "time_to_bleu" / run_name
    peer_dir = run_dir / "peer"
    fresh = peer_dir if args.peer_only else run_dir
    if fresh.exists() and not args.resume:
        shutil.rmtree(fresh)
    work = run_dir / "eval"
    work.mkdir(parents=True, exist_ok=True)
    k = args.average_last or int(settings.get("average_last_k", 1))

    harness.build_data(exp, args.sets, args.data_mirror)
    load_before = os.getloadavg()
    peer = None
    if args.concurrent:  # both sides at once, each in its own process with --threads threads
        peer_dir.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=2) as pool:
            ours_job = pool.submit(train, exp, run_dir, args)
            peer_job = pool.submit(train_peer, exp, peer_dir, args)
            trained, peer = ours_job.result(), peer_job.result()
        load_after = os.getloadavg()
        peer.update(loadavg_before=load_before, loadavg_after_train=load_after)
    else:
        trained = None if args.peer_only else train(exp, run_dir, args)
        load_after = os.getloadavg()
        if args.peer:
            peer_dir.mkdir(parents=True, exist_ok=True)
            peer = train_peer(exp, peer_dir, args)
            peer.update(loadavg_before=load_after, loadavg_after_train=os.getloadavg())

    def scored(checkpoints: list[dict]):
        """(index, checkpoint) of the checkpoints to score (--score-every-steps)."""
        every = args.score_every_steps
        for i, ckpt in enumerate(checkpoints):
            if not every or ckpt["step"] % every == 0 or i == len(checkpoints) - 1:
                yield i, ckpt

    rows = []
    checkpoints = trained["checkpoints"] if trained else []
    scored_ours = dict(scored(checkpoints))
    for i, ckpt in enumerate(checkpoints):
        if i in scored_ours:
            row = {"model": f"step {ckpt['step']}", **ckpt}
            row["scores"] = score_model(Path(ckpt["path"]), exp, args.sets, work, f"s{i}")
            rows.append(row)
        if i + 1 >= k and k > 1 and (args.average_each or i == len(checkpoints) - 1):
            window = checkpoints[i + 1 - k : i + 1]
            model = work / f"avg{k}_step{ckpt['step']}.pt"
            average([c["path"] for c in window], model, work)
            avg = {"model": f"avg last {k} @ {ckpt['step']}", **ckpt, "path": str(model)}
            avg["averaged_steps"] = [c["step"] for c in window]
            avg["scores"] = score_model(model, exp, args.sets, work, f"a{i}")
            rows.append(avg)
    if peer:
        peer_work = peer_dir / "eval"
        peer_work.mkdir(parents=True, exist_ok=True)
        sources = peer_sources(exp, args.sets, peer_work, settings["translate"]["max_len_b"])
        peer["rows"] = [
            {
                "model": f"step {ckpt['step']}",
                **ckpt,
                "scores": score_peer_model(
                    Path(ckpt["path"]), exp, sources, peer_work, f"s{i}", args
                ),
            }
            for i, ckpt in scored(peer["checkpoints"])
        ]

    sides = {"ours": rows} if trained else {}
    if peer:
        sides["eole"] = peer["rows"]
    header = f"{'side':<5} {'model':<22} {'step':>7} {'minutes':>8}"
    print(f"\n{run_name}: BLEU (chrF) against training minutes, {args.threads} threads")
    print(header + "".join(f" {s:>18}" for s in args.sets))
    for side, side_rows in sides.items():
        for row in side_rows:
            cells = "".join(
                f" {row['scores'][s]['bleu']:>10.2f} ({row['scores'][s]['chrf']:5.1f})"
                for s in args.sets
            )
            print(f"{side:<5} {row['model']:<22} {row['step']:>7} {row['minutes']:>8.2f}{cells}")

    dev = "valid" if "valid" in args.sets else args.sets[0]
    curves = {side: curve(side_rows, dev) for side, side_rows in sides.items()}
    reached = {side: minutes_to_bleu(points, args.target_bleu) for side, points in curves.items()}
    for side, minutes in reached.items():
        when = "not reached" if minutes is None else f"{minutes:.2f}"
        print(f"{side}: minutes to reach {dev} BLEU {args.target_bleu:g}: {when}")
    ratio = None
    if len(reached) == 2 and None not in reached.values():
        ratio = reached["ours"] / reached["eole"]
        print(f"ratio ours / eole: {ratio:.2f}")
    if peer:
        for note in peer["notes"]:
            print(f"eole: {note}")

    result = {
        "config": str(config_path),
        "experiment": name,
        "run": run_name,
        "settings": settings,
        "minutes_budget": args.minutes,
        "every_minutes": None if args.every_steps else args.every_minutes,
        "every_steps": args.every_steps,
        "average_last_k": k,
        "threads": args.threads,
        "train_wall_seconds": trained["wall_seconds"] if trained else None,
        "train_summary": trained["summary"] if trained else None,
        "loadavg_before": load_before,
        "loadavg_after_train": load_after,
        "machine": harness.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "rows": rows,
        "minutes_to_bleu": {
            "set": dev,
            "target": args.target_bleu,
            "rule": "first single checkpoint at or above the target, interpolated linearly "
            "from the checkpoint before it; null: not reached",
            **reached,
            "ratio_ours_over_eole": ratio,
        },
    }
    if peer:
        result["peer"] = {
            "toolkit": peer["version"],
            "train_wall_seconds": peer["wall_seconds"],
            "loadavg_before": peer["loadavg_before"],
            "loadavg_after_train": peer["loadavg_after_train"],
            "differences": peer["notes"],
            "eole_config": peer["config"],
            "rows": peer["rows"],
        }
    out = args.out or OUT / f"time_to_bleu_{run_name}.json"
    harness.write_result(out, result)
    figure = out.with_suffix(".png")
    plot(curves, args.target_bleu, dev, figure, f"{run_name}: {dev} BLEU against minutes")
    print(f"wrote {out} and {figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
