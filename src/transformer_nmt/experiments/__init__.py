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


def load_pipeline(configfile: Path) -> Pipeline:
    """The config file's ``Pipeline``, validated as the Snakefile validates it."""
    try:
        config = yaml.safe_load(configfile.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{configfile}: cannot read ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{configfile}: not valid YAML ({err})".replace("\n", " ")) from None
    return validated_pipeline(config, str(configfile))


__all__ = ["SCHEMA", "Pipeline", "load_pipeline", "validated_pipeline"]
