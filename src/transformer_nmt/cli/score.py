"""``score``: sacreBLEU BLEU/chrF (primary) and the paper-comparable tokenized BLEU, as one JSON."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from transformer_nmt import tracking
from transformer_nmt.cli.arguments import add_tracking_arguments, tracking_run_dir
from transformer_nmt.errors import ConfigError
from transformer_nmt.evaluation.report import CLEAN_REPORT, SCORES_SUFFIX
from transformer_nmt.evaluation.score import DEFAULT_RESAMPLES, score_files
from transformer_nmt.io_utils import write_json

log = logging.getLogger(__name__)

_METRICS = ("bleu", "chrf", "bleu_paper", "bleu_lc_tok")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hyp", required=True, help="detokenised hypotheses, one per line")
    parser.add_argument("--ref", required=True, help="references, line-aligned with --hyp")
    parser.add_argument(
        "--tgt-lang",
        required=True,
        help="target language code: BLEU's tokenizer (13a; zh, ja, ko, char where words are not "
        "space-separated) and the Moses tokenizer's language",
    )
    parser.add_argument(
        "--out", required=True, help=f"where to write the scores JSON (<test_set>{SCORES_SUFFIX})"
    )
    parser.add_argument(
        "--bootstrap-resamples",
        type=int,
        default=DEFAULT_RESAMPLES,
        help="each score's 95%% bootstrap interval from this many resamples (sacreBLEU's "
        "--confidence-n; 0 = no interval)",
    )
    parser.add_argument(
        "--lowercase",
        action="store_true",
        help="case-insensitive BLEU, chrF and tokenized BLEU (sacreBLEU's lowercase, case:lc "
        "in the signatures): for a model whose vocabulary lowercases (data setting lowercase)",
    )
    add_tracking_arguments(parser)


def test_set_name(out: str | Path) -> str:
    """``results/runs/E/test_2016_flickr.scores.json`` -> ``test_2016_flickr``."""
    name = Path(out).name
    return name[: -len(SCORES_SUFFIX)] if name.endswith(SCORES_SUFFIX) else Path(out).stem


def score_metrics(test_set: str, payload: dict) -> dict[str, float]:
    """``<test set>.<metric>`` and, with an interval, ``<test set>.<metric>_ci95_low/_high``."""
    metrics = {}
    for key in _METRICS:
        if payload[key]["score"] is None:  # tokenized BLEU where Moses tokenization is undefined
            continue
        metrics[f"{test_set}.{key}"] = payload[key]["score"]
        ci = payload[key].get("ci95")
        if ci is not None:
            metrics[f"{test_set}.{key}_ci95_low"] = ci["low"]
            metrics[f"{test_set}.{key}_ci95_high"] = ci["high"]
    return metrics


def run(args: argparse.Namespace) -> int:
    if args.bootstrap_resamples < 0:
        raise ConfigError(f"--bootstrap-resamples: {args.bootstrap_resamples} is negative")
    test_set = test_set_name(args.out)
    # (the resamples are in the signature tags: bs:N)
    params = {
        "tgt_lang": args.tgt_lang, "hyp": str(args.hyp), "ref": str(args.ref),
        "lowercase": args.lowercase,
    }  # fmt: skip
    # One score job per test set runs in parallel: a qualified stage name keeps their params apart.
    with tracking.stage_run(
        args.mlflow_experiment, args.mlflow_run, f"score.{test_set}", params,
        run_dir=tracking_run_dir(args),
    ) as tracked:  # fmt: skip
        scores = score_files(
            args.hyp, args.ref, args.tgt_lang, args.bootstrap_resamples, lowercase=args.lowercase
        )
        payload = {
            "hyp": str(args.hyp), "ref": str(args.ref), "tgt_lang": args.tgt_lang,
            "lowercase": args.lowercase,
        }  # fmt: skip
        payload.update(scores.to_dict())
        write_json(args.out, payload)
        if tracked is not None:
            tracked.log_metrics(score_metrics(test_set, payload))
            tracked.set_tags(
                {
                    f"{test_set}.bleu_signature": scores.bleu["signature"],
                    f"{test_set}.chrf_signature": scores.chrf["signature"],
                }
            )
            tracked.log_artifact(args.out, "scores")
            # the test set's raw files as an MLflow dataset input (context "test"), when the
            # references are prepare's (its report beside them names the dataset pair)
            clean_report = Path(args.ref).parent / CLEAN_REPORT
            if clean_report.is_file():
                inputs = tracking.data_inputs(clean_report, {test_set: "test"})
                tracked.log_data_inputs(inputs)

    def shown(entry: dict) -> str:
        return "—" if entry["score"] is None else f"{entry['score']:.2f}"

    log.info(
        "%s: BLEU %.2f (%s) | chrF %.2f | paper-comparable tokenized BLEU %s | lc tok BLEU %s",
        test_set,
        scores.bleu["score"],
        scores.bleu["signature"],
        scores.chrf["score"],
        shown(scores.bleu_paper),
        shown(scores.bleu_lc_tok),
    )
    return 0
