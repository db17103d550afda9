"""A pipeline config's experiments: validated, expanded by their studies, resolved against the
dataset registry into the files and params of every Snakemake job.

The Snakefile, ``plan`` and ``check-config`` read a config the same way, through here:
``load_pipeline(configfile)`` (the JSON schema ``SCHEMA`` with ``snakemake.utils.validate``,
then ``Pipeline``). ``paths``: the output path templates; ``studies``: Table 3, seeds,
significance. The schema and the registry are package data, so an installed package (a wheel,
no checkout) plans and checks configs too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from transformer_nmt.errors import ConfigError
from transformer_nmt.experiments.paths import config_error_line
from transformer_nmt.experiments.pipeline import Pipeline

SCHEMA = Path(__file__).with_name("config.schema.yaml")  # also workflow/schemas/ (a link)


def validated_pipeline(config: Any, where: str) -> Pipeline:
    """``config`` checked as the Snakefile checks it (schema, then ``Pipeline``); ConfigError
    as one line starting with ``where`` (the config file)."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    if not isinstance(config, dict):
        raise ConfigError(f"{where}: expected a mapping of config keys")
    try:
        validate(config, str(SCHEMA))
        return Pipeline(config)
    except (WorkflowError, ConfigError) as err:
        raise ConfigError(f"{where}: {config_error_line(err)}") from None


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
    """``path``'s YAML, or a ConfigError naming the file (a syntax error's line and column)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ConfigError(yaml_error_line(path, err)) from None


def load_pipeline(configfile: Path) -> Pipeline:
    """The config file's ``Pipeline``, validated as the Snakefile validates it."""
    return validated_pipeline(load_yaml(configfile), str(configfile))


__all__ = ["SCHEMA", "Pipeline", "load_pipeline", "load_yaml", "validated_pipeline"]
