"""``score``: sacreBLEU BLEU/chrF (primary) and the paper-comparable tokenized BLEU, as one JSON."""

from __future__ import annotations

import argparse
import logging

from transformer_nmt.evaluation.score import score_files
from transformer_nmt.io_utils import write_json

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hyp", required=True, help="detokenised hypotheses, one per line")
    parser.add_argument("--ref", required=True, help="references, line-aligned with --hyp")
    parser.add_argument(
        "--tgt-lang", required=True, help="target language code for the Moses tokenizer (de, fr)"
    )
    parser.add_argument("--out", required=True, help="where to write the scores JSON")


def run(args: argparse.Namespace) -> int:
    scores = score_files(args.hyp, args.ref, args.tgt_lang)
    payload = {"hyp": str(args.hyp), "ref": str(args.ref), "tgt_lang": args.tgt_lang}
    payload.update(scores.to_dict())
    write_json(args.out, payload)
    log.info(
        "BLEU %.2f (%s) | chrF %.2f | paper-comparable tokenized BLEU %.2f | lc tok BLEU %.2f",
        scores.bleu["score"],
        scores.bleu["signature"],
        scores.chrf["score"],
        scores.bleu_paper["score"],
        scores.bleu_lc_tok["score"],
    )
    return 0
