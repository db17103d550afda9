"""The cross-checks of a config that a JSON schema cannot express: an experiment naming a
dataset or pair the registry lacks, or with no ``data:`` block, a test set the registry does
not have, ``alpha_candidates`` without ``alpha: auto``, an ``average_last_k`` that the run's
checkpoints cannot serve. Each raises a ``ConfigError`` naming the key."""

from __future__ import annotations

from typing import Any

from transformer_nmt.data.registry import Dataset
from transformer_nmt.errors import ConfigError


def check_experiments(
    config: dict[str, Any],
    experiments: dict[str, dict[str, Any]],
    registry: dict[str, Dataset],
    registry_path: str,
) -> None:
    """The cross-checks of a config's ``experiments`` (after the studies' expansion) and
    ``data`` against the ``registry`` read from ``registry_path``."""
    for dataset, pairs in config["data"].items():
        for pair in pairs:
            registry_dataset(registry, registry_path, dataset, pair, f"data.{dataset}.{pair}")
    for name, exp in experiments.items():
        key = f"experiments.{name}"
        dataset, pair = exp["dataset"], exp["pair"]
        entry = registry_dataset(registry, registry_path, dataset, pair, key)
        if pair not in config["data"].get(dataset, {}):
            raise ConfigError(
                f"{key}: no data settings for {dataset} {pair}: "
                f"add data.{dataset}.{pair} (vocab_size, spm_sample_sentences, spm_seed, "
                "clean)"
            )
        check_average(key, exp)
        search = exp["translate"]
        if "alpha_candidates" in search and search["alpha"] != "auto":
            raise ConfigError(
                f"{key}.translate.alpha_candidates: used only with alpha: auto, but alpha "
                f"is {search['alpha']}: set {key}.translate.alpha: auto or drop the key"
            )
        for test_set in exp["test_sets"]:
            if test_set not in entry.test_splits:
                raise ConfigError(
                    f"{key}.test_sets: '{test_set}' is not a test set of {dataset} "
                    f"(registry {registry_path}: {', '.join(entry.test_splits)})"
                )


def check_average(key: str, exp: dict[str, Any]) -> None:
    """Before training: will the run keep the checkpoints that ``average_last_k`` averages?
    (kept = keep_checkpoints, and with step-based checkpoints at most
    ceil(max_steps / checkpoint_every_steps), the one at max_steps included)."""
    last_k, train = exp["average_last_k"], exp["train"]
    if last_k == "auto":
        return
    keep = train.get("keep_checkpoints", 5)
    if keep < last_k:
        raise ConfigError(
            f"{key}.average_last_k: averages {last_k} checkpoints but "
            f"{key}.train.keep_checkpoints keeps only {keep}"
        )
    sizings = [("", train)]  # the run as configured, and as train.by_precision sizes it
    sizings += [
        (f" (by_precision.{precision})", {**train, **values})
        for precision, values in (train.get("by_precision") or {}).items()
    ]
    for sized_as, sized in sizings:
        every, max_steps = sized.get("checkpoint_every_steps"), sized.get("max_steps", 100_000)
        if every and -(-max_steps // every) < last_k:
            written = -(-max_steps // every)
            raise ConfigError(
                f"{key}.average_last_k: averages {last_k} checkpoints but max_steps={max_steps} "
                f"with checkpoint_every_steps={every}{sized_as} writes only {written}: lower "
                f"{key}.train.checkpoint_every_steps to at most {max_steps // last_k}"
            )


def registry_dataset(
    registry: dict[str, Dataset], registry_path: str, dataset: str, pair: str, key: str
) -> Dataset:
    """The registry's entry of ``dataset``, which must have ``pair``; errors name ``key``."""
    entry = known_dataset(registry, registry_path, dataset, key)
    if pair not in entry.pairs:
        raise ConfigError(
            f"{key}: dataset '{dataset}' has no pair '{pair}' (has: {', '.join(entry.pairs)})"
        )
    return entry


def known_dataset(
    registry: dict[str, Dataset], registry_path: str, dataset: str, key: str
) -> Dataset:
    """The registry's entry of ``dataset``; an unknown one is an error naming ``key``."""
    if dataset not in registry:
        known = ", ".join(sorted(registry))
        raise ConfigError(f"{key}: unknown dataset '{dataset}' (registry {registry_path}: {known})")
    return registry[dataset]
