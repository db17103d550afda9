"""The demo two ways: Multi30k from the registry, and the same files declared as a user's own
corpus (config ``datasets:``, ``data/local.py``). The check that a local dataset is read
exactly as a registry one: the whole DAG of ``config/config.yaml`` runs once per way, each in its
own working directory, and every test set's scores and hypotheses must agree to the last digit.

    python benchmarks/bench_local_dataset.py --mirror ../shared/data

Prints a table (BLEU, chrF, tokenized BLEU per way and test set, minutes per DAG) and writes
``benchmarks/out/local_dataset.json`` with the machine, the commit and the command. Takes two
demo runs (~8 minutes each on 2 cores).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from harness import REPO, machine, run_dag, write_result

LOCAL_NAME = "multi30k_local"


def local_config(config: dict[str, Any], mirror: Path) -> dict[str, Any]:
    """``config`` with its Multi30k experiments moved onto the mirror's files as a local
    dataset: the same files, declared by path (prefixes of ``<split>.<lang>.gz``)."""
    files = mirror / "multi30k"
    out = copy.deepcopy(config)
    pairs = {e["pair"] for e in out["experiments"].values() if e["dataset"] == "multi30k"}
    (pair,) = pairs
    tests = sorted({t for e in out["experiments"].values() for t in e["test_sets"]})
    out["datasets"] = {
        LOCAL_NAME: {
            "pair": pair,
            "train": str(files / "train"),
            "valid": str(files / "val"),
            "test": {name: str(files / name) for name in tests},
        }
    }
    out["data"] = {LOCAL_NAME: out["data"]["multi30k"]}
    for exp in out["experiments"].values():
        exp["dataset"] = LOCAL_NAME
    out["data_mirror"] = None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, required=True, help="holds multi30k/<files>")
    parser.add_argument("--config", type=Path, default=REPO / "config" / "config.yaml")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "out" / "local_dataset.json"
    )
    args = parser.parse_args()
    mirror = args.mirror.resolve()
    config = yaml.safe_load(args.config.read_text(encoding="utf-8"))
    ways = {"registry": (config, mirror), "local": (local_config(config, mirror), None)}
    rows, minutes = [], {}
    with tempfile.TemporaryDirectory(prefix="bench_local_dataset.") as tmp:
        results: dict[str, dict[str, Any]] = {}
        for way, (cfg, way_mirror) in ways.items():
            minutes[way] = run_dag(cfg, Path(tmp) / way, way_mirror)
            runs = Path(tmp) / way / "results" / "runs"
            results[way] = {
                str(p.relative_to(runs)): (
                    json.loads(p.read_text()),
                    p.with_suffix("").with_suffix(".hyp").read_text(),
                )
                for p in sorted(runs.glob("*/*.scores.json"))
            }
        for key in sorted(results["registry"]):
            reg, reg_hyp = results["registry"][key]
            loc, loc_hyp = results["local"][key]
            row = {"scores": key, "same_hypotheses": reg_hyp == loc_hyp}
            for metric in ("bleu", "chrf", "bleu_lc_tok"):
                row[f"{metric}_registry"] = reg[metric]["score"]
                row[f"{metric}_local"] = loc[metric]["score"]
            rows.append(row)
    same = all(r["same_hypotheses"] and r["bleu_registry"] == r["bleu_local"] for r in rows)
    header = ("test set", "BLEU reg", "BLEU local", "lc tok reg", "lc tok local", "same hyps")
    print(f"{header[0]:<40} " + " ".join(f"{h:>12}" for h in header[1:]))
    for r in rows:
        values = [r[f"{m}_{w}"] for m in ("bleu", "bleu_lc_tok") for w in ("registry", "local")]
        print(f"{r['scores']:<40} " + " ".join(f"{v:>12.4f}" for v in values)
              + f" {r['same_hypotheses']!s:>12}")  # fmt: skip
    print(f"minutes per DAG: registry {minutes['registry']:.1f}, local {minutes['local']:.1f}")
    print("identical to the last digit" if same else "DIFFERENT")
    record = {
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(),
        "minutes": minutes,
        "rows": rows,
        "identical": same,
    }
    write_result(args.out, record)
    print(f"wrote {args.out}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
