"""``spm-train``: train the joint SentencePiece BPE model of a language pair."""

from __future__ import annotations

import argparse
from pathlib import Path

from transformer_nmt.data.spm import train_spm
from transformer_nmt.languages import character_coverage


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inputs", nargs="+", required=True, help="train.<src> train.<tgt>")
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument(
        "--sample-sentences",
        type=int,
        default=2_000_000,
        help="train on a seeded random sample of this many lines (source and target pooled)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model-prefix", required=True, help="writes PREFIX.model/.vocab/.json")
    parser.add_argument("--threads", type=int, default=None, help="default: the usable cores")
    parser.add_argument(
        "--character-coverage",
        type=float,
        default=None,
        help="share of characters given their own piece; the rest are spelled as bytes. "
        "Default by script, from the inputs' language suffixes (train.<lang>): 0.9995 with a "
        "CJK language (zh, ja, ko), else 0.9999",
    )
    parser.add_argument(
        "--lowercase",
        action="store_true",
        help="the model lowercases every text it encodes, training data and input alike "
        "(a departure: the Multi30k literature's lowercased training text); default: identity",
    )


def run(args: argparse.Namespace) -> int:
    train_spm(
        args.inputs,
        args.model_prefix,
        vocab_size=args.vocab_size,
        sample_sentences=args.sample_sentences,
        seed=args.seed,
        num_threads=args.threads,
        character_coverage=args.character_coverage
        or character_coverage([Path(p).suffix.lstrip(".") for p in args.inputs]),
        lowercase=args.lowercase,
    )
    return 0
