"""``prepare``: read, check and clean a language pair's corpora into text splits + report."""

from __future__ import annotations

import argparse
import os

from transformer_nmt.data.clean import CleanConfig
from transformer_nmt.data.prepare import prepare_pair
from transformer_nmt.data.registry import get_dataset


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--registry", required=True, help="config/datasets.yaml")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--pair", required=True, help="e.g. en-de")
    parser.add_argument("--raw-dir", required=True, help="resources/<dataset> (downloaded files)")
    parser.add_argument("--out-dir", required=True, help="results/data/<dataset>/<pair>")
    parser.add_argument(
        "--clean",
        default="{}",
        help="JSON object of cleaning rules (keys: strip, drop_control_chars, drop_empty, "
        "max_length, max_length_ratio, dedupe, max_invalid_share, max_sentences); missing keys "
        "take defaults",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="processes that clean the training pairs (default: the usable cores); the outputs "
        "do not depend on it",
    )


def run(args: argparse.Namespace) -> int:
    rules = CleanConfig.from_json(args.clean)
    dataset = get_dataset(args.registry, args.dataset)
    prepare_pair(
        dataset, args.pair, args.raw_dir, args.out_dir, rules, workers=max(1, args.workers)
    )
    return 0
