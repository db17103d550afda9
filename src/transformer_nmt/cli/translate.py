"""``translate``: beam-search a file (or stdin) with a model file, detokenised output.

Input lines end at ``\n`` only (``io_utils.read_lines`` / ``stream_line_batches``): output line
i is the translation of input line i. Stdin is translated as it arrives, in batches of at most
``--stdin-batch`` lines (fewer when the input pauses), each written and flushed at once.

``--print-attention`` / ``--print-alignment`` replace each output line by a JSON line with the
tokens and the last decoder layer's encoder-decoder attention, or by ``translation ||| i-j ...``
(Pharaoh word alignments); still one line per input line (docs/interfaces.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from transformer_nmt import tracking
from transformer_nmt.cli import arguments
from transformer_nmt.errors import ConfigError
from transformer_nmt.io_utils import atomic_open, read_lines, stream_line_batches
from transformer_nmt.search.settings import SearchSettings

if TYPE_CHECKING:
    from transformer_nmt.inference.translator import Translator
    from transformer_nmt.progress import Progress

log = logging.getLogger(__name__)

STDIN_BATCH = 256  # lines: enough for full token batches, small enough to answer promptly


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model file (averaged.pt) or checkpoint")
    parser.add_argument("--spm-model", required=True, help="the pair's SentencePiece model")
    parser.add_argument("--input", help="source text, one sentence per line (default: stdin)")
    parser.add_argument("--output", help="translations, one per line (default: stdout)")
    arguments.add_search_arguments(parser)
    defaults = SearchSettings()
    parser.add_argument(
        "--nbest",
        type=int,
        default=defaults.nbest,
        help="n-best lists as 'i ||| text ||| score' lines",
    )
    parser.add_argument(
        "--stdin-batch",
        type=int,
        default=STDIN_BATCH,
        metavar="N",
        help="stdin: translate (and write) at most N lines at a time, or fewer when the input "
        f"pauses, so piped input is translated as it arrives ({STDIN_BATCH})",
    )
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--print-attention",
        dest="attention_format",
        action="store_const",
        const="json",
        help="write per input line a JSON object instead of the translation: source, "
        "translation, src_tokens and tgt_tokens (SentencePiece pieces, each ending with </s>), "
        "attention (the last decoder layer's encoder-decoder attention averaged over heads, "
        "teacher forced on the translation: one row per tgt_token, one column per src_token) "
        "and alignment (as --print-alignment)",
    )
    shown.add_argument(
        "--print-alignment",
        dest="attention_format",
        action="store_const",
        const="alignment",
        help="write per input line 'translation ||| i-j ...': hard word alignments in Pharaoh "
        "format (0-based source word i, target word j; fast_align/awesome-align), each target "
        "subword aligned to the source subword it attends to most (head average of the last "
        "layer, EOS left out)",
    )
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda:0")
    parser.add_argument(
        "--engine",
        choices=("torch", "ctranslate2"),
        default="torch",
        help="torch: our beam search on a model file (default); ctranslate2: a directory "
        "written by export-ct2 (needs pip install 'transformer_nmt[ct2]')",
    )
    parser.add_argument(
        "--quantize",
        choices=("int8",),
        default=None,
        help="CPU only, not the paper: int8 dynamic quantisation of the linear layers (faster "
        "CPU decoding, slightly different translations; BLEU in benchmarks/log/2026-11-25.md)",
    )
    arguments.add_tracking_arguments(parser)
    arguments.add_fast_path_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from transformer_nmt.cpu_memory import keep_freed_memory
    from transformer_nmt.inference.factory import open_translator
    from transformer_nmt.progress import Progress

    fast = arguments.apply_fast_paths(args)  # before the allocator's settings (one of them)
    memory = keep_freed_memory()
    settings = arguments.search_settings(args)
    if args.stdin_batch < 1:
        raise ConfigError(f"--stdin-batch must be >= 1, got {args.stdin_batch}")
    attention = getattr(args, "attention_format", None)
    if attention is not None and (args.engine != "torch" or settings.nbest != 1):
        flag = "--print-attention" if attention == "json" else "--print-alignment"
        raise ConfigError(f"{flag} needs --engine torch and --nbest 1")
    if args.input is None and args.output is None and sys.stdin.isatty():
        translator = open_translator(
            args.engine, args.model, args.spm_model, settings, args.device, args.quantize
        )
        print("Type a sentence per line (Ctrl-D to end).", file=sys.stderr)
        _translate_stream(
            translator, _stdin_batches(args), sys.stdout, progress=None, attention=attention
        )
        return 0

    name = Path(args.output).stem if args.output else "stdin"
    params = {**dataclasses.asdict(settings), "model": str(args.model)}
    if args.quantize:
        params["quantize"] = args.quantize
    # One translate job per test set runs in parallel: qualify the stage name with it.
    with tracking.stage_run(
        args.mlflow_experiment, args.mlflow_run, f"translate.{name}", params,
        run_dir=arguments.tracking_run_dir(args),
    ) as tracked:  # fmt: skip
        lines = read_lines(args.input) if args.input else None
        translator = open_translator(
            args.engine, args.model, args.spm_model, settings, args.device, args.quantize
        )
        log.info("CPU fast paths: %s; memory: %s", fast, memory)
        log.info(
            "translating %s on %s (beam %d, alpha %g, max len +%d)",
            f"{len(lines)} sentences" if lines is not None else "stdin as it arrives",
            translator.device, settings.beam, settings.alpha, settings.max_len_b,
        )  # fmt: skip
        progress = Progress(len(lines), f"translate {name}") if lines is not None else None
        batches = [lines] if lines is not None else _stdin_batches(args)
        started = time.monotonic()
        if args.output:
            with atomic_open(args.output) as handle:
                count = _translate_stream(translator, batches, handle, progress, attention)
        else:
            count = _translate_stream(translator, batches, sys.stdout, progress, attention)
        seconds = time.monotonic() - started
        if progress is not None:
            progress.close()
        if translator.truncated:
            log.warning(
                "%d source sentences were longer than the model's learned positions allow "
                "and were truncated to %d tokens",
                translator.truncated, translator.max_src_tokens,
            )  # fmt: skip
        rate = count / max(seconds, 1e-9)
        log.info("translated %d sentences in %.1f s (%.1f sentences/s)", count, seconds, rate)
        if tracked is not None:
            tracked.log_metrics(
                {f"{name}.translate_seconds": seconds, f"{name}.translate_sentences_per_s": rate}
            )
            if args.output:
                tracked.log_artifact(args.output, "hypotheses")
                # The MLflow UI previews .txt artifacts (not .hyp): the same file, viewable.
                tracked.log_artifact_as(args.output, f"hypotheses/{name}.txt")
    return 0


def _stdin_batches(args: argparse.Namespace) -> Iterator[list[str]]:
    return stream_line_batches(sys.stdin.buffer, args.stdin_batch, name="<stdin>")


def _translate_stream(
    translator: Translator,
    batches: Iterable[list[str]],
    out: TextIO,
    progress: Progress | None,
    attention: str | None = None,
) -> int:
    """Translate each batch of lines as it comes and write (and flush) its translations before
    the next batch is read; returns the number of lines. ``attention``: None (translations),
    or an ``inference.output.ATTENTION_FORMATS`` kind."""
    from transformer_nmt.inference.output import format_attention, format_output

    count = 0
    for lines in batches:
        if attention is not None:
            records = translator.translate_with_attention(lines, progress=progress)
            formatted = format_attention(records, attention)
        else:
            results = translator.translate_nbest(lines, progress)
            formatted = format_output(results, translator.settings.nbest, start=count)
        for line in formatted:
            out.write(line + "\n")
        out.flush()
        count += len(lines)
    return count
