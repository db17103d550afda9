"""``encode``: encode text splits into memory-mappable token-id arrays."""

from __future__ import annotations

import argparse
import os

from transformer_nmt.data.encode import encode_files


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spm-model", required=True, help="results/spm/<dataset>/<pair>/spm.model")
    parser.add_argument("--inputs", nargs="+", required=True, help="text files {split}.{lang}")
    parser.add_argument("--out-dir", required=True, help="results/bin/<dataset>/<pair>")
    parser.add_argument(
        "--workers",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="encoding processes (default: the usable cores)",
    )


def run(args: argparse.Namespace) -> int:
    encode_files(args.spm_model, args.inputs, args.out_dir, workers=max(1, args.workers))
    return 0
