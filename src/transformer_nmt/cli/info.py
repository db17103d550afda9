"""``info``: print a preset's resolved configuration and parameter count as JSON.

    python -m transformer_nmt info --preset base --vocab-size 37000 --set h=1 --set d_k=512 \
        --set d_v=512
    python -m transformer_nmt info --table3          # every Table 3 row: ours vs the paper

Models are built on PyTorch's meta device: counting the big model needs no memory.
"""

from __future__ import annotations

import argparse
import json

from transformer_nmt.errors import ConfigError
from transformer_nmt.model.config import (
    PRESETS,
    TABLE3,
    ModelConfig,
    apply_overrides,
    get_preset,
    table3_config,
)
from transformer_nmt.model.transformer import count_parameters, shape_model


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="base", choices=sorted(PRESETS), help="model preset")
    parser.add_argument(
        "--vocab-size", type=int, default=37000, help="(shared) vocabulary size (paper: 37000)"
    )
    parser.add_argument(
        "--tgt-vocab-size",
        type=int,
        default=None,
        help="target vocabulary size of an untied model (needs --set tie_embeddings=false)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field (repeatable), e.g. --set h=1",
    )
    parser.add_argument(
        "--table3",
        action="store_true",
        help="print every Table 3 row (overrides of base) with our and the paper's counts",
    )


def count(cfg: ModelConfig, vocab_size: int, tgt_vocab_size: int | None = None) -> dict[str, int]:
    model = shape_model(cfg, vocab_size, tgt_vocab_size)
    return {
        "parameters": count_parameters(model),
        "parameters_without_embeddings": count_parameters(model, exclude_embeddings=True),
    }


def run(args: argparse.Namespace) -> int:
    if args.vocab_size <= 0:
        raise ConfigError(f"--vocab-size must be positive, got {args.vocab_size}")
    if args.table3:
        rows = []
        for name, row in TABLE3.items():
            counts = count(table3_config(name), args.vocab_size)
            ours_m = counts["parameters"] / 1e6
            rows.append(
                {
                    "row": name,
                    "overrides": list(row.overrides),
                    "paper_params_m": row.paper_params_m,
                    "params_m": round(ours_m, 2),
                    "relative_difference": round(
                        (ours_m - row.paper_params_m) / row.paper_params_m, 4
                    ),
                    **counts,
                }
            )
        print(json.dumps({"vocab_size": args.vocab_size, "table3": rows}, indent=2))
        return 0
    cfg = apply_overrides(get_preset(args.preset), args.overrides)
    payload = {
        "preset": args.preset,
        "overrides": list(args.overrides),
        "vocab_size": args.vocab_size,
        "tgt_vocab_size": args.tgt_vocab_size,
        "config": cfg.to_dict(),
        **count(cfg, args.vocab_size, args.tgt_vocab_size),
    }
    print(json.dumps(payload, indent=2))
    return 0
