"""Time to BLEU: train one experiment of a config for a wall-clock budget, then score every
checkpoint (and the average of the last K, §6.1) on the dev set and a test set.

The pipeline's own stages do the work, each as ``python -m transformer_nmt <stage>`` in a
subprocess: Snakemake builds the data (download → prepare → spm → encode) of the config, then
``train`` runs with the experiment's model and train settings except that ``max_steps`` is
raised (``--max-steps``, default: unbounded) and checkpoints are written every ``--every-steps``
optimizer steps or every ``--every-minutes`` minutes and all kept. When the budget is spent the
training process is interrupted (SIGINT, Lightning's graceful shutdown), so the last checkpoint
is the last interval reached within the budget. Every checkpoint is translated with the
experiment's beam settings (§6.1: beam 4, alpha 0.6) by ``translate`` and scored by ``score``
(sacreBLEU); ``average`` builds the last-K average (K = the experiment's ``average_last_k`` or
``--average-last``) at the end, or at every checkpoint with ``--average-each``.

Minutes are measured from the start of the train process (so they include its start-up: imports
and loading the token arrays) to the checkpoint file's modification time. Runs go to
``benchmarks/out/time_to_bleu/<experiment>/`` (deleted first unless ``--resume``); the table is
printed and the JSON written to ``benchmarks/out/time_to_bleu_<experiment>.json``.

Usage (in the repository root, where Snakemake's ``results/`` lives):

    python benchmarks/bench_time_to_bleu.py --config config/config.yaml --minutes 12 \\
        --every-minutes 2 [--experiment multi30k_en_de_tiny] [--data-mirror ../shared/data] \\
        [--set train.lr_scale=0.5 --set model.p_drop=0.2] [--sets valid test_2016_flickr]

``--score-every-steps S`` scores only the checkpoints at multiples of S (and the last one).
``--set train.KEY=VALUE`` / ``--set model.KEY=VALUE`` override the experiment's train settings
or model overrides (values parsed as YAML); ``--max-steps`` bounds the run by steps as well.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
UNBOUNDED_STEPS = 10_000_000


# --- the pipeline's file layout (workflow/lib/pipeline.py's path templates) -------------------

sys.path[:0] = [str(REPO / "src"), str(REPO / "workflow" / "lib")]
import pipeline as layout  # noqa: E402  (the Snakefile's own path templates)


def data_paths(exp: dict[str, Any]) -> dict[str, Any]:
    """Paths of an experiment's data files, relative to the repository root."""
    where = {"dataset": exp["dataset"], "pair": exp["pair"]}
    src, tgt = exp["pair"].split("-")
    return {
        "src": src,
        "tgt": tgt,
        "spm": layout.SPM_MODEL.format(**where),
        "bin_dir": layout.BIN_DIR.format(**where),
        "clean_report": layout.CLEAN_REPORT.format(**where),
        "bins": [
            template.format(**where, split=split, lang=lang)
            for split in ("train", "valid")
            for lang in (src, tgt)
            for template in (layout.TOKENS, layout.OFFSETS)
        ],
        "text": lambda split, lang: layout.TEXT_FILE.format(**where, split=split, lang=lang),
    }


def load_experiment(config_path: Path, name: str | None) -> tuple[str, dict[str, Any]]:
    with open(config_path, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    experiments = config.get("experiments") or {}
    if name is None:
        if len(experiments) != 1:
            sys.exit(f"{config_path} has {len(experiments)} experiments: name one (--experiment)")
        name = next(iter(experiments))
    if name not in experiments:
        sys.exit(f"no experiment {name!r} in {config_path}; it has {sorted(experiments)}")
    return name, experiments[name]


def apply_sets(exp: dict[str, Any], sets: list[str]) -> dict[str, Any]:
    """``train.KEY=VALUE`` / ``model.KEY=VALUE`` overrides (YAML values)."""
    exp = json.loads(json.dumps(exp))
    for item in sets:
        key, sep, value = item.partition("=")
        section, _, field = key.partition(".")
        if not sep or section not in ("train", "model") or not field:
            sys.exit(f"--set {item!r}: expected train.KEY=VALUE or model.KEY=VALUE")
        target = exp["train"] if section == "train" else exp.setdefault("model_overrides", {})
        target[field] = yaml.safe_load(value)
    return exp


# --- stages -----------------------------------------------------------------------------------


def stage(*args: str, log: Path | None = None) -> None:
    """Run ``python -m transformer_nmt <args>``; exit with its log's tail on failure."""
    cmd = [sys.executable, "-m", "transformer_nmt", *args]
    with open(log or os.devnull, "w", encoding="utf-8") as handle:
        proc = subprocess.run(cmd, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8")[-3000:] if log else ""
        sys.exit(f"stage {args[0]} failed ({proc.returncode}):\n{tail}")


def build_data(config_path: Path, paths: dict[str, Any], sets: list[str], mirror: str | None):
    targets = [paths["spm"], paths["clean_report"], *paths["bins"]]
    targets += [paths["text"](s, lang) for s in sets for lang in (paths["src"], paths["tgt"])]
    # Options taking lists first: "--cores N" ends them before the targets.
    cmd = [sys.executable, "-m", "snakemake", "--configfile", str(config_path)]
    if mirror:
        cmd += ["--config", f"data_mirror={mirror}"]
    cmd += ["--quiet", "rules", "--cores", str(os.cpu_count() or 1), *targets]
    subprocess.run(cmd, cwd=REPO, check=True)


def train(exp: dict[str, Any], paths: dict[str, Any], run_dir: Path, args) -> dict[str, Any]:
    """Train until the budget is spent; return {step: minutes since the train process began}."""
    settings = dict(exp["train"])
    settings["max_steps"] = args.max_steps or UNBOUNDED_STEPS
    settings["keep_checkpoints"] = 100_000
    if args.every_steps:
        settings["checkpoint_every_steps"] = args.every_steps
    else:
        settings["checkpoint_every_steps"] = None
        settings["checkpoint_every_minutes"] = args.every_minutes
    model = {"preset": exp["preset"], "overrides": exp.get("model_overrides") or {}}
    cmd = [
        sys.executable, "-m", "transformer_nmt", "train", "--bin-dir", paths["bin_dir"],
        "--spm-model", paths["spm"], "--src", paths["src"], "--tgt", paths["tgt"],
        "--run-dir", str(run_dir), "--model", json.dumps(model), "--train", json.dumps(settings),
        "--clean-report", paths["clean_report"],
    ]  # fmt: skip
    log = run_dir / "train.log"
    started = time.time()
    with open(log, "a", encoding="utf-8") as handle:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=args.minutes * 60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # Lightning: graceful shutdown
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        else:
            if proc.returncode != 0:
                sys.exit(f"train failed ({proc.returncode}); see {log}")
    wall = time.time() - started
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


def score_model(model: Path, exp, paths, sets: list[str], work: Path, tag: str) -> dict:
    """BLEU of ``model`` on each set (translate + score stages); {set: {bleu, chrf, seconds}}."""
    tr = exp["translate"]
    scores = {}
    for test_set in sets:
        hyp, out = work / f"{tag}.{test_set}.hyp", work / f"{tag}.{test_set}.scores.json"
        started = time.time()
        stage(
            "translate", "--model", str(model), "--spm-model", paths["spm"],
            "--input", paths["text"](test_set, paths["src"]), "--output", str(hyp),
            "--beam", str(tr["beam"]), "--alpha", str(tr["alpha"]),
            "--max-len-b", str(tr["max_len_b"]), "--max-tokens", str(tr["max_tokens"]),
            "--device", "cpu" if exp["train"].get("accelerator") == "cpu" else "auto",
            log=work / f"{tag}.{test_set}.translate.log",
        )  # fmt: skip
        seconds = time.time() - started
        stage(
            "score", "--hyp", str(hyp), "--ref", paths["text"](test_set, paths["tgt"]),
            "--tgt-lang", paths["tgt"], "--out", str(out),
            log=work / f"{tag}.{test_set}.score.log",
        )  # fmt: skip
        payload = json.loads(out.read_text())
        scores[test_set] = {
            "bleu": payload["bleu"]["score"],
            "chrf": payload["chrf"]["score"],
            "translate_seconds": seconds,
        }
    return scores


def average(inputs: list[str], out: Path, work: Path) -> None:
    stage("average", "--inputs", *inputs, "--out", str(out), log=work / f"{out.stem}.log")


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
    args = parser.parse_args()

    config_path = args.config.resolve()
    name, exp = load_experiment(config_path, args.experiment)
    exp = apply_sets(exp, args.sets_)
    run_name = args.name or name
    paths = data_paths(exp)
    run_dir = OUT / "time_to_bleu" / run_name
    if run_dir.exists() and not args.resume:
        shutil.rmtree(run_dir)
    work = run_dir / "eval"
    work.mkdir(parents=True, exist_ok=True)
    k = args.average_last or int(exp.get("average_last_k", 1))

    build_data(config_path, paths, args.sets, args.data_mirror)
    load_before = os.getloadavg()
    trained = train(exp, paths, run_dir, args)
    load_after = os.getloadavg()

    rows = []
    checkpoints = trained["checkpoints"]
    for i, ckpt in enumerate(checkpoints):
        every = args.score_every_steps
        if not every or ckpt["step"] % every == 0 or i == len(checkpoints) - 1:
            row = {"model": f"step {ckpt['step']}", **ckpt}
            row["scores"] = score_model(Path(ckpt["path"]), exp, paths, args.sets, work, f"s{i}")
            rows.append(row)
        if i + 1 >= k and k > 1 and (args.average_each or i == len(checkpoints) - 1):
            window = checkpoints[i + 1 - k : i + 1]
            model = work / f"avg{k}_step{ckpt['step']}.pt"
            average([c["path"] for c in window], model, work)
            avg = {"model": f"avg last {k} @ {ckpt['step']}", **ckpt, "path": str(model)}
            avg["averaged_steps"] = [c["step"] for c in window]
            avg["scores"] = score_model(model, exp, paths, args.sets, work, f"a{i}")
            rows.append(avg)

    header = f"{'model':<22} {'step':>7} {'minutes':>8}" + "".join(f" {s:>18}" for s in args.sets)
    print(f"\n{run_name}: BLEU (chrF) against training minutes")
    print(header)
    for row in rows:
        cells = "".join(
            f" {row['scores'][s]['bleu']:>10.2f} ({row['scores'][s]['chrf']:5.1f})"
            for s in args.sets
        )
        print(f"{row['model']:<22} {row['step']:>7} {row['minutes']:>8.2f}{cells}")

    result = {
        "config": str(config_path),
        "experiment": name,
        "run": run_name,
        "settings": exp,
        "minutes_budget": args.minutes,
        "every_minutes": None if args.every_steps else args.every_minutes,
        "every_steps": args.every_steps,
        "average_last_k": k,
        "train_wall_seconds": trained["wall_seconds"],
        "train_summary": trained["summary"],
        "loadavg_before": load_before,
        "loadavg_after_train": load_after,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "rows": rows,
    }
    out = args.out or OUT / f"time_to_bleu_{run_name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
