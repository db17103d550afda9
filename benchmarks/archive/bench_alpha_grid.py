"""How far ``translate.alpha: auto`` should search, argued from the dev set alone.

``evaluation.selection.ALPHA_CANDIDATES`` (0.6 ... 1.6) bounds the α that ``select-alpha`` may
choose. A wider grid always finds an equal or higher dev BLEU on the set it is chosen on; the
question is whether that gain is real or the dev set's noise. Two dev-only measures:

- **Held-out halves**: the dev set split into its odd and even lines; α chosen on one half with
  each grid, scored on the other (both ways, the two halves' BLEU averaged). A grid whose
  choice does better on the half it did not see generalises; one that only gains where it
  chose, fits the noise.
- **Paired bootstrap on the whole dev set** (sacreBLEU's, ``evaluation.significance``): the
  wide grid's best α against the narrow grid's best; p-value and the difference.

The model translates the dev set once per α of ``--wide`` (beam and the other settings as
``translate``'s flags; ``--quantize int8`` as the demo decodes). Prints a table, writes
``benchmarks/out/alpha_grid.json`` with the machine and the command.

    python benchmarks/bench_alpha_grid.py --model results/runs/E/averaged.pt \\
      --spm-model results/spm/D/P/spm.model --src results/data/D/P/valid.en \\
      --ref results/data/D/P/valid.de --tgt-lang de --quantize int8
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from transformer_nmt.cli.arguments import add_search_arguments, search_settings
from transformer_nmt.evaluation.score import bleu_tokenizer, score_lines
from transformer_nmt.evaluation.selection import ALPHA_CANDIDATES
from transformer_nmt.evaluation.significance import paired_bootstrap
from transformer_nmt.inference.translator import Translator
from transformer_nmt.io_utils import read_lines, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage_process import allocator_as_in_the_stages, machine  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "alpha_grid.json"
WIDE = (0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.5, 3.0, 4.0)


def bleu(hyps: list[str], refs: list[str], tgt_lang: str) -> float:
    return float(score_lines(hyps, refs, tgt_lang).bleu["score"])


def choose(scores: dict[float, float], grid: tuple[float, ...]) -> float:
    """The α of ``grid`` with the best score; ties to the one nearest the paper's 0.6, as
    ``select_alpha`` breaks them."""
    return max(grid, key=lambda a: (scores[a], -abs(a - 0.6)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--spm-model", type=Path, required=True)
    parser.add_argument("--src", type=Path, required=True, help="dev source")
    parser.add_argument("--ref", type=Path, required=True, help="dev reference")
    parser.add_argument("--tgt-lang", required=True)
    parser.add_argument("--wide", type=float, nargs="+", default=list(WIDE))
    parser.add_argument("--quantize", choices=["none", "int8"], default="int8")
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--hyps-dir", type=Path,
        help="keep each alpha's dev translations here (alpha_<a>.txt) and reuse them on a rerun",
    )  # fmt: skip
    add_search_arguments(parser)
    args = parser.parse_args()
    print(f"memory: {allocator_as_in_the_stages()}")
    narrow = tuple(ALPHA_CANDIDATES)
    wide = tuple(sorted(set(args.wide) | set(narrow)))
    sources, refs = read_lines(args.src), read_lines(args.ref)
    settings = search_settings(args)
    quantize = None if args.quantize == "none" else args.quantize
    translator = Translator(args.model, args.spm_model, settings, "cpu", quantize)
    hyps: dict[float, list[str]] = {}
    for alpha in wide:
        kept = args.hyps_dir / f"alpha_{alpha:g}.txt" if args.hyps_dir else None
        if kept is not None and kept.is_file():
            hyps[alpha] = read_lines(kept)
        else:
            translator.settings = replace(settings, alpha=alpha)
            hyps[alpha] = translator.translate(sources)
            if kept is not None:
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text("".join(f"{h}\n" for h in hyps[alpha]), encoding="utf-8")
        print(f"alpha {alpha:g}: dev BLEU {bleu(hyps[alpha], refs, args.tgt_lang):.2f}", flush=True)

    halves = {"odd": range(0, len(refs), 2), "even": range(1, len(refs), 2)}
    half_scores = {
        name: {a: bleu([h[i] for i in rows], [refs[i] for i in rows], args.tgt_lang)
               for a, h in hyps.items()}
        for name, rows in halves.items()
    }  # fmt: skip
    full = {a: bleu(h, refs, args.tgt_lang) for a, h in hyps.items()}
    grids = {"narrow (ALPHA_CANDIDATES)": narrow, "wide": wide}
    held_out = {}
    for label, grid in grids.items():
        folds = []
        for chosen_on, scored_on in (("odd", "even"), ("even", "odd")):
            alpha = choose(half_scores[chosen_on], grid)
            folds.append({"chosen_on": chosen_on, "alpha": alpha,
                          "chosen_half_bleu": half_scores[chosen_on][alpha],
                          "held_out_bleu": half_scores[scored_on][alpha]})  # fmt: skip
        held_out[label] = {
            "folds": folds,
            "mean_chosen_half": statistics.fmean(f["chosen_half_bleu"] for f in folds),
            "mean_held_out": statistics.fmean(f["held_out_bleu"] for f in folds),
            "full_dev_choice": choose(full, grid),
        }
    best_narrow = held_out["narrow (ALPHA_CANDIDATES)"]["full_dev_choice"]
    best_wide = held_out["wide"]["full_dev_choice"]
    base, system, signature = paired_bootstrap(
        [hyps[best_narrow]], [hyps[best_wide]], refs, args.resamples,
        bleu_tokenizer(args.tgt_lang),
    )  # fmt: skip

    print(f"\n{'alpha':>6} {'dev':>7} {'odd':>7} {'even':>7}")
    for a in wide:
        mark = " <- narrow" if a == best_narrow else " <- wide" if a == best_wide else ""
        print(f"{a:>6g} {full[a]:>7.2f} {half_scores['odd'][a]:>7.2f} "
              f"{half_scores['even'][a]:>7.2f}{mark}")  # fmt: skip
    print("\nchosen on one half, scored on the other (mean of both ways):")
    for label, h in held_out.items():
        alphas = ", ".join(f"{f['alpha']:g} on {f['chosen_on']}" for f in h["folds"])
        print(f"  {label:<26} chose {alphas}: {h['mean_chosen_half']:.2f} where chosen, "
              f"{h['mean_held_out']:.2f} held out")  # fmt: skip
    print(f"whole dev set: wide's {best_wide:g} against narrow's {best_narrow:g}: "
          f"{system.bleu - base.bleu:+.2f} BLEU, p = {system.p_value:.3f} "
          f"(paired bootstrap, {args.resamples} resamples)")  # fmt: skip
    write_json(args.out, {
        "benchmark": "alpha_grid",
        "command": " ".join(sys.argv),
        "machine": machine(),
        "model": str(args.model),
        "dev": [str(args.src), str(args.ref)],
        "quantize": args.quantize,
        "dev_bleu": {str(a): v for a, v in full.items()},
        "half_bleu": {n: {str(a): v for a, v in s.items()} for n, s in half_scores.items()},
        "held_out": held_out,
        "paired_bootstrap": {"narrow_alpha": best_narrow, "wide_alpha": best_wide,
                             "difference": system.bleu - base.bleu,
                             "p_value": system.p_value, "signature": signature},
    })  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
