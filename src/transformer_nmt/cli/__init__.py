"""Command line: ``python -m transformer_nmt <stage> ...`` (also the ``transformer-nmt`` command).

Each stage lives in its own module ``transformer_nmt.cli.<module>`` that defines
``configure(parser: argparse.ArgumentParser) -> None`` and ``run(args: argparse.Namespace) -> int``.
Modules are imported only when their stage runs, so ``--help`` and light stages stay fast.
Only the CLI reads config files; library functions take explicit typed arguments.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from transformer_nmt.errors import UserFacingError

# stage name -> its one-line help; the stage's module under transformer_nmt.cli is its name with
# "_" for "-" (``stage_module``)
STAGES: dict[str, str] = {
    "info": "print a model preset's configuration and parameter count as JSON",
    "download": "fetch a dataset's files from their URLs or a mirror (sha256)",
    "prepare": "extract, read and clean a language pair's corpora into text splits",
    "spm-train": "train the joint SentencePiece model of a language pair",
    "encode": "encode text splits into memory-mappable token-id arrays",
    "plan": "pre-flight: batch, accumulation, peak memory and hours of a config's runs",
    "train": "train a Transformer with PyTorch Lightning (resumes from checkpoints)",
    "average": "average the last K checkpoints into one model file",
    "translate": "beam-search translate a file (or stdin) with a trained model",
    "select-alpha": "choose a model's length penalty alpha on the dev set (translate --alpha-from)",
    "export-ct2": "convert a model file into a CTranslate2 model directory",
    "attention-maps": (
        "draw the encoder-decoder attention of test sentences (PNG + CSV per sentence)"
    ),
    "score": "score hypotheses against references with sacreBLEU",
    "report": "aggregate every experiment's scores into a report",
    "register": "log a trained experiment as an MLflow model and register it",
    "check-config": (
        "check a pipeline config file: YAML syntax (file:line:column), schema, experiments"
    ),
    "ui": "start the MLflow UI on the project's store; print each experiment's link",
}


def stage_module(stage: str) -> str:
    return f"transformer_nmt.cli.{stage.replace('-', '_')}"


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and one (not yet configured) sub-parser per stage."""
    parser = argparse.ArgumentParser(
        prog="transformer_nmt",
        description="Reproduce 'Attention Is All You Need' stage by stage.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    stage_parsers = {}
    for name, help_text in STAGES.items():
        stage_parsers[name] = sub.add_parser(name, help=help_text, description=help_text)
    return parser, stage_parsers


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, stage_parsers = build_parser()
    # The stage is the first word that is not an option (the top-level options take no value).
    # Only its module is imported and adds its arguments, before parsing: so `<stage> --help`
    # lists them, and light stages stay fast.
    stage = next((word for word in argv if not word.startswith("-")), None)
    if stage in STAGES:
        module = importlib.import_module(stage_module(stage))
        module.configure(stage_parsers[stage])
    args = parser.parse_args(argv)  # an unknown stage or bad option exits here with usage
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(module.run(args) or 0)
    except UserFacingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformer_nmt")
    except PackageNotFoundError:
        return "unknown (not installed)"
