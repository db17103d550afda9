"""``download``: fetch a dataset's files (URL or mirror) into resources/<dataset>/, verified.
A user's own corpus (``data/local.py``) is linked instead, hashed, and checked: every pair's
corpora are read once (alignment, TSV columns, empty or undecodable lines, carving, test pairs
also in training) so that a bad file stops here, before any other job."""

from __future__ import annotations

import argparse
import json

from transformer_nmt.data.clean import CleanConfig
from transformer_nmt.data.download import download_dataset, resolve_mirror
from transformer_nmt.data.local import check_pair
from transformer_nmt.data.registry import get_dataset
from transformer_nmt.data.transfer import MIRROR_ENV


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--registry", required=True, help="config/datasets.yaml")
    parser.add_argument("--dataset", required=True, help="a dataset name of the registry")
    parser.add_argument("--out-dir", required=True, help="resources/<dataset>")
    parser.add_argument(
        "--mirror",
        default=None,
        help=f"directory laid out as <mirror>/<dataset>/<file>; default ${MIRROR_ENV}. "
        "With a mirror the network is never used.",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per network read")
    parser.add_argument("--retries", type=int, default=4, help="retries of transient errors")
    parser.add_argument(
        "--clean",
        default="{}",
        help="a local dataset's cleaning rules (prepare's --clean JSON): its check allows "
        "clean.max_invalid_share of empty or undecodable lines per corpus",
    )


def run(args: argparse.Namespace) -> int:
    dataset = get_dataset(args.registry, args.dataset)
    sums = download_dataset(
        dataset,
        args.out_dir,
        mirror=resolve_mirror(args.mirror),
        timeout=args.timeout,
        retries=args.retries,
    )
    if dataset.local:
        rules = CleanConfig.from_json(args.clean)
        for pair in dataset.pairs:
            summary = check_pair(dataset, pair, args.out_dir, rules)
            print(f"{pair}: " + json.dumps(summary, sort_keys=True))
    print(json.dumps(sums, indent=2, sort_keys=True))
    return 0
