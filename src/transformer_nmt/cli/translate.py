"""``translate``: beam-search a file (or stdin) with a model file, detokenised output."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path

from transformer_nmt import tracking
from transformer_nmt.io_utils import atomic_open, read_lines
from transformer_nmt.search.settings import SearchSettings

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model file (averaged.pt) or checkpoint")
    parser.add_argument("--spm-model", required=True, help="the pair's SentencePiece model")
    parser.add_argument("--input", help="source text, one sentence per line (default: stdin)")
    parser.add_argument("--output", help="translations, one per line (default: stdout)")
    defaults = SearchSettings()  # §6.1: the one source of the search defaults
    parser.add_argument(
        "--beam", type=int, default=defaults.beam, help=f"§6.1 beam size ({defaults.beam})"
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=defaults.alpha,
        help=f"§6.1 length penalty α ({defaults.alpha})",
    )
    parser.add_argument(
        "--max-len-b",
        type=int,
        default=defaults.max_len_b,
        help=f"§6.1 max output length = input length + this ({defaults.max_len_b})",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=defaults.max_tokens,
        help=f"source tokens per batch, with padding ({defaults.max_tokens})",
    )
    parser.add_argument(
        "--nbest",
        type=int,
        default=defaults.nbest,
        help="n-best lists as 'i ||| text ||| score' lines",
    )
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda:0")
    parser.add_argument(
        "--engine",
        choices=("torch", "ctranslate2"),
        default="torch",
        help="torch: our beam search on a model file (default); ctranslate2: a directory "
        "written by export-ct2 (needs pip install 'transformer_nmt[ct2]')",
    )
    tracking.add_cli_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from transformer_nmt.progress import Progress
    from transformer_nmt.translation import format_output, open_translator

    settings = SearchSettings(
        beam=args.beam, alpha=args.alpha, max_len_b=args.max_len_b, nbest=args.nbest,
        max_tokens=args.max_tokens,
    )  # fmt: skip
    if args.input is None and args.output is None and sys.stdin.isatty():
        translator = open_translator(args.engine, args.model, args.spm_model, settings, args.device)
        return _interactive(translator)

    name = Path(args.output).stem if args.output else "stdin"
    params = {**dataclasses.asdict(settings), "model": str(args.model)}
    # One translate job per test set runs in parallel: qualify the stage name with it.
    with tracking.stage_run(
        args.mlflow_experiment, args.mlflow_run, f"translate.{name}", params
    ) as tracked:
        lines = read_lines(args.input) if args.input else sys.stdin.read().splitlines()
        translator = open_translator(args.engine, args.model, args.spm_model, settings, args.device)
        log.info(
            "translating %d sentences on %s (beam %d, alpha %g, max len +%d)",
            len(lines), translator.device, settings.beam, settings.alpha, settings.max_len_b,
        )  # fmt: skip
        progress = Progress(len(lines), f"translate {name}")
        started = time.monotonic()
        results = translator.translate(lines, progress)
        seconds = time.monotonic() - started
        progress.close()
        if translator.truncated:
            log.warning(
                "%d source sentences were longer than the model's learned positions allow "
                "and were truncated to %d tokens",
                translator.truncated, translator.max_src_tokens,
            )  # fmt: skip
        if args.output:
            with atomic_open(args.output) as handle:
                for line in format_output(results, args.nbest):
                    handle.write(line + "\n")
        else:
            for line in format_output(results, args.nbest):
                sys.stdout.write(line + "\n")
            sys.stdout.flush()
        rate = len(lines) / max(seconds, 1e-9)
        log.info("translated %d sentences in %.1f s (%.1f sentences/s)", len(lines), seconds, rate)
        if tracked is not None:
            tracked.log_metrics(
                {f"{name}.translate_seconds": seconds, f"{name}.translate_sentences_per_s": rate}
            )
            if args.output:
                tracked.log_artifact(args.output, "hypotheses")
    return 0


def _interactive(translator) -> int:
    """A terminal on stdin: translate each line as soon as it is typed."""
    from transformer_nmt.translation import format_output

    print("Type a sentence per line (Ctrl-D to end).", file=sys.stderr)
    for line in sys.stdin:
        results = translator.translate([line.rstrip("\n")])
        for out in format_output(results, translator.settings.nbest):
            print(out, flush=True)
    return 0
