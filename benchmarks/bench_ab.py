"""A/B comparison of two source trees with one benchmark script, interleaved.

On a shared machine absolute timings drift with the load from other processes, so a change is
measured as the ratio B/A of each metric (``--metric``, one or more) between two checkouts of
``src/`` run alternately (A, B, A, B, ...) ``--repeats`` times; the table shows each side's
median and the median of the per-pair ratios.

Usage, e.g. the checkout before a change in /tmp/base (``git archive <commit> src | tar -x -C
/tmp/base``)::

    python benchmarks/bench_ab.py --a /tmp/base/src --b src --repeats 5 \\
        --metric tgt_tokens_per_s --key preset -- benchmarks/bench_training.py --presets tiny

Every run's JSON (the script's ``--out``) goes to a temporary file; rows are matched between
A and B by the ``--key`` fields. ``--b-args`` appends arguments to B's command only, to
compare a flag within one source tree (``--a src --b src --b-args="--compile"``; write it
with ``=``: argparse takes a lone ``--flag`` value for an option).
Writes ``benchmarks/out/ab.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out" / "ab.json"


def run_once(src: str, command: list[str], out: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    subprocess.run([sys.executable, *command, "--out", str(out)], env=env, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    payload = json.loads(out.read_text())
    return payload.get("rows") or payload.get("results") or []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="source tree A (the 'before'), a src/ path")
    parser.add_argument("--b", required=True, help="source tree B (the 'after')")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--metric", nargs="+", required=True,
                        help="row fields compared (each its own table)")  # fmt: skip
    parser.add_argument("--key", nargs="+", required=True, help="row fields that name a row")
    parser.add_argument("--b-args", default="", help="extra arguments for B's runs only")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- script [args]")
    args = parser.parse_args()
    command = [c for c in args.command if c != "--"]
    # values[side][(metric, *row key)]: that metric of that row, one per repeat
    values: dict[str, dict[tuple, list[float]]] = {"a": {}, "b": {}}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for side in ("a", "b"):
                extra = args.b_args.split() if side == "b" else []
                rows = run_once(getattr(args, side), command + extra, Path(tmp) / f"{side}.json")
                for row in rows:
                    for metric in args.metric:
                        key = (metric, *(row[k] for k in args.key))
                        values[side].setdefault(key, []).append(float(row[metric]))
            load.append(os.getloadavg()[0])
    table = []
    print(f"{'row':<28} {'A median':>10} {'B median':>10} {'B/A (median of pairs)':>22}")
    for key, a_values in values["a"].items():
        b_values = values["b"][key]
        ratios = [b / a for a, b in zip(a_values, b_values, strict=True)]
        row = {
            "metric": key[0],
            "key": dict(zip(args.key, key[1:], strict=True)),
            "a": a_values,
            "b": b_values,
            "a_median": statistics.median(a_values),
            "b_median": statistics.median(b_values),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
        table.append(row)
        name = "/".join(str(k) for k in key[1:]) + f" {key[0]}"
        print(
            f"{name:<28} {row['a_median']:>10.2f} {row['b_median']:>10.2f} "
            f"{row['ratio_median']:>10.3f} [{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]"
        )
    print(f"1-min load average during the runs: {min(load):.1f} to {max(load):.1f}")
    meta = {"a": args.a, "b": args.b, "b_args": args.b_args, "command": command,
            "metric": args.metric,
            "repeats": args.repeats, "load_average_1min": load}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": table}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
