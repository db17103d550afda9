"""What the Snakefile needs from the config and the dataset registry: file names and params.

Only lookups live here (no computation): the rules stay thin shell calls into the package CLI.
Cross-checks that a JSON schema cannot express (an experiment naming a dataset pair with no
``data:`` block, a test set the registry does not have) raise ``ConfigError`` naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from transformer_nmt.errors import ConfigError


def _json(value: Any) -> str:
    """Canonical JSON: equal values give equal strings, so params compare exactly."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Pipeline:
    """The experiments of a (validated) config, resolved against the dataset registry."""

    def __init__(self, config: dict[str, Any], repo: str | Path) -> None:
        self.config = config
        registry = config.get("registry") or str(Path(repo) / "config" / "datasets.yaml")
        self.registry_path = str(Path(registry).resolve())
        try:
            with open(self.registry_path, encoding="utf-8") as handle:
                self.registry: dict[str, Any] = yaml.safe_load(handle) or {}
        except OSError as err:
            raise ConfigError(f"registry: cannot read {self.registry_path} ({err})") from err
        self._check()

    # -- validation beyond the schema ---------------------------------------------------------

    def _check(self) -> None:
        for dataset, pairs in self.config["data"].items():
            for pair in pairs:
                self._registry_pair(dataset, pair, f"data.{dataset}.{pair}")
        for name, exp in self.config["experiments"].items():
            key = f"experiments.{name}"
            dataset, pair = exp["dataset"], exp["pair"]
            splits = self._registry_pair(dataset, pair, key)["splits"]
            if pair not in self.config["data"].get(dataset, {}):
                raise ConfigError(
                    f"{key}: no data settings for {dataset} {pair}: "
                    f"add data.{dataset}.{pair} (vocab_size, spm_sample_sentences, spm_seed, "
                    "clean)"
                )
            for split in ("train", "valid"):
                if split not in splits:
                    raise ConfigError(f"{key}: {dataset} {pair} has no '{split}' split")
            keep = exp["train"].get("keep_checkpoints")
            if keep is not None and keep < exp["average_last_k"]:
                raise ConfigError(
                    f"{key}.average_last_k: averages {exp['average_last_k']} checkpoints but "
                    f"{key}.train.keep_checkpoints keeps only {keep}"
                )
            tests = self.registry[dataset].get("test_splits", [])
            for test_set in exp["test_sets"]:
                if test_set not in tests:
                    raise ConfigError(
                        f"{key}.test_sets: '{test_set}' is not a test set of {dataset} "
                        f"(registry {self.registry_path}: {', '.join(tests)})"
                    )

    def _registry_pair(self, dataset: str, pair: str, key: str) -> dict[str, Any]:
        if dataset not in self.registry:
            known = ", ".join(sorted(self.registry))
            raise ConfigError(
                f"{key}: unknown dataset '{dataset}' (registry {self.registry_path}: {known})"
            )
        pairs = self.registry[dataset].get("pairs", {})
        if pair not in pairs:
            raise ConfigError(
                f"{key}: dataset '{dataset}' has no pair '{pair}' (has: {', '.join(pairs)})"
            )
        return pairs[pair]

    # -- config lookups ----------------------------------------------------------------------

    json = staticmethod(_json)

    def exp(self, name: str) -> dict[str, Any]:
        return self.config["experiments"][name]

    def experiments(self) -> list[str]:
        return sorted(self.config["experiments"])

    def data_pairs(self) -> list[tuple[str, str]]:
        """Dataset pairs that some experiment uses (others in ``data:`` are not built)."""
        return sorted({(e["dataset"], e["pair"]) for e in self.config["experiments"].values()})

    def datasets(self) -> list[str]:
        return sorted({dataset for dataset, _ in self.data_pairs()})

    def data_settings(self, dataset: str, pair: str) -> dict[str, Any]:
        return self.config["data"][dataset][pair]

    def langs(self, name: str) -> tuple[str, str]:
        src, tgt = self.exp(name)["pair"].split("-")
        return src, tgt

    def model_spec(self, name: str) -> dict[str, Any]:
        exp = self.exp(name)
        return {"preset": exp["preset"], "overrides": exp["model_overrides"]}

    def train_resource(self, name: str, key: str, default: int) -> int:
        return int(self.exp(name).get("resources", {}).get(key, default))

    def tracking_flags(self, name: str) -> str:
        """One MLflow experiment per dataset pair, one run per pipeline experiment."""
        exp = self.exp(name)
        return f"--mlflow-experiment {exp['dataset']}_{exp['pair']} --mlflow-run {name}"

    def mirror(self) -> str | None:
        """``data_mirror`` as an absolute path (None = download from the URLs)."""
        mirror = self.config.get("data_mirror")
        return str(Path(mirror).resolve()) if mirror else None

    def report_experiments(self) -> dict[str, dict[str, str]]:
        return {
            name: {"dataset": e["dataset"], "pair": e["pair"], "preset": e["preset"]}
            for name, e in self.config["experiments"].items()
        }

    # -- registry lookups --------------------------------------------------------------------

    def raw_files(self, dataset: str) -> list[str]:
        return [f"resources/{dataset}/{name}" for name in self.registry[dataset]["files"]]

    def registry_entry_json(self, dataset: str) -> str:
        """The dataset's files (URLs, sha256): a change re-runs its download."""
        return _json(self.registry[dataset]["files"])

    def registry_pair_json(self, dataset: str, pair: str) -> str:
        """What prepare reads of the registry for one pair: its files, splits and test sets."""
        entry = self.registry[dataset]
        return _json(
            {
                "files": entry["files"],
                "pair": entry["pairs"][pair],
                "test_splits": entry.get("test_splits", []),
            }
        )

    def splits(self, dataset: str, pair: str) -> list[str]:
        return list(self.registry[dataset]["pairs"][pair]["splits"])

    # -- file names (docs/interfaces.md "Data files") ----------------------------------------

    def text_files(self, dataset: str, pair: str) -> list[str]:
        return [
            f"results/data/{dataset}/{pair}/{split}.{lang}"
            for split in self.splits(dataset, pair)
            for lang in pair.split("-")
        ]

    def text_file(self, dataset: str, pair: str, split: str, side: str) -> str:
        lang = pair.split("-")[0 if side == "src" else 1]
        return f"results/data/{dataset}/{pair}/{split}.{lang}"

    def test_file(self, name: str, test_set: str, side: str) -> str:
        exp = self.exp(name)
        return self.text_file(exp["dataset"], exp["pair"], test_set, side)

    def clean_report(self, name: str) -> str:
        exp = self.exp(name)
        return f"results/data/{exp['dataset']}/{exp['pair']}/clean_report.json"

    def spm_model(self, name: str) -> str:
        exp = self.exp(name)
        return f"results/spm/{exp['dataset']}/{exp['pair']}/spm.model"

    def bin_dir(self, name: str) -> str:
        exp = self.exp(name)
        return f"results/bin/{exp['dataset']}/{exp['pair']}"

    def train_bin_files(self, name: str) -> list[str]:
        return [
            f"{self.bin_dir(name)}/{split}.{lang}.{kind}.npy"
            for split in ("train", "valid")
            for lang in self.langs(name)
            for kind in ("tokens", "offsets")
        ]

    def all_scores(self) -> list[str]:
        return [
            f"results/runs/{name}/{test_set}.scores.json"
            for name in self.experiments()
            for test_set in self.exp(name)["test_sets"]
        ]
