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
# This file and every job use the package of this checkout (src/), also in the environments of
# `--use-conda`, which install only the dependencies (environment.yml).
SRC = str(REPO / "src")
sys.path[:0] = [SRC]

from transformer_nmt.errors import ConfigError  # noqa: E402
from transformer_nmt.experiments import SCHEMA, Pipeline  # noqa: E402
from transformer_nmt.experiments import paths  # noqa: E402  (the output path templates)

# Deep-merging a recipe into the default config would also run the demo: load the default
# only when no --configfile is given (``--config key=value`` still applies on top).
if not workflow.overwrite_configfiles:

    configfile: str(REPO / "config" / "config.yaml")


try:
    validate(config, str(SCHEMA))
    pipeline = Pipeline(config)
    pipeline.write_registry()  # with the config's own datasets: the registry the stages read
except (WorkflowError, ConfigError) as err:
    # one line naming the key (validate's own message dumps the schema and the whole config)
    sys.exit(paths.config_error_line(err))
_pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p not in ("", SRC)]
os.environ["PYTHONPATH"] = os.pathsep.join([SRC, *_pythonpath])
# The data stages read the registry and the mirror from the environment: where the files are
# is not a param, so moving the checkout or switching between a mirror and the URLs re-runs
# nothing (downloads are sha256-verified). "" = no mirror (download from the URLs).
os.environ["TRANSFORMER_NMT_REGISTRY"] = pipeline.registry_path
os.environ["TRANSFORMER_NMT_MIRROR"] = pipeline.mirror() or os.environ.get(
    "TRANSFORMER_NMT_MIRROR", ""
)


# MLflow's system metrics (CPU, memory, GPU) during training: not a param (re-runs nothing).
os.environ["MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"] = str(
    bool(config.get("system_metrics", True))
).lower()
# The CPU fast paths (config cpu_fast_paths; transformer_nmt.fast_paths): speed only, not a
# param (switching re-runs nothing).
os.environ["TRANSFORMER_NMT_CPU_FAST_PATHS"] = pipeline.cpu_fast_paths()
# How to re-run this workflow (this command line's configs): each MLflow run's description.
os.environ["TRANSFORMER_NMT_RERUN"] = paths.rerun_command(
    workflow.config_settings.configfiles, workflow.config_settings.config, REPO
)


envvars:
    "PYTHONPATH",
    "TRANSFORMER_NMT_REGISTRY",
    "TRANSFORMER_NMT_MIRROR",
    "TRANSFORMER_NMT_RERUN",
    "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING",
    "TRANSFORMER_NMT_CPU_FAST_PATHS",


# Where the stages track (config tracking_uri, else $MLFLOW_TRACKING_URI), handed to every job,
# also on a cluster, like the mirror: not a param, so switching stores re-runs nothing.
if pipeline.export_tracking_uri():

    envvars:
        "MLFLOW_TRACKING_URI",


# Cheap jobs run in Snakemake's own process, never submitted to a cluster (profiles/slurm).
report: "workflow/report/workflow.rst"


localrules:
    train_config,
    score,
    report,


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
    default_target: True
    input:
        rules.report.output.report,
        pipeline.all_scores(),
        pipeline.all_attention_maps(),
        pipeline.all_registered_models(),


# What the run made, printed after Snakemake's "N of N steps done": each experiment's BLEU per
# test set, the report, the MLflow UI (evaluation/report.py). Snakemake calls no handler on a dry
# run or when nothing is to be done; files a run stopped early (--until) has not made are left out.
onsuccess:
    from snakemake.logging import logger
    from transformer_nmt.evaluation.report import run_summary
    from transformer_nmt.tracking.store import tracking_uri

    summary = run_summary(pipeline.all_scores(), rules.report.output.report, tracking_uri())
    if summary:
        logger.info(summary)
