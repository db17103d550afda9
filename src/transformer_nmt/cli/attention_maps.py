"""``attention-maps``: figures of the encoder-decoder attention for fixed test sentences.

Translates lines ``--lines`` of ``--input`` (beam search, the experiment's settings), recomputes
the attention of decoder layer ``--layer`` by teacher forcing on each translation, and writes
``<out-dir>/attention_<line>.png`` (every head and the head average) with
``attention_<line>.csv`` (the numbers) beside it (``evaluation/attention_maps.py``). With the
tracking flags both are logged as MLflow artifacts under ``figures/`` of the experiment's run.
"""

from __future__ import annotations

import argparse
import logging

from transformer_nmt import tracking
from transformer_nmt.cli import arguments
from transformer_nmt.errors import ConfigError
from transformer_nmt.runs.layout import FIGURES_DIR

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model file (averaged.pt) or checkpoint")
    parser.add_argument("--spm-model", required=True, help="the pair's SentencePiece model")
    parser.add_argument("--input", required=True, help="source side of a test set")
    parser.add_argument(
        "--lines",
        type=int,
        nargs="+",
        default=[1, 2, 3],
        metavar="N",
        help="1-based line numbers of --input to draw (default: 1 2 3)",
    )
    parser.add_argument(
        "--layer",
        type=int,
        default=-1,
        help="decoder layer whose encoder-decoder attention is drawn: 0-based, negative counts "
        "from the end (default -1, the last)",
    )
    parser.add_argument(
        "--out-dir", required=True, help="where attention_<line>.png/.csv are written"
    )
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda:0")
    arguments.add_search_arguments(parser)
    arguments.add_tracking_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from transformer_nmt.evaluation.attention_maps import select_lines, write_attention_maps
    from transformer_nmt.inference.translator import Translator
    from transformer_nmt.io_utils import read_lines

    if len(set(args.lines)) != len(args.lines):
        raise ConfigError(f"--lines: each line once, got {args.lines}")
    settings = arguments.search_settings(args)
    sources = select_lines(read_lines(args.input), args.lines, args.input)
    params = {"lines": args.lines, "layer": args.layer, "model": str(args.model)}
    with tracking.stage_run(
        args.mlflow_experiment,
        args.mlflow_run,
        "attention_maps",
        params,
        run_dir=arguments.tracking_run_dir(args),
    ) as tracked:
        translator = Translator(args.model, args.spm_model, settings, args.device)
        n_layers = translator.model.cfg.N
        if not -n_layers <= args.layer < n_layers:
            raise ConfigError(f"--layer {args.layer}: the model has {n_layers} decoder layers")
        records = translator.translate_with_attention(sources, layer=args.layer)
        layer = args.layer % n_layers
        label = f"decoder layer {layer + 1} of {n_layers}"
        written = write_attention_maps(records, args.lines, args.out_dir, label)
        if tracked is not None:
            for path in written:
                tracked.log_artifact(path, FIGURES_DIR)
    return 0
