"""The CPU fast paths (``transformer_nmt.fast_paths``), each switched off in turn: what each
one is worth in the stages' own code, on this machine, measured in one interleaved run.

Variants: all on (the default), all off, and "all but X" for each fast path X. Workloads, each
a subprocess of the project's timing scripts with ``TRANSFORMER_NMT_CPU_FAST_PATHS`` set:

- training ``tiny`` in fp32 (what ``precision: auto`` picks on every CPU measured so far) and in
  bf16 autocast (``bench_training.py --presets tiny --cpu-bf16``): target tokens/s;
- beam-4 and greedy decoding with the key/value cache (``bench_decoding.py --presets tiny
  --cache-only``): sentences/s.

The variants run in rounds (every variant once per round, in a rotated order), so that drift in
the machine's load falls on all of them alike; the table gives each variant's median over the
rounds, its range, and the median of its per-round ratios to "all on" (below 1: the fast path
that variant leaves out was worth that much). Usage::

    python benchmarks/bench_fast_paths.py [--rounds 3] [--steps 8] [--only train|decode]

Writes ``benchmarks/out/fast_paths.json`` with the commit, the CPU model and flags.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO / "src")]
from harness import machine  # noqa: E402

from transformer_nmt.fast_paths import ENV, FAST_PATHS  # noqa: E402

OUT = HERE / "out" / "fast_paths.json"


def variants() -> dict[str, str]:
    """Variant name -> the switch's value."""
    chosen = {"all on": "on", "all off": "off"}
    for name in FAST_PATHS:
        chosen[f"all but {name}"] = ",".join(other for other in FAST_PATHS if other != name)
    return chosen


def workloads(steps: int) -> dict[str, tuple[list[str], str, dict[str, str]]]:
    """Workload -> (script and arguments, metric, the row's fields that pick it)."""
    train = ["bench_training.py", "--presets", "tiny", "--cpu-bf16", "--steps", str(steps)]
    decode = ["bench_decoding.py", "--presets", "tiny", "--cache-only", "--repeats", "2"]
    return {
        "train tiny fp32": (train, "tgt_tokens_per_s", {"precision": "fp32"}),
        "train tiny bf16": (train, "tgt_tokens_per_s", {"precision": "bf16"}),
        "decode tiny beam4": (decode, "sentences_per_s", {"search": "beam4"}),
        "decode tiny greedy": (decode, "sentences_per_s", {"search": "greedy"}),
    }


def run_script(command: list[str], switch: str) -> list[dict]:
    env = {**os.environ, ENV: switch, "PYTHONPATH": str(REPO / "src")}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        subprocess.run(
            [sys.executable, str(HERE / command[0]), *command[1:], "--out", str(out)],
            env=env, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        payload = json.loads(out.read_text())
    return payload.get("rows") or payload.get("results") or []


def pick(rows: list[dict], fields: dict[str, str]) -> dict:
    found = [r for r in rows if all(str(r.get(k, "")).startswith(v) for k, v in fields.items())]
    if len(found) != 1:
        raise SystemExit(f"expected one row with {fields}, found {len(found)}")
    return found[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="measured training steps per run")
    parser.add_argument(
        "--only", choices=("train", "decode"), default=None, help="one kind of workload"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    chosen, loads = variants(), workloads(args.steps)
    if args.only:
        loads = {name: load for name, load in loads.items() if name.startswith(args.only)}
    scripts = {tuple(command) for command, _, _ in loads.values()}
    values: dict[str, dict[str, list[float]]] = {w: {v: [] for v in chosen} for w in loads}
    started = time.time()
    names = list(chosen)
    for round_index in range(args.rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for variant in order:
            for script in sorted(scripts):
                rows = run_script(list(script), chosen[variant])
                for workload, (command, metric, fields) in loads.items():
                    if tuple(command) == script:
                        values[workload][variant].append(pick(rows, fields)[metric])
            print(f"round {round_index + 1}/{args.rounds}: {variant} done", flush=True)

    table = []
    for workload, by_variant in values.items():
        base = by_variant["all on"]
        for variant, runs in by_variant.items():
            ratios = [v / b for v, b in zip(runs, base, strict=True)]
            table.append({
                "workload": workload, "variant": variant, "switch": chosen[variant],
                "runs": runs, "median": statistics.median(runs), "min": min(runs),
                "max": max(runs), "ratio_to_all_on": statistics.median(ratios),
                "ratio_min": min(ratios), "ratio_max": max(ratios),
            })  # fmt: skip
    header = f"{'workload':<19} {'variant':<30} {'median':>9} {'range':>19} {'x all on':>9}"
    print(header)
    print("-" * len(header))
    for row in table:
        spread = f"{row['min']:.1f}-{row['max']:.1f}"
        ratio = f"{row['ratio_to_all_on']:.3f}"
        print(f"{row['workload']:<19} {row['variant']:<30} {row['median']:>9.1f} {spread:>19} "
              f"{ratio:>9}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine(),
        "rounds": args.rounds,
        "only": args.only,
        "steps": args.steps,
        "wall_s": time.time() - started,
        "rows": table,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
