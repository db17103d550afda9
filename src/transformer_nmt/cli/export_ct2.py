"""``export-ct2``: convert a model file into a CTranslate2 model directory (``ct2`` module).

Needs the optional dependency CTranslate2 (``pip install 'transformer_nmt[ct2]'``). Decode the
directory with ``translate --engine ctranslate2 --model DIR --spm-model spm.model``."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)

# CTranslate2's weight types (ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES) but float32.
QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
)


def configure(parser: argparse.ArgumentParser) -> None:
    from transformer_nmt.inference.ct2 import DEFAULT_MAX_POSITIONS

    parser.add_argument("--model", required=True, help="model file (averaged.pt) or checkpoint")
    parser.add_argument("--spm-model", required=True, help="the pair's SentencePiece model")
    parser.add_argument("--out", required=True, help="CTranslate2 model directory to write")
    parser.add_argument(
        "--max-positions",
        type=int,
        default=DEFAULT_MAX_POSITIONS,
        help="rows of the sinusoid table written: the longest source + output the model can "
        f"decode ({DEFAULT_MAX_POSITIONS}; learned positions keep their own max_positions)",
    )
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="store the weights quantized (default: float32, as trained)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing --out")


def run(args: argparse.Namespace) -> int:
    from transformer_nmt.inference.ct2 import export_ct2

    out = export_ct2(
        args.model, args.spm_model, args.out, max_positions=args.max_positions,
        quantization=args.quantization, force=args.force,
    )  # fmt: skip
    log.info("wrote the CTranslate2 model %s", out)
    return 0
