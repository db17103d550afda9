"""Attention Is All You Need as a pipeline: download → prepare → spm → encode → train → average
→ translate → score → report, for every experiment of the config (README.md, docs/design.md).

    snakemake --cores all                                   # the default CPU demo
    snakemake --cores all --configfile config/experiments/wmt14_en_de_base.yaml

A config given with --configfile replaces config/config.yaml (recipes are complete configs).
"""

import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

min_version("8.0")

REPO = Path(workflow.basedir)
sys.path.insert(0, str(REPO / "workflow" / "lib"))

import pipeline as paths  # noqa: E402  (the output path templates)
from pipeline import Pipeline  # noqa: E402
from transformer_nmt.errors import ConfigError  # noqa: E402

# Deep-merging a recipe into the default config would also run the demo: load the default
# only when no --configfile is given (``--config key=value`` still applies on top).
if not workflow.overwrite_configfiles:

    configfile: str(REPO / "config" / "config.yaml")


try:
    validate(config, "workflow/schemas/config.schema.yaml")
    pipeline = Pipeline(config, REPO)
except (WorkflowError, ConfigError) as err:
    # one line naming the key (validate's own message dumps the schema and the whole config)
    sys.exit(paths.config_error_line(err))
os.environ["TRANSFORMER_NMT_REGISTRY"] = pipeline.registry_path
if pipeline.mirror():
    # The download stage reads the mirror from the environment: where the files come from is
    # not a param, so switching between a mirror and the URLs re-runs nothing (sha256-verified).
    os.environ["TRANSFORMER_NMT_MIRROR"] = pipeline.mirror()

wildcard_constraints:
    dataset=r"[A-Za-z0-9_]+",
    pair=r"[a-z]{2,3}-[a-z]{2,3}",
    split=r"[A-Za-z0-9_-]+",
    lang=r"[a-z]{2,3}",
    experiment=r"[A-Za-z0-9_.-]+",
    test_set=r"[A-Za-z0-9_.-]+",


include: "workflow/rules/data.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/evaluate.smk"


rule all:
    input:
        rules.report.output.report,
        pipeline.all_scores(),
    default_target: True
