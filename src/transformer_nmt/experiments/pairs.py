"""The language pair, named once: where a dataset has one pair (every dataset of ``datasets:``
has; a registry dataset may have several, as Multi30k has en-de and en-fr), an experiment
without ``pair`` trains on it, and ``data.<dataset>`` may hold the pair's settings directly.

``with_pairs`` writes a config out in full, ``experiments.<name>.pair`` and
``data.<dataset>.<pair>``, the form every other reader of a config takes (``Pipeline``).
"""

from __future__ import annotations

import re
from typing import Any

from transformer_nmt.data.registry import Dataset
from transformer_nmt.errors import ConfigError
from transformer_nmt.experiments.checks import known_dataset

PAIR = re.compile(r"[a-z]{2,3}-[a-z]{2,3}")  # the schema's $defs.pair


def with_pairs(
    config: dict[str, Any], registry: dict[str, Dataset], registry_path: str
) -> dict[str, Any]:
    """``config`` with each experiment's ``pair`` and each dataset's data settings keyed by
    pair: the dataset's one pair where the config leaves it out."""
    data = {
        dataset: (
            settings
            if all(PAIR.fullmatch(key) for key in settings)
            else {the_pair(registry, registry_path, dataset, f"data.{dataset}"): settings}
        )
        for dataset, settings in config["data"].items()
    }
    experiments = {
        name: exp if "pair" in exp else {
            **exp,
            "pair": the_pair(registry, registry_path, exp["dataset"], f"experiments.{name}"),
        }
        for name, exp in config["experiments"].items()
    }  # fmt: skip
    return {**config, "data": data, "experiments": experiments}


def the_pair(registry: dict[str, Dataset], registry_path: str, dataset: str, key: str) -> str:
    """The one language pair of ``dataset``; a dataset of several is an error naming ``key``
    and how to name one."""
    pairs = list(known_dataset(registry, registry_path, dataset, key).pairs)
    if len(pairs) == 1:
        return pairs[0]
    example = f"{key}.pair: {pairs[0]}"
    if key.startswith("data."):
        example = f"{key}.{pairs[0]}: {{vocab_size: ...}}"
    raise ConfigError(
        f"{key}: dataset '{dataset}' has the pairs {', '.join(pairs)}: name one ({example})"
    )
