"""A lever screen: one recipe experiment and its variants, each with several seeds, through the
pipeline up to the dev set's choices (train -> average, K on dev -> select-alpha), then the
adoption rule (below) on the dev numbers.

Two steps, so that the runs can go wherever there is compute (a 2-core CPU trains one run an
hour; a lent GPU trains several side by side, each a small host-bound process):

    python benchmarks/lever_screen.py config --recipe config/experiments/multi30k_en_de_cpu.yaml \
        --seeds 1 2 3 --variant postln model_overrides.norm_first=false \
        --set train.accelerator=gpu --data-mirror ../shared/data --out screen.yaml
    snakemake --cores all --configfile screen.yaml $(cat screen.yaml.targets)
    python benchmarks/lever_screen.py summary --runs-dir results/runs --config screen.yaml

``config`` writes a config whose experiments are the recipe's (named ``<experiment>``) and
each ``--variant NAME key=value ...`` (named ``<experiment>_NAME``: the recipe's experiment with
those keys set; dotted keys reach into it, values read as YAML), every one with ``seeds:``;
``--set`` applies to all of them (e.g. the accelerator). ``--config-set`` sets keys of the config
itself, outside the experiments: a data lever (``data.multi30k.en-de.vocab_size=10000``) changes
the vocabulary every experiment of one DAG shares, so it is screened in a DAG of its own, the
recipe's experiment renamed with ``--name`` (its numbers then set beside the recipe's by hand).
The targets file lists each run's ``alpha_selection.json``: the test sets are not decoded (they
are read once, at the end).

``summary`` reads each run's dev numbers: dev BLEU at K 1 and alpha 0.6 (the last validation,
``average_selection.json``), the dev perplexity at the last validation, dev BLEU after the
pipeline's choice of K and alpha (``alpha_selection.json``), and training's mean target
tokens/s; per variant their mean and sample sd over seeds. Where a run's test sets were decoded
and scored (a DAG run to its end), their sacreBLEU and lowercased tokenized BLEU too, with their
mean and sd, in a table of their own. The rule: a variant is adopted only
if its mean is above the recipe's by more than the larger of the two sds, on both dev BLEU
measures. Prints a Markdown table; writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml
from harness import key_values, machine

from transformer_nmt.evaluation.report import SCORES_SUFFIX
from transformer_nmt.experiments.paths import ALPHA_SELECTION
from transformer_nmt.runs import layout

MEASURES = ("dev_bleu_k1", "dev_ppl", "dev_bleu_chosen")
TEST_METRICS = ("bleu", "bleu_lc_tok")  # sacreBLEU; lowercased tokenized (the literature's)


def _set_dotted(target: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for key in keys[:-1]:
        target = target.setdefault(key, {})
        if not isinstance(target, dict):
            sys.exit(f"lever_screen: {dotted}: {key} is not a mapping in the recipe")
    target[keys[-1]] = value


def _settings(items: list[str], where: str) -> list[tuple[str, Any]]:
    return key_values(items, f"lever_screen: {where}")


def build_config(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The screen's config and its targets (one alpha_selection.json per run)."""
    recipe = yaml.safe_load(Path(args.recipe).read_text())
    experiments = recipe.get("experiments") or {}
    name = args.experiment or next(iter(experiments), None)
    if name not in experiments:
        sys.exit(f"lever_screen: {args.recipe}: no experiment {name!r} (has {list(experiments)})")
    base = copy.deepcopy(experiments[name])
    base.pop("seeds", None)
    for key, value in _settings(args.set or [], "--set"):
        _set_dotted(base, key, value)
    variants = {args.name or name: base}
    for spec in args.variant or []:
        label, settings = spec[0], spec[1:]
        variant = copy.deepcopy(base)
        for key, value in _settings(settings, f"--variant {label}"):
            _set_dotted(variant, key, value)
        variants[f"{args.name or name}_{label}"] = variant
    for variant in variants.values():
        variant["seeds"] = list(args.seeds)
    config = {k: v for k, v in recipe.items() if k != "experiments"}
    for key, value in _settings(args.config_set or [], "--config-set"):
        if key.split(".")[0] == "experiments":
            sys.exit(f"lever_screen: --config-set {key}: an experiment's key; use --set/--variant")
        _set_dotted(config, key, value)
    config["experiments"] = variants
    if args.data_mirror:
        config["data_mirror"] = args.data_mirror
    targets = [
        ALPHA_SELECTION.format(experiment=f"{variant}.seed{seed}")
        for variant in variants
        for seed in args.seeds
    ]
    return config, targets


def run_numbers(run: Path) -> dict[str, Any]:
    """One run's dev numbers (None where the run did not get that far)."""

    def read(name: str) -> dict[str, Any]:
        path = run / name
        return json.loads(path.read_text()) if path.exists() else {}

    average, alpha, summary = (
        read(layout.SELECTION_FILE),
        read(layout.ALPHA_SELECTION_FILE),
        read(layout.SUMMARY_FILE),
    )
    k1 = (average.get("dev_bleu") or {}).get("1")
    chosen = max((alpha.get("dev_bleu") or {}).values(), default=None)
    metrics = summary.get("metrics") or {}  # the train stage's last logged values
    tests = {}
    for path in sorted(run.glob(f"*{SCORES_SUFFIX}")):
        scores = json.loads(path.read_text())
        test_set = path.name.removesuffix(SCORES_SUFFIX)
        tests[test_set] = {m: (scores.get(m) or {}).get("score") for m in TEST_METRICS}
    return {
        "dev_bleu_k1": k1,
        "dev_ppl": metrics.get("val/ppl"),  # the last validation's
        "dev_bleu_chosen": chosen,
        "best_k": average.get("best_k"),
        "best_alpha": alpha.get("best_alpha"),
        "final_step": summary.get("final_step"),
        "tgt_tokens_per_s_mean": metrics.get("train/tgt_tokens_per_s_mean"),
        "test": tests,
    }


def _mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def summarize(config: dict[str, Any], runs_dir: Path) -> dict[str, Any]:
    variants: dict[str, Any] = {}
    for name, exp in config["experiments"].items():
        runs = {seed: run_numbers(runs_dir / f"{name}.seed{seed}") for seed in exp["seeds"]}
        stats = {}
        for measure in MEASURES:
            values = [r[measure] for r in runs.values() if r[measure] is not None]
            mean, sd = _mean_sd(values)
            stats[measure] = {"mean": mean, "sd": sd, "n": len(values)}
        test_sets = sorted({s for r in runs.values() for s in r["test"]})
        test = {}
        for test_set in test_sets:
            for metric in TEST_METRICS:
                values = [r["test"][test_set][metric] for r in runs.values()
                          if r["test"].get(test_set, {}).get(metric) is not None]  # fmt: skip
                mean, sd = _mean_sd(values)
                test[f"{test_set}.{metric}"] = {"mean": mean, "sd": sd, "n": len(values)}
        variants[name] = {"runs": runs, "stats": stats, "test": test}
    baseline = next(iter(variants))
    base = variants[baseline]["stats"]
    for name, variant in variants.items():
        if name == baseline:
            continue
        verdict = {}
        for measure in ("dev_bleu_k1", "dev_bleu_chosen"):
            mine, theirs = variant["stats"][measure], base[measure]
            if mine["mean"] is None or theirs["mean"] is None:
                verdict[measure] = None
                continue
            margin = max(mine["sd"] or 0.0, theirs["sd"] or 0.0)
            gain = mine["mean"] - theirs["mean"]
            verdict[measure] = {"gain": gain, "larger_sd": margin, "above": gain > margin}
        complete = all(v is not None for v in verdict.values()) and all(
            variant["stats"][m]["n"] == len(variant["runs"]) for m in verdict
        )
        variant["rule"] = verdict
        variant["adopt"] = complete and all(v["above"] for v in verdict.values())
    return {"baseline": baseline, "variants": variants}


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _fmt(stat: dict[str, Any]) -> str:
    if stat["mean"] is None:
        return "–"
    sd = "" if stat["sd"] is None else f" ± {stat['sd']:.2f}"
    return f"{stat['mean']:.2f}{sd} (n {stat['n']})"


def render(result: dict[str, Any]) -> str:
    lines = [
        "| variant | seeds: dev BLEU K 1, α 0.6 / chosen | dev BLEU, K 1, α 0.6 | dev ppl "
        "| dev BLEU, chosen | rule (gain, larger sd) |",
        "|---|---|---|---|---|---|",
    ]
    for name, variant in result["variants"].items():
        seeds = "; ".join(
            f"{seed}: {_number(r['dev_bleu_k1'])} / {_number(r['dev_bleu_chosen'])}"
            for seed, r in variant["runs"].items()
        )
        rule = "baseline"
        if "rule" in variant:
            parts = [
                "–" if v is None else f"{v['gain']:+.2f} vs {v['larger_sd']:.2f}"
                for v in variant["rule"].values()
            ]
            rule = f"{' ; '.join(parts)}: {'adopt' if variant['adopt'] else 'not adopted'}"
        stats = variant["stats"]
        lines.append(
            f"| {name} | {seeds} | {_fmt(stats['dev_bleu_k1'])} | {_fmt(stats['dev_ppl'])} "
            f"| {_fmt(stats['dev_bleu_chosen'])} | {rule} |"
        )
    measured = sorted({k for variant in result["variants"].values() for k in variant["test"]})
    if measured:
        lines += ["", f"| variant | {' | '.join(measured)} |", "|---|" + "---|" * len(measured)]
        for name, variant in result["variants"].items():
            cells = [_fmt(variant["test"].get(k, {"mean": None})) for k in measured]
            lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cfg = sub.add_parser("config", help="write the screen's config and its targets")
    cfg.add_argument("--recipe", required=True)
    cfg.add_argument("--experiment", help="the recipe's experiment (default: its first)")
    cfg.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    cfg.add_argument("--variant", nargs="+", action="append", metavar="NAME KEY=VALUE")
    cfg.add_argument("--set", nargs="+", metavar="KEY=VALUE", help="applied to every variant")
    cfg.add_argument(
        "--config-set", nargs="+", metavar="KEY=VALUE", help="the config's own keys (data.*)"
    )
    cfg.add_argument("--name", help="the screened experiment's name (default: the recipe's)")
    cfg.add_argument("--data-mirror")
    cfg.add_argument("--out", required=True)
    summ = sub.add_parser("summary", help="the runs' dev numbers and the adoption rule")
    summ.add_argument("--config", required=True, help="the config `config` wrote")
    summ.add_argument("--runs-dir", default="results/runs")
    summ.add_argument("--out", help="JSON file (default: none)")
    args = parser.parse_args(argv)
    if args.command == "config":
        config, targets = build_config(args)
        Path(args.out).write_text(yaml.safe_dump(config, sort_keys=False))
        Path(args.out + ".targets").write_text("\n".join(targets) + "\n")
        print(f"{args.out}: {len(config['experiments'])} variants x {len(args.seeds)} seeds")
        return 0
    config = yaml.safe_load(Path(args.config).read_text())
    result = summarize(config, Path(args.runs_dir))
    result["machine"] = machine()
    print(render(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
