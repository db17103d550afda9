"""``check-config``: is a pipeline config file valid? Names the file, line and column of a YAML
syntax error (Snakemake says only "Config file is not valid JSON or YAML"), then checks the
config as the Snakefile does (schema, then ``workflow/lib/pipeline.py``), naming the key."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from transformer_nmt.errors import ConfigError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configfile", type=Path, help="a config given to snakemake --configfile")


def yaml_error_line(path: Path, err: yaml.YAMLError) -> str:
    """``FILE:LINE:COLUMN: problem (context)``, from PyYAML's own marks (1-based)."""
    if not isinstance(err, yaml.MarkedYAMLError) or err.problem_mark is None:
        return f"{path}: not valid YAML ({err})".replace("\n", " ")
    mark = err.problem_mark
    text = f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {err.problem}"
    if err.context and err.context_mark is not None:
        context = err.context_mark
        text += f" ({err.context} at line {context.line + 1}, column {context.column + 1})"
    return text + "; fix it there (indentation, a ':' after each key, matching quotes/brackets)"


def load_yaml(path: Path) -> object:
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ConfigError(yaml_error_line(path, err)) from None


def run(args: argparse.Namespace) -> int:
    config = load_yaml(args.configfile)
    if not isinstance(config, dict):
        raise ConfigError(f"{args.configfile}: expected a mapping of config keys (see config/)")
    # the schema and the pipeline's own checks, as the Snakefile runs them (and `plan`)
    from transformer_nmt.cli.plan import load_pipeline

    pipeline = load_pipeline(args.configfile)
    names = pipeline.experiments()
    print(f"{args.configfile}: valid ({len(names)} experiment(s): {', '.join(names)})")
    return 0
