"""``make bench``: the quick set of the project's headline comparisons, rerun on this machine
and written as records; its own wall time is record ``make_bench_<machine>``:

1. **The demo**: ``config/config.yaml``'s whole DAG in a fresh working directory (the data from
   ``--mirror``): minutes, training seconds and target tokens/s, peak RSS, sacreBLEU, chrF and
   lowercased tokenized BLEU per test set. Record ``demo_<machine>``.
2. **Decoding against CTranslate2 at its best**: ``bench_ct2_decoding.py --ct2-best`` on that
   demo model, the first 1,000 sentences of its first test set, float32 and int8, 1 and 2
   threads. Record ``ct2_best_<machine>``.
3. **Training against eole**: ``bench_peer_training.py`` in fp32 and bf16 (the peer's own
   virtual environment, ``benchmarks/peers/install_eole.sh``; skipped with that advice when it
   is missing). Record ``peer_training_<machine>``.
4. **Training against fairseq**: the same in fp32 (fairseq has no CPU autocast), its virtual
   environment from ``benchmarks/peers/install_fairseq.sh``; our fp32 runs are item 3's
   (``--ours-from``) when item 3 ran. Record
   ``peer_training_fairseq_<machine>``.

When every part ran, the set's wall time (in all and per part) is record ``make_bench_<machine>``.
``<machine>`` names the CPU class the figures belong to (``machine_key``): ``xeon_amx``,
``epyc``, ... A record already there keeps its ``claims`` (the sentences of config/ that cite
it) and gets the new values, command, commit, date and machine. Then the tables of README.md
and docs/ are rendered again from the records (``render_tables.py``), and every record's claims
are checked against config/, as ``tests/test_records.py`` does: the ones that no longer match
are listed, and the exit status is 1, until config/ says the new figures (a new record that no
table or claim cites is listed too, with where to cite it).

The long comparisons are not rerun here; ``--list`` prints them with their commands and
durations on 2 cores (``LONG``).

    make bench ARGS="--mirror ../shared/data"      # or:
    python benchmarks/bench_quick.py [--mirror ../shared/data] [--only demo ct2 peer fairseq]
                                     [--list]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import yaml
from harness import REPO, machine, machine_key, python_env, run_dag
from record_claims import load_records, stale_claims
from render_tables import load_tables
from render_tables import main as render_tables

BENCH = REPO / "benchmarks"
PARTS = ("demo", "ct2", "peer", "fairseq")
# part -> (peer toolkit, its program in the venv, precisions compared, record name prefix)
PEER_PARTS = {
    "peer": ("eole", "eole", ("fp32", "bf16"), "peer_training"),
    "fairseq": ("fairseq", "fairseq-train", ("fp32",), "peer_training_fairseq"),
}

# Updates per training run against a peer: the first 25-update window is left out (warm-up), the
# median of the two after it is the run's speed; 2 runs a side (100 updates made the set ~34 min).
PEER_STEPS = 75

LONG = [
    ("the CPU recipe, whole DAG", "~60 min",
     "snakemake --cores all --configfile config/experiments/multi30k_en_de_cpu.yaml "
     "--config data_mirror=MIRROR"),
    ("time to dev BLEU against eole", "~21 min",
     "python benchmarks/bench_time_to_bleu.py --config config/config.yaml --minutes 12 "
     "--max-steps 1200 --every-steps 100 --score-every-steps 200 --sets valid "
     "--data-mirror MIRROR --peer eole --concurrent --threads 1 --name peer_demo"),
    ("the CPU fast paths, one at a time", "~40 min",
     "python benchmarks/bench_fast_paths.py --only train --rounds 3 --steps 5; "
     "python benchmarks/bench_fast_paths.py --only decode --rounds 4"),
    ("Wu et al. 2021's Multi30k recipe on fairseq beside the CPU recipe",
     "~2 h of fairseq training (100 min to its --patience stop; 3 h at most), resumable",
     "python benchmarks/bench_peer_recipe.py --data-mirror MIRROR --minutes 170 "
     "[--resume] --ours results/runs/multi30k_en_de_cpu"),
    ("the demo from a local dataset against the registry's", "~18 min",
     "python benchmarks/bench_local_dataset.py --mirror MIRROR"),
    ("a lever of the CPU recipe against it on dev, 3 seeds each (the variant's keys are"
     " an example; one H200 trains the 6 runs side by side in ~9 min: gpu_proof.sh step 8)",
     "~6 h of training",
     "python benchmarks/lever_screen.py config --recipe config/experiments/multi30k_en_de_cpu.yaml "
     "--variant postln model_overrides.norm_first=false --data-mirror MIRROR --out screen.yaml; "
     "snakemake --cores all --keep-going --configfile screen.yaml $(cat screen.yaml.targets); "
     "python benchmarks/lever_screen.py summary --config screen.yaml"),
    ("Table 3 at CPU scale", "~3 h of training",
     "snakemake --cores all --configfile config/experiments/table3_cpu.yaml "
     "--config data_mirror=MIRROR"),
]  # fmt: skip


def run_demo(mirror: Path | None, workdir: Path) -> dict[str, Any]:
    """The demo's whole DAG in ``workdir`` (downloads from ``mirror`` when given): its
    figures and where its model is."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    ((name, exp),) = config["experiments"].items()
    print(f"[demo] the whole DAG of config/config.yaml in {workdir}", flush=True)
    dag_seconds = run_dag(config, workdir, mirror) * 60
    # The largest resident set of any process the DAG ran (Linux: kilobytes).
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 1e9
    run_dir = workdir / "results" / "runs" / name
    summary = json.loads((run_dir / "train_summary.json").read_text(encoding="utf-8"))
    values = {
        "dag_seconds": round(dag_seconds, 1),
        "train_seconds": round(summary["wall_seconds"], 1),
        "tgt_tokens_per_s": round(summary["metrics"]["train/tgt_tokens_per_s_mean"]),
        "peak_gb": round(peak_gb, 2),
    }
    for test_set in exp["test_sets"]:
        scores = json.loads((run_dir / f"{test_set}.scores.json").read_text(encoding="utf-8"))
        short = re.search(r"\d{4}", test_set)
        tag = short.group(0) if short else test_set
        values[f"bleu_{tag}"] = round(scores["bleu"]["score"], 4)
        values[f"chrf_{tag}"] = round(scores["chrf"]["score"], 2)
        values[f"lc_tok_{tag}"] = round(scores["bleu_lc_tok"]["score"], 2)
    print(f"[demo] {values}", flush=True)
    data = workdir / "results" / "data" / exp["dataset"] / exp["pair"]
    src = exp["pair"].split("-")[0]
    return {
        "values": values,
        "derived": {
            "dag_minutes": ["dag_seconds", "/", 60],
            "train_minutes": ["train_seconds", "/", 60],
        },  # fmt: skip
        "what": "the demo's whole DAG (config/config.yaml) in a fresh working directory, "
        "data from the mirror, the project's venv already installed",
        "command": "python benchmarks/bench_quick.py --mirror MIRROR --only demo "
        "(snakemake --cores all --config data_mirror=MIRROR)",
        "runs": 1,
        "spread": "one run (seeded: the same batches on every machine); other CPU families "
        "move BLEU by a few tenths, and a loaded machine the minutes",
        "model": {
            "model": run_dir / "averaged.pt",
            "spm": workdir / "results" / "spm" / exp["dataset"] / exp["pair"] / "spm.model",
            "source": data / f"{exp['test_sets'][0]}.{src}",
        },
    }


def run_ct2(model: dict[str, Path], out_dir: Path) -> dict[str, Any]:
    values, settings = {}, {}
    for quantize, cls in (("none", "float"), ("int8", "int8")):
        out = out_dir / f"ct2_{quantize}.json"
        cmd = [sys.executable, str(BENCH / "bench_ct2_decoding.py"), "--model", str(model["model"]),
               "--spm-model", str(model["spm"]), "--source", str(model["source"]),
               "--sentences", "1000", "--runs", "3", "--threads", "1", "2",
               "--quantize", quantize, "--ct2-best", "--out", str(out)]  # fmt: skip
        print(f"[ct2] {quantize}", flush=True)
        subprocess.run(cmd, check=True, env=python_env())
        for best in json.loads(out.read_text(encoding="utf-8"))["best"]:
            key = f"{cls}_{best['threads']}t"
            values[f"ours_{key}"] = round(best["torch_sentences_per_s"], 1)
            values[f"ct2best_{key}"] = round(best["ct2_sentences_per_s"], 1)
            s = best["ct2_setting"]
            settings[key] = (f"{s['ct2_compute_type']}, {s['ct2_inter_threads']} worker(s) x "
                             f"{s['ct2_intra_threads']} thread(s)")  # fmt: skip
    return {
        "values": values,
        "derived": {k: [f"ours_{k}", "/", f"ct2best_{k}"] for k in settings},
        "ct2_fastest_setting": settings,
        "what": "beam-4 decoding of the first 1,000 sentences of the demo's first test set with "
        "the demo model, sentences/s: ours against CTranslate2 at its fastest supported compute "
        "type and thread split within the same thread budget, median of 3 runs each",
        "command": "python benchmarks/bench_ct2_decoding.py --model .../averaged.pt --spm-model "
        ".../spm.model --source .../test_2016_flickr.en --sentences 1000 --runs 3 --threads 1 2 "
        "--quantize none|int8 --ct2-best",
        "runs": 3,
        "spread": "medians of 3 timed runs per setting after a warm-up",
    }


def run_peer(part: str, out_dir: Path, mirror: Path | None) -> dict[str, Any] | None:
    name, program, precisions, _ = PEER_PARTS[part]
    venv = BENCH / f".venv-peer-{name}"
    if not (venv / "bin" / program).exists():
        print(f"[{part}] skipped: no {name} in {venv}; run benchmarks/peers/install_{name}.sh")
        return None
    values, shared = {}, ""
    for precision in precisions:
        out = out_dir / f"{part}_{precision}.json"
        cmd = [sys.executable, str(BENCH / "bench_peer_training.py"), "--peer", name,
               "--steps", str(PEER_STEPS), "--runs", "2", "--log-every", "25",
               "--precision", precision, "--out", str(out)]  # fmt: skip
        if mirror is not None:
            cmd += ["--data-mirror", str(mirror)]
        # Ours is trained once per precision: the other peer's part reuses those runs.
        ours_from = None  # this precision's: a part may share one precision and not another
        for other in PEER_PARTS:
            earlier = out_dir / f"{other}_{precision}.json"
            if other != part and earlier.exists():
                ours_from = earlier
                cmd += ["--ours-from", str(ours_from)]
                shared = f"runs of the {PEER_PARTS[other][0]} comparison in the same make bench"
                break
        print(f"[{part}] {precision}" + (f", ours from {ours_from.name}" if ours_from else ""),
              flush=True)  # fmt: skip
        subprocess.run(cmd, check=True, env=python_env())
        result = json.loads(out.read_text(encoding="utf-8"))
        values[f"ours_{precision}"] = round(result["median"]["ours"]["tgt_tokens_per_s"])
        values[f"{name}_{precision}"] = round(result["median"]["peer"]["tgt_tokens_per_s"])
        values[f"ours_loss_{precision}"] = round(result["median"]["ours"]["final_loss"], 3)
        values[f"{name}_loss_{precision}"] = round(result["median"]["peer"]["final_loss"], 3)
        peer = result["peer"]
    return {
        "values": values,
        "derived": {f"ratio_{p}": [f"ours_{p}", "/", f"{name}_{p}"] for p in precisions},
        "what": f"training the tiny shape (d_model 256, pre-LN) on the demo's data, target "
        f"tokens/s, ours against {peer} on the same model, data, batch and threads; loss after "
        f"{PEER_STEPS} updates" + (f"; ours are the {shared}" if shared else ""),
        "command": f"python benchmarks/bench_peer_training.py --peer {name} --steps {PEER_STEPS} "
        f"--runs 2 --log-every 25 --precision {'|'.join(precisions)} --data-mirror MIRROR"
        + (" --ours-from <that part's output>" if shared else ""),
        "runs": 2,
        "spread": "medians of 2 runs per side, alternating order"
        + (" (ours' runs alternated with the other peer's)" if shared else ""),
    }


def duration_record(seconds: dict[str, float]) -> dict[str, Any]:
    """How long the whole quick set took, in all and per part (seconds from the parts' ends)."""
    values = {f"{part}_seconds": round(s, 1) for part, s in seconds.items()}
    values["total_seconds"] = round(sum(seconds.values()), 1)
    return {
        "values": values,
        "derived": {"total_minutes": ["total_seconds", "/", 60]},
        "what": "the wall time of the whole quick set (every part), the venvs already installed",
        "command": 'make bench ARGS="--mirror MIRROR" (python benchmarks/bench_quick.py)',
        "runs": 1,
        "spread": "one run; the demo's share moves with the host's speed (up to ~25 % between "
        "days on one VM class)",
    }


def write_record(name: str, result: dict[str, Any], info: dict[str, Any]) -> None:
    """``result`` as record ``name`` (``harness.write_record``: its claims kept)."""
    path = harness.write_record(name, result, info, "make bench (benchmarks/bench_quick.py)")
    print(f"wrote {path}", flush=True)


def report_claims(written: list[str]) -> int:
    """Print the claims the documents no longer state; 1 if any (or an uncited new record)."""
    status = 0
    in_tables = {row["record"] for table in load_tables().values() for row in table["rows"]}
    for name, record in load_records().items():
        if not record["claims"] and name not in in_tables and name in written:
            print(f"{name}: cited nowhere yet: give it a row in benchmarks/tables.yaml (then "
                  f"python benchmarks/render_tables.py), or delete it")  # fmt: skip
            status = 1
        for line in stale_claims(name, record):
            print(f"{name}: stale: {line}")
            status = 1
    if status == 0:
        print("every record's claims match config/")
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mirror", type=Path, default=os.environ.get("TRANSFORMER_NMT_MIRROR") or None,
        help="the data mirror (<mirror>/multi30k/...; default $TRANSFORMER_NMT_MIRROR, else "
        "the datasets' URLs)",
    )  # fmt: skip
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--list", action="store_true", help="print the long comparisons")
    args = parser.parse_args()
    if args.list:
        for what, duration, command in LONG:
            print(f"{what} ({duration} on 2 cores):\n  {command}")
        return 0
    if ("ct2" in args.only) and "demo" not in args.only:
        parser.error("--only ct2 decodes the demo's model: give demo too")
    info = machine()
    key = machine_key(info)
    print(f"machine: {info['cpu']} ({' '.join(info['flags'])}), {info['cores']} cores -> "
          f"records *_{key}; commit {info['commit']}", flush=True)  # fmt: skip
    written, seconds = [], {}
    mirror = args.mirror.resolve() if args.mirror else None
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_quick_") as tmp:
        root = Path(tmp)
        if "demo" in args.only:
            demo = run_demo(mirror, root / "demo")
            write_record(f"demo_{key}", demo, info)
            written.append(f"demo_{key}")
            seconds["demo"] = time.perf_counter() - started
            if "ct2" in args.only:
                write_record(f"ct2_best_{key}", run_ct2(demo["model"], root), info)
                written.append(f"ct2_best_{key}")
                seconds["ct2"] = time.perf_counter() - started - sum(seconds.values())
        for part in PEER_PARTS:
            peer = run_peer(part, root, mirror) if part in args.only else None
            if peer is not None:
                record = f"{PEER_PARTS[part][3]}_{key}"
                write_record(record, peer, info)
                written.append(record)
                seconds[part] = time.perf_counter() - started - sum(seconds.values())
    if set(seconds) == set(PARTS):  # the whole set ran: how long "make bench" takes here
        write_record(f"make_bench_{key}", duration_record(seconds), info)
        written.append(f"make_bench_{key}")
    render_tables([])
    return report_claims(written)


if __name__ == "__main__":
    raise SystemExit(main())
