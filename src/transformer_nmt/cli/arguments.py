"""Argument groups that several stages' CLIs share (a stage's CLI never imports another's).

``add_search_arguments`` / ``search_settings``: the §6.1 beam search's flags and their
``SearchSettings`` (translate, average, select-alpha, register, attention-maps, and the decoding
benchmarks). ``add_tracking_arguments`` / ``tracking_run_dir``: the ``--mlflow-*`` flags of
every tracked stage (``tracking.stage_run`` reads what they name). ``add_fast_path_arguments``
/ ``apply_fast_paths``: ``--cpu-fast-paths`` (``transformer_nmt.fast_paths``) of train and
translate.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from transformer_nmt import fast_paths
from transformer_nmt.errors import ConfigError
from transformer_nmt.search.settings import EARLY_STOP, SearchSettings

log = logging.getLogger(__name__)


def json_object(flag: str, text: str) -> dict[str, Any]:
    """The JSON object given to ``flag``, or a ConfigError naming the flag."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{flag}: not valid JSON ({err})") from err
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: expected a JSON object, got {type(value).__name__}")
    return value


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """``--beam --alpha|--alpha-from --max-len-b --max-tokens --early-stop`` with the §6.1
    defaults (``SearchSettings``); ``search_settings(args)`` reads them back."""
    defaults = SearchSettings()  # §6.1: the one source of the search defaults
    parser.add_argument(
        "--beam", type=int, default=defaults.beam, help=f"§6.1 beam size ({defaults.beam})"
    )
    alpha = parser.add_mutually_exclusive_group()
    alpha.add_argument(
        "--alpha",
        type=float,
        default=defaults.alpha,
        help=f"§6.1 length penalty α ({defaults.alpha})",
    )
    alpha.add_argument(
        "--alpha-from",
        type=Path,
        metavar="JSON",
        help="the α chosen on the dev set: the 'best_alpha' of a file written by select-alpha "
        "(alpha_selection.json); replaces --alpha",
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
        "--early-stop",
        choices=EARLY_STOP,
        default=defaults.early_stop,
        help="when a sentence's beam search stops: exact = once no live hypothesis can still "
        "win (default); best = once a step's best candidate ends, as OpenNMT-py/eole and "
        "CTranslate2 (faster; may miss a longer hypothesis the length penalty prefers; "
        "--engine ctranslate2 always stops this way)",
    )


def search_settings(args: argparse.Namespace) -> SearchSettings:
    alpha = args.alpha
    if getattr(args, "alpha_from", None) is not None:
        from transformer_nmt.evaluation.selection import read_chosen_alpha

        alpha = read_chosen_alpha(args.alpha_from)
        log.info("length penalty alpha %g, chosen on the dev set (%s)", alpha, args.alpha_from)
    return SearchSettings(
        beam=args.beam, alpha=alpha, max_len_b=args.max_len_b, max_tokens=args.max_tokens,
        nbest=getattr(args, "nbest", 1), early_stop=args.early_stop,
    )  # fmt: skip


def add_tracking_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--mlflow-experiment`` and ``--mlflow-run``; without both a stage does not track."""
    group = parser.add_argument_group("MLflow tracking (off unless both are given)")
    group.add_argument(
        "--mlflow-experiment",
        default=None,
        metavar="NAME",
        help="MLflow experiment = dataset pair, e.g. multi30k_en-de",
    )
    group.add_argument(
        "--mlflow-run",
        default=None,
        metavar="NAME",
        help="MLflow run = the pipeline experiment's name",
    )
    group.add_argument(
        "--mlflow-run-dir",
        default=None,
        type=Path,
        metavar="DIR",
        help="the experiment's run directory (results/runs/<experiment>): its mlflow_run.json "
        "and absolute path identify the MLflow run (without it: the newest run of that name)",
    )


def tracking_run_dir(args: argparse.Namespace, run_dir: Path | None = None) -> Path | None:
    """The run directory that keys the MLflow run: ``--mlflow-run-dir``, else the stage's own
    ``run_dir`` (train and register have ``--run-dir``); both given must be one directory."""
    given = getattr(args, "mlflow_run_dir", None)
    if given is not None and run_dir is not None and given.resolve() != run_dir.resolve():
        raise ConfigError(f"--mlflow-run-dir {given} is not --run-dir {run_dir}: give one")
    return given if given is not None else run_dir


def add_fast_path_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cpu-fast-paths",
        default=None,
        metavar="on|off|LIST",
        help="the CPU fast paths (config/README.md's departures): on, off, or a comma-separated "
        f"list of those to keep on ({', '.join(fast_paths.FAST_PATHS)}); default: "
        f"${fast_paths.ENV}, else on",
    )


def apply_fast_paths(args: argparse.Namespace) -> str:
    """Set the fast-path switch from ``--cpu-fast-paths`` (else check the environment's) for
    this process and those it starts; returns it as the log gives it. Call it first."""
    if args.cpu_fast_paths is not None:
        fast_paths.set_fast_paths(args.cpu_fast_paths)
    return fast_paths.describe()
