"""The literature's Multi30k recipe on fairseq, beside our CPU recipe: minutes to dev BLEU and the
final test BLEU, on the same data and the same cores.

The peer is the text-only Transformer-tiny baseline of Wu et al. 2021, "Good for Misconceived
Reasons" (ACL 2021; github.com/LividWo/Revisit-MMT, ``README-baseline.md``: 41.02 BLEU4 on
test_2016_flickr, lowercased tokenized), trained by fairseq (fairseq-fixed 0.12.3.1 in the venv
of ``benchmarks/peers/install_fairseq.sh``) with the published settings (``WU2021``):

- model: their fork's ``transformer_tiny``: 4 + 4 post-LN layers, d_model 128, FFN 256, 4 heads,
  all embeddings shared, dropout 0.3 (none on attention weights or after the ReLU). fairseq
  0.12's own ``transformer_tiny`` is another model (d_model 64, 2 layers), so the shape is given
  flag by flag;
- training: Adam with their fork's defaults (betas (0.9, 0.999), eps 1e-8), lr 0.005 after 2,000
  linear warm-up updates from 1e-7, then inverse square root; label-smoothed cross-entropy 0.1;
  batches of 4,096 tokens; 8,000 updates, or fewer: training stops after 10 epochs without a
  better valid loss (``--patience 10``); a checkpoint per epoch;
- the published command ran on two GPUs (``CUDA_VISIBLE_DEVICES=0,1``, data-parallel), so one
  update summed the gradients of two 4,096-token batches. One process does the same with
  ``--update-freq 2`` (the default here; ``--update-freq 1`` gives the command line's literal
  4,096 tokens per update);
- evaluation (their ``evaluate.sh``): the average of the last 10 epoch checkpoints, beam 5,
  length penalty 1.

Only the data are ours, so that both sides translate the same text: the CPU recipe's
(``--config``, default ``config/experiments/multi30k_en_de_cpu.yaml``: Multi30k EN-DE, cased,
our 8,000 SentencePiece pieces, built by the pipeline's own data stages). The peer reads them as
pieces (``bench_peer_training.write_peer_data``: the same ids, our vocabulary as fairseq's
dictionary) and its output pieces are detokenised by our SentencePiece model. Wu et al. trained
on lowercased, tokenized text with 10,000 BPE merges; their 41.02 is not this run's number.

**The curve.** fairseq keeps every epoch's checkpoint; after training, the first epoch
checkpoint at or past every ``--every-updates`` updates (500), and the last, is translated on
the dev set (valid) by ``fairseq-generate`` (beam 5) and scored by our ``score`` stage
(sacreBLEU). Epoch checkpoints, not fairseq's ``--save-interval-updates``: fairseq validates at
every mid-epoch save and counts that validation toward ``--patience``, so extra saves would stop
the recipe earlier than published (a run of this script at 027890d stopped at update 4,500,
inside epoch 68, where epoch-end validations alone would have gone on at least to the end of
epoch 69). Its minutes are from the start of the ``fairseq-train``
process to the checkpoint file's modification time. Training may run in several invocations
(``--minutes`` per invocation, ``--resume`` to go on: fairseq restarts from its
``checkpoint_last.pt``); the minutes add up each earlier invocation's time up to its last
``checkpoint_last.pt`` (what came after it was lost and is trained again).

**Ours** (``--ours RUN_DIR``, a finished run of the CPU recipe, e.g.
``results/runs/multi30k_en_de_cpu``): its ``metrics.csv`` gives dev BLEU (§6.1 beam search, beam
4, α 0.6, at each validation) against training minutes (``elapsed_s``: the train stage's wall
time, the validations in it included), and its ``<test set>.scores.json`` the final test BLEU
of the pipeline (the averaged model, α chosen on dev).

Printed: the peer's checkpoints (updates, minutes, dev sacreBLEU), minutes to each
``--targets`` dev BLEU (30, 35) for both sides and their ratio, and the final test BLEU
(sacreBLEU and lowercased tokenized) of both. Written: ``benchmarks/out/peer_recipe_<name>.json``
and a figure of dev BLEU against minutes beside it. Run directory:
``benchmarks/out/peer_recipe/<name>/`` (one that exists is gone on with by ``--resume``, else
refused: nothing is deleted).

Usage (repository root, the project's venv; on a 2-core Xeon at ``--update-freq 2``, ~5,000
target tokens/s and 6,760 per update, ``--patience`` stopped a run after 4,500 updates and 100
minutes; the 8,000 updates at most would take ~3 h):

    python benchmarks/bench_peer_recipe.py --data-mirror ../shared/data --minutes 150
    python benchmarks/bench_peer_recipe.py --resume --minutes 150          # resumes
    python benchmarks/bench_peer_recipe.py --resume --minutes 0 \\
        --ours results/runs/multi30k_en_de_cpu                            # scores only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness
from harness import OUT, REPO, Experiment

# Wu et al. 2021's command (README-baseline.md) and their fork's defaults it relies on.
WU2021 = {
    "layers": 4, "d_model": 128, "d_ff": 256, "heads": 4, "dropout": 0.3,
    "lr": 0.005, "warmup_updates": 2000, "warmup_init_lr": 1e-7,
    "adam_betas": "(0.9, 0.999)", "adam_eps": 1e-8, "label_smoothing": 0.1,
    "max_tokens": 4096, "gpus": 2, "max_update": 8000, "patience": 10,
    "average_last_epochs": 10, "beam": 5, "lenpen": 1.0, "batch_size": 128,
}  # fmt: skip
DONE = re.compile(r"done training in [0-9.]+ seconds")
# fairseq's checkpoint names: per epoch, every --save-interval-updates updates, the latest
EPOCH_CKPT = re.compile(r"checkpoint(\d+)\.pt")
UPDATE_CKPT = re.compile(r"checkpoint_(\d+)_(\d+)\.pt")
HYPOTHESIS = re.compile(r"^H-(\d+)\t[^\t]*\t(.*)$")
# The mean of the epoch checkpoints' weights, what fairseq's scripts/average_checkpoints.py
# does; that script is not in the fairseq-fixed package, so the peer's python runs this.
AVERAGE = """\
import sys, torch
out, paths = sys.argv[1], sys.argv[2:]
states = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]
last = states[-1]
for key, value in last["model"].items():
    mean = sum(s["model"][key].double() for s in states) / len(states)
    last["model"][key] = mean.to(value.dtype)
last["last_optimizer_state"] = None  # decoding only
torch.save(last, out)
"""


def fairseq_train_args(args, bin_dir: Path, save_dir: Path, src: str, tgt: str) -> list[str]:
    """``fairseq-train``'s arguments: Wu et al.'s recipe (module doc) on ``bin_dir``."""
    w = WU2021
    shape = []
    for side in ("encoder", "decoder"):
        shape += [f"--{side}-layers", str(w["layers"]), f"--{side}-embed-dim", str(w["d_model"]),
                  f"--{side}-ffn-embed-dim", str(w["d_ff"]),
                  f"--{side}-attention-heads", str(w["heads"])]  # fmt: skip
    return [
        str(bin_dir), "--task", "translation", "--source-lang", src, "--target-lang", tgt,
        "--arch", "transformer", "--share-all-embeddings", *shape,
        "--dropout", str(w["dropout"]), "--attention-dropout", "0", "--activation-dropout", "0",
        "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", str(w["label_smoothing"]),
        "--optimizer", "adam", "--adam-betas", w["adam_betas"], "--adam-eps", str(w["adam_eps"]),
        "--lr-scheduler", "inverse_sqrt", "--lr", str(w["lr"]),
        "--warmup-updates", str(w["warmup_updates"]), "--warmup-init-lr", str(w["warmup_init_lr"]),
        "--max-tokens", str(w["max_tokens"]), "--update-freq", str(args.update_freq),
        "--max-update", str(args.max_update), "--patience", str(w["patience"]),
        # every epoch's checkpoint (~28 MB each) is kept for the curve; no mid-epoch saves,
        # whose validations would count toward --patience (module doc)
        "--save-dir", str(save_dir), "--keep-last-epochs", "-1",
        "--log-format", "simple", "--log-interval", "100", "--cpu",
        "--num-workers", "1", "--seed", str(args.seed),
    ]  # fmt: skip


def minutes_ratios(
    peer: dict[str, float | None], ours: dict[str, float | None]
) -> dict[str, float]:
    """Our minutes to each dev BLEU target over the peer's, for the targets both sides reached."""
    return {t: ours[t] / peer[t] for t in peer if peer[t] and ours.get(t) is not None}


def trained_minutes(mtime: float, segments: list[dict[str, float]]) -> float | None:
    """Training minutes at which a file written at ``mtime`` was reached: the earlier segments'
    time up to their resume point (``resume_at``: their last ``checkpoint_last.pt``) plus the
    time since the start of the segment that wrote it; None if no segment did."""
    before = 0.0
    for seg in segments:
        end = seg.get("ended", float("inf"))
        if seg["started"] <= mtime <= end:
            return (before + mtime - seg["started"]) / 60
        before += max(0.0, seg.get("resume_at", seg["started"]) - seg["started"])
    return None


def fairseq_generate_args(bin_dir: Path, model: Path, subset: str, src: str, tgt: str) -> list[str]:
    """``fairseq-generate``'s arguments: Wu et al.'s evaluation (beam 5, length penalty 1,
    128 sentences a batch) of ``model`` on the binarised ``subset``.

    fairseq 0.12's ``batch_by_size`` drops the last batch when its size is not a multiple of
    ``--required-batch-size-multiple`` (default 8; facebookresearch/fairseq#5036): on our dev
    set the 6 longest of 1,014 sentences went untranslated. 1 keeps every sentence."""
    w = WU2021
    return [
        str(bin_dir), "--path", str(model), "--task", "translation",
        "--source-lang", src, "--target-lang", tgt, "--gen-subset", subset,
        "--beam", str(w["beam"]), "--lenpen", str(w["lenpen"]),
        "--batch-size", str(w["batch_size"]), "--required-batch-size-multiple", "1", "--cpu",
    ]  # fmt: skip


SAVED = re.compile(r"Saved checkpoint \S*?checkpoint(\d+)\.pt \(epoch \d+ @ (\d+) updates")


def epoch_updates(train_log: str) -> dict[int, int]:
    """Updates done at each epoch checkpoint, from fairseq-train's "Saved checkpoint" lines."""
    return {int(m[1]): int(m[2]) for m in SAVED.finditer(train_log)}


def curve_checkpoints(
    by_epoch: list[tuple[int, Path]], updates_at: dict[int, int], every: int
) -> list[tuple[int, Path]]:
    """(updates, checkpoint) for the curve: the first epoch checkpoint at or past each multiple
    of ``every`` updates, and the last epoch's."""
    known = [(updates_at[epoch], path) for epoch, path in by_epoch if epoch in updates_at]
    chosen, next_mark = [], every
    for updates, path in known:
        if updates >= next_mark:
            chosen.append((updates, path))
            next_mark = (updates // every + 1) * every
    if known and (not chosen or chosen[-1] != known[-1]):
        chosen.append(known[-1])
    return chosen


def checkpoints(save_dir: Path) -> tuple[list[tuple[int, Path]], list[tuple[int, Path]]]:
    """(updates, path) of the every-N-updates checkpoints and (epoch, path) of the epoch
    checkpoints in ``save_dir``, each in training order."""
    by_update, by_epoch = [], []
    for path in save_dir.glob("checkpoint*.pt"):
        if m := UPDATE_CKPT.fullmatch(path.name):
            by_update.append((int(m[2]), path))
        elif m := EPOCH_CKPT.fullmatch(path.name):
            by_epoch.append((int(m[1]), path))
    return sorted(by_update), sorted(by_epoch)


def read_hypotheses(text: str, sentences: int) -> list[str]:
    """fairseq-generate's best hypotheses ("H-<id>\\t<score>\\t<pieces>") in input order."""
    found = {int(m[1]): m[2] for m in map(HYPOTHESIS.match, text.splitlines()) if m}
    missing = sorted(set(range(sentences)) - set(found))
    if missing:
        raise ValueError(f"fairseq-generate gave no hypothesis for {len(missing)} of "
                         f"{sentences} sentences (first: {missing[0]})")  # fmt: skip
    return [found[i] for i in range(sentences)]


def translate(args, model: Path, subset: str, test_set: str, ctx: dict, tag: str) -> dict:
    """sacreBLEU of ``model`` on ``test_set`` (fairseq's binarised ``subset``): fairseq-generate's
    beam search, its pieces detokenised by our SentencePiece model, our ``score`` stage. Kept in
    ``<tag>.<test_set>.scores.json`` and read back from there when it exists (``--resume``)."""
    from bench_time_to_bleu import score_hyp

    work = ctx["work"]
    cached = work / f"{tag}.{test_set}.scores.json"
    if cached.exists():
        return json.loads(cached.read_text(encoding="utf-8"))
    cmd = [
        str(args.peer_venv / "bin" / "fairseq-generate"),
        *fairseq_generate_args(ctx["bin_dir"], model, subset, ctx["src"], ctx["tgt"]),
    ]
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    seconds = time.time() - started
    if proc.returncode != 0:
        sys.exit(f"fairseq-generate failed on {model} ({subset}):\n{proc.stderr[-3000:]}")
    sentences = ctx["sentences"][test_set]
    codec = ctx["codec"]
    codec.unknown = 0
    hyp = work / f"{tag}.{test_set}.hyp"
    try:
        pieces = read_hypotheses(proc.stdout, sentences)
    except ValueError as err:
        sys.exit(f"{model} on {subset}: {err}; its output is not fairseq-generate's H- lines")
    hyp.write_text("".join(codec.decode(line) + "\n" for line in pieces), encoding="utf-8")
    ref = ctx["refs"][test_set]
    scores = score_hyp(hyp, test_set, ctx["exp"], work, f"{tag}.sacrebleu", ref)
    scores.update(translate_seconds=seconds, unknown_pieces=codec.unknown)
    cached.write_text(json.dumps(scores, indent=2) + "\n", encoding="utf-8")
    return scores


def ours_side(run_dir: Path, test_sets: list[str]) -> dict[str, Any]:
    """Our recipe's finished run: (minutes, dev BLEU) at each validation with beam BLEU, and
    the pipeline's test scores."""
    from transformer_nmt.runs.metrics_history import read_metrics

    rows = read_metrics(run_dir / "metrics.csv")
    curve = [(r.elapsed_s / 60, r.values["val_bleu_beam"], r.step)
             for r in rows if "val_bleu_beam" in r.values]  # fmt: skip
    if not curve:
        sys.exit(f"{run_dir / 'metrics.csv'}: no dev BLEU (val_bleu_beam) in it; the recipe "
                 "measures it every val_beam_bleu_every_steps")  # fmt: skip
    tests = {}
    for test_set in test_sets:
        path = run_dir / f"{test_set}.scores.json"
        if not path.exists():
            sys.exit(f"{path}: missing; finish the run's DAG first (snakemake ... --configfile "
                     "config/experiments/multi30k_en_de_cpu.yaml)")  # fmt: skip
        payload = json.loads(path.read_text(encoding="utf-8"))
        tests[test_set] = {"bleu": payload["bleu"]["score"],
                           "bleu_lc_tok": payload["bleu_lc_tok"]["score"]}  # fmt: skip
    summary = json.loads((run_dir / "train_summary.json").read_text(encoding="utf-8"))
    return {"run_dir": str(run_dir), "curve": curve, "tests": tests,
            "train_wall_seconds": summary.get("wall_seconds")}  # fmt: skip


def prepare(args, exp: Experiment, run_dir: Path, sets: list[str]) -> dict[str, Any]:
    """The peer's data: our training ids as pieces, the dev and test sets encoded by our
    SentencePiece model as pieces, binarised with our dictionary (fairseq's valid, test,
    test1, ...)."""
    from bench_peer_training import PieceCodec, fairseq_binarise, write_peer_data

    data_dir = run_dir / "data"
    codec = PieceCodec(REPO / exp.spm)
    bin_dir = run_dir / "fairseq_bin"
    sentences = {}
    for test_set in sets:
        for lang in (exp.src, exp.tgt):
            lines = (REPO / exp.text(test_set, lang)).read_text("utf-8").splitlines()
            lines = lines[: args.sentences or None]
            sentences[test_set] = len(lines)
            data_dir.mkdir(parents=True, exist_ok=True)
            encoded = "".join(codec.encode(line) + "\n" for line in lines)
            (data_dir / f"{test_set}.{lang}").write_text(encoded, encoding="utf-8")
            # the text itself: the references our score stage reads (--sentences: cut alike)
            (data_dir / f"{test_set}.text.{lang}").write_text(
                "".join(line + "\n" for line in lines), encoding="utf-8"
            )
    if not (bin_dir / f"dict.{exp.src}.txt").exists():  # fairseq-preprocess not done yet
        data = write_peer_data(exp, data_dir)
        data.update(dir=data_dir, src=exp.src, tgt=exp.tgt)
        tmp = bin_dir.with_name(bin_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        fairseq_binarise(args, data, tmp, valid=sets[0], tests=tuple(sets[1:]))
        tmp.replace(bin_dir)
    subsets = {sets[0]: "valid", **{s: "test" + (str(i) if i else "") for i, s in
                                    enumerate(sets[1:])}}  # fmt: skip
    refs = {test_set: str(data_dir / f"{test_set}.text.{exp.tgt}") for test_set in sets}
    return {"bin_dir": bin_dir, "codec": codec, "sentences": sentences, "subsets": subsets,
            "src": exp.src, "tgt": exp.tgt, "exp": exp, "refs": refs}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", type=Path, default=REPO / "config" / "experiments" / "multi30k_en_de_cpu.yaml"
    )
    parser.add_argument("--experiment", help="experiment of the config (default: its only one)")
    parser.add_argument("--data-mirror", default=os.environ.get("TRANSFORMER_NMT_MIRROR"))
    parser.add_argument(
        "--minutes",
        type=float,
        default=170.0,
        help="training budget of this invocation (0: score what is there)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on with the run directory (training, then scoring)",
    )
    parser.add_argument(
        "--update-freq",
        type=int,
        default=WU2021["gpus"],
        help="batches of 4,096 tokens per update (2: the published 2 GPUs)",
    )
    parser.add_argument("--max-update", type=int, default=WU2021["max_update"])
    parser.add_argument(
        "--every-updates",
        type=int,
        default=500,
        help="an epoch checkpoint on the curve every N updates",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--ours", type=Path, help="our recipe's finished run directory")
    parser.add_argument(
        "--targets",
        type=float,
        nargs="+",
        default=[30.0, 35.0],
        help="dev BLEU levels for 'minutes to reach' (30 35)",
    )
    parser.add_argument("--name", default="wu2021", help="run name (wu2021)")
    parser.add_argument(
        "--sentences", type=int, help="only the first N dev and test sentences (a quick check)"
    )
    parser.add_argument(
        "--peer-venv", type=Path, default=REPO / "benchmarks" / ".venv-peer-fairseq"
    )
    args = parser.parse_args()
    if not (args.peer_venv / "bin" / "fairseq-train").exists():
        sys.exit(f"{args.peer_venv}: no fairseq there; run benchmarks/peers/install_fairseq.sh")
    from bench_peer_training import peer_version
    from bench_time_to_bleu import minutes_to_bleu, plot, run_for_budget

    os.environ.update(harness.thread_env(args.threads))  # fairseq's processes and our stages alike
    # fairseq 0.12 reads its checkpoints (an argparse.Namespace inside) with torch.load's
    # default, weights_only since torch 2.6: resuming and fairseq-generate fail. The files are
    # this run's own. (Our score stage, the only other process started here, loads no tensors.)
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"

    config_path = args.config.resolve()
    exp = harness.load_experiment(config_path, args.experiment)
    name = exp.name
    sets = ["valid", *exp.settings["test_sets"]]
    run_dir = OUT / "peer_recipe" / args.name
    if run_dir.exists() and not args.resume:
        sys.exit(f"{run_dir} exists: --resume to go on with it, or move it aside")
    work = run_dir / "eval"
    work.mkdir(parents=True, exist_ok=True)
    harness.build_data(exp, sets, args.data_mirror)
    ctx = prepare(args, exp, run_dir, sets)
    ctx["work"] = work

    # --- training, in as many invocations as it takes ----------------------------------------
    state_path = run_dir / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"segments": []}
    save_dir = run_dir / "checkpoints"
    recipe = {k: getattr(args, k) for k in ("update_freq", "max_update", "every_updates", "seed")}
    if state.setdefault("recipe", recipe) != recipe:
        sys.exit(f"{state_path}: this run trains with {state['recipe']}, not {recipe}: give "
                 "the same options, or --name another run")  # fmt: skip
    last = save_dir / "checkpoint_last.pt"
    for seg in state["segments"]:  # an invocation that was killed: up to its last checkpoint
        if "ended" not in seg:
            written = last.stat().st_mtime if last.exists() else seg["started"]
            seg["ended"] = seg["resume_at"] = max(written, seg["started"])
    if not state.get("finished") and args.minutes > 0:
        train_args = fairseq_train_args(args, ctx["bin_dir"], save_dir, ctx["src"], ctx["tgt"])
        state["command"] = ["fairseq-train", *train_args]
        log = run_dir / "train.log"
        print(f"fairseq-train for at most {args.minutes:g} minutes; log {log}", flush=True)
        # invocations may run on different days and hosts: each names its own machine
        segment = {"started": time.time(), "machine": harness.machine()}
        state["segments"].append(segment)
        state_path.write_text(json.dumps(state, indent=2) + "\n")
        cmd = [str(args.peer_venv / "bin" / "fairseq-train"), *train_args]
        # fairseq trains on through a SIGINT (measured): SIGTERM ends it, and the next
        # invocation resumes from checkpoint_last.pt as it would after any kill
        run_for_budget(cmd, log, args.minutes, stop=signal.SIGTERM)
        segment["ended"] = time.time()
        segment["resume_at"] = last.stat().st_mtime if last.exists() else segment["started"]
        # max_update reached, or stopped early by --patience (the log is appended to)
        state["finished"] = bool(DONE.search(log.read_text(encoding="utf-8", errors="replace")))
        state_path.write_text(json.dumps(state, indent=2) + "\n")
    if not state.get("finished"):
        print(f"training not finished: rerun with --resume (it goes on from {save_dir})")

    # --- the curve: every N updates on dev ---------------------------------------------------
    by_update, by_epoch = checkpoints(save_dir)
    # a run made before the curve took epoch checkpoints (e.g. at 027890d) saved mid-epoch
    # ones for it and kept only the last 10 epochs: its curve is those mid-epoch checkpoints
    train_log = run_dir / "train.log"
    log_text = train_log.read_text("utf-8", "replace") if train_log.exists() else ""
    updates_at = epoch_updates(log_text)
    curve = by_update or curve_checkpoints(by_epoch, updates_at, args.every_updates)
    rows = []
    for updates, path in curve:
        minutes = trained_minutes(path.stat().st_mtime, state["segments"])
        scores = translate(args, path, "valid", "valid", ctx, f"u{updates}")
        rows.append({"updates": updates, "minutes": minutes, "valid": scores})
        print(f"fairseq  update {updates:>5}  {minutes:7.2f} min  dev BLEU {scores['bleu']:6.2f}",
              flush=True)  # fmt: skip

    # --- the final model: the last 10 epoch checkpoints averaged, on the test sets -------------
    final = None
    if state.get("finished") and by_epoch:
        window = [p for _, p in by_epoch[-WU2021["average_last_epochs"] :]]
        averaged = run_dir / "averaged.pt"
        if not averaged.exists():
            tmp = averaged.with_suffix(".pt.tmp")
            subprocess.run([str(args.peer_venv / "bin" / "python"), "-c", AVERAGE, str(tmp),
                            *map(str, window)], check=True)  # fmt: skip
            tmp.replace(averaged)
        final = {"epochs": [e for e, _ in by_epoch[-len(window) :]], "scores": {}}
        for test_set in sets:
            final["scores"][test_set] = translate(args, averaged, ctx["subsets"][test_set],
                                                  test_set, ctx, "avg")  # fmt: skip

    ours = ours_side(args.ours.resolve(), exp.settings["test_sets"]) if args.ours else None
    curves = {"fairseq (Wu et al. 2021)": [(r["minutes"], r["valid"]["bleu"]) for r in rows]}
    if ours:
        curves["ours (CPU recipe)"] = [(m, b) for m, b, _ in ours["curve"]]
    reached = {side: {str(t): minutes_to_bleu(points, t) for t in args.targets}
               for side, points in curves.items()}  # fmt: skip
    for side, by_target in reached.items():
        cells = ", ".join(f"{t}: {'not reached' if m is None else f'{m:.1f} min'}"
                          for t, m in by_target.items())  # fmt: skip
        print(f"{side}: minutes to dev BLEU {cells}")
    ratios = minutes_ratios(*reached.values()) if ours else {}
    for target, ratio in ratios.items():
        print(f"ours / fairseq, minutes to dev BLEU {target}: {ratio:.2f} (goal: <= 0.5)")
    if final:
        for test_set, s in final["scores"].items():
            epochs = f"{final['epochs'][0]}-{final['epochs'][-1]}"
            line = (f"fairseq final (epochs {epochs} averaged) {test_set}: sacreBLEU "
                    f"{s['bleu']:.2f}, lowercased tokenized {s['bleu_lc_tok']:.2f}")  # fmt: skip
            if ours and test_set in ours["tests"]:
                o = ours["tests"][test_set]
                line += f"; ours {o['bleu']:.2f} / {o['bleu_lc_tok']:.2f}"
            print(line)

    result = {
        "benchmark": "peer_recipe",
        "peer": peer_version(args.peer_venv, "fairseq-fixed"),
        "recipe": {**WU2021, "update_freq": args.update_freq, "max_update": args.max_update},
        "config": str(config_path), "experiment": name, "threads": args.threads,
        "machine": harness.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "state": state, "rows": rows, "final": final, "ours": ours,
        "minutes_to_dev_bleu": reached, "ours_over_peer_minutes": ratios,
    }  # fmt: skip
    out = OUT / f"peer_recipe_{args.name}.json"
    harness.write_result(out, result)
    figure = out.with_suffix(".png")
    plot(curves, args.targets[0], "valid", figure, "Multi30k dev BLEU against training minutes")
    print(f"wrote {out} and {figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
