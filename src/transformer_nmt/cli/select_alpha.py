"""``select-alpha``: choose the length penalty α (§6.1) of a model on the dev set.

The averaged model translates ``--dev-src`` under each α of ``--candidates`` (default
``evaluation.selection.ALPHA_CANDIDATES``) with the experiment's other search settings and
``--quantize`` (the translate stage's, so the α is chosen for the weights that decode the test
sets); the PyTorch engine does it in one beam search for all of them, with the translations of
one search per α. The α with the best detokenised sacreBLEU against ``--dev-ref`` goes to ``--out``
(``alpha_selection.json``: ``best_alpha`` and the dev BLEU of every α), which ``translate
--alpha-from`` reads. The pipeline runs it when an experiment says ``translate.alpha: auto``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from transformer_nmt import tracking
from transformer_nmt.cli import arguments
from transformer_nmt.errors import ConfigError

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    from transformer_nmt.evaluation.selection import ALPHA_CANDIDATES

    parser.add_argument("--model", type=Path, required=True, help="model file (averaged.pt)")
    parser.add_argument("--spm-model", type=Path, required=True, help="the pair's SentencePiece")
    parser.add_argument("--dev-src", type=Path, required=True, help="dev source sentences")
    parser.add_argument("--dev-ref", type=Path, required=True, help="dev references")
    parser.add_argument("--tgt-lang", required=True, help="target language (for scoring)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument(
        "--candidates",
        type=float,
        nargs="+",
        default=list(ALPHA_CANDIDATES),
        metavar="ALPHA",
        help=f"the α to try ({' '.join(f'{a:g}' for a in ALPHA_CANDIDATES)})",
    )
    # the search that translates the dev set (its --alpha unused)
    arguments.add_search_arguments(parser)
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda:0")
    parser.add_argument(
        "--quantize",
        choices=("int8",),
        default=None,
        help="CPU only: int8 linear layers, as the translate stage decodes (translate --quantize)",
    )
    arguments.add_tracking_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from transformer_nmt.data.vocab import folds_case
    from transformer_nmt.evaluation.selection import select_alpha
    from transformer_nmt.inference.factory import open_translator
    from transformer_nmt.io_utils import read_lines, write_json

    if any(a < 0 for a in args.candidates):
        raise ConfigError(f"--candidates must be >= 0, got {args.candidates}")
    if getattr(args, "alpha_from", None) is not None:
        raise ConfigError("select-alpha chooses α: --alpha-from does not apply")
    sources, references = read_lines(args.dev_src), read_lines(args.dev_ref)
    if len(sources) != len(references):
        raise ConfigError(
            f"{args.dev_src} has {len(sources)} lines but {args.dev_ref} has {len(references)}:"
            " the dev source and reference files must be line-aligned"
        )
    settings = arguments.search_settings(args)
    params = {
        "candidates": ",".join(f"{a:g}" for a in sorted(set(args.candidates))),
        "model": str(args.model),
        "quantize": args.quantize or "none",
    }
    with tracking.stage_run(
        args.mlflow_experiment, args.mlflow_run, "select_alpha", params,
        run_dir=arguments.tracking_run_dir(args),
    ) as mlrun:  # fmt: skip
        translator = open_translator(
            "torch", args.model, args.spm_model, settings, args.device, args.quantize
        )
        log.info(
            "choosing the length penalty on %d dev sentences of %s: alpha in %s",
            len(sources), args.dev_src, params["candidates"],
        )  # fmt: skip
        selection = select_alpha(
            translator, sources, references, args.tgt_lang, candidates=args.candidates,
            lowercase=folds_case(args.spm_model),  # a lowercasing vocabulary: case-insensitive
        )  # fmt: skip
        write_json(args.out, {**selection.to_dict(), "dev_src": str(args.dev_src)})
        log.info(
            "chose alpha %g: dev BLEU %s",
            selection.best_alpha,
            ", ".join(f"{a:g}: {b:.2f}" for a, b in selection.dev_bleu.items()),
        )
        if mlrun is not None:
            mlrun.log_metrics(
                {f"select_alpha/dev_bleu_alpha_{a:g}": b for a, b in selection.dev_bleu.items()}
            )
            mlrun.set_tags({"select_alpha.best_alpha": f"{selection.best_alpha:g}"})
            mlrun.log_artifact(args.out)
    return 0
