"""``check-config``: is a pipeline config file valid? Names the file, line and column of a YAML
syntax error (Snakemake says only "Config file is not valid JSON or YAML"), then checks the
config as the Snakefile does (``experiments.validated_pipeline``), naming the key. The
config's own datasets (``datasets:``, ``data/local.py``) are then read once, as their first
stage reads them: unequal line counts, TSV lines without one tab, empty or undecodable lines,
too few pairs to carve, test pairs in training (``test_overlap: error``), each named."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from transformer_nmt.errors import DataError
from transformer_nmt.experiments import load_yaml, validated_pipeline


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configfile", type=Path, help="a config given to snakemake --configfile")


def run(args: argparse.Namespace) -> int:
    config = load_yaml(args.configfile)
    # the schema and the pipeline's own checks, as the Snakefile runs them (and `plan`)
    pipeline = validated_pipeline(config, str(args.configfile))
    for dataset in pipeline.datasets(downloaded=False):
        check_local_dataset(pipeline, dataset, args.configfile)
    names = pipeline.experiments()
    print(f"{args.configfile}: valid ({len(names)} experiment(s): {', '.join(names)})")
    return 0


def check_local_dataset(pipeline: Any, name: str, configfile: Path) -> None:
    """Link a local dataset's files into a temporary directory and check each pair as its
    download stage does; a bad input is a DataError naming the config file and the input."""
    from transformer_nmt.data.clean import CleanConfig
    from transformer_nmt.data.download import link_local_file
    from transformer_nmt.data.local import check_pair

    dataset = pipeline.registry[name]
    with tempfile.TemporaryDirectory(prefix="check-config.") as tmp:
        try:
            for spec in dataset.files.values():
                link_local_file(spec, name, Path(tmp))
            for pair in dataset.pairs:
                rules = CleanConfig.from_dict(
                    pipeline.data_settings(name, pair)["clean"], f"data.{name}.{pair}.clean"
                )
                summary = check_pair(dataset, pair, tmp, rules)
                counts = ", ".join(f"{k} {v}" for k, v in summary["splits"].items())
                carved = ", ".join(f"{k} {v}" for k, v in dataset.pair(pair).carve.items())
                print(
                    f"{name} {pair}: pairs read: {counts}"
                    + (f"; carved from train: {carved}" if carved else "")
                )
        except DataError as err:
            raise DataError(f"{configfile}: datasets.{name}: {err}") from None
