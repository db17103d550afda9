"""A config's studies: the paper's Table 3 rows, seeds and the paired bootstrap's comparisons
(docs/interfaces.md, "Studies"), expanded into the runs the pipeline trains.

``Studies.expand(config)``: Table 3 rows first (experiment ``<base>.<row>``: the base with the
row's model overrides), then seeds (run ``<experiment>.seed<s>`` per seed, grouped under the
experiment); then the significance study is checked against the groups. Errors are
``ConfigError`` naming the key.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from transformer_nmt.errors import ConfigError
from transformer_nmt.experiments.paths import TRAIN_SUMMARY
from transformer_nmt.model.config import TABLE3, apply_overrides, get_preset, table3_overrides


@dataclass
class Studies:
    """The runs of a config's experiments after its studies, and how they group."""

    config: dict[str, Any]
    table3_rows: dict[str, str] = field(default_factory=dict)  # row -> experiment (pre-seeds)
    groups: dict[str, list[str]] = field(default_factory=dict)  # experiment -> its runs
    runs: dict[str, Any] = field(default_factory=dict)  # run -> its settings

    @classmethod
    def expand(cls, config: dict[str, Any]) -> Studies:
        studies = cls(config)
        studies.runs = studies._expand_seeds(studies._expand_table3(config["experiments"]))
        return studies

    def run(self, name: str) -> dict[str, Any]:
        return self.runs[name]

    def _expand_table3(self, experiments: dict[str, Any]) -> dict[str, Any]:
        """``table3: {base: E, rows: [A1, ...]}`` adds ``E.A1``, ...: E with the row's model
        overrides on top of its own (``scale: paper``, the default: the paper's values, Table 3;
        ``relative``: the paper's changes scaled to E's sizes, ``model.config.table3_overrides``),
        everything else (data, ``train`` budget, search) E's; seeds E's, or the row's own in
        ``table3.seeds: {<row or base>: [s, ...]}``."""
        study = self.config.get("table3")
        if not study:
            return dict(experiments)
        base = study["base"]
        if base not in experiments:
            known = ", ".join(sorted(experiments))
            raise ConfigError(f"table3.base: '{base}' is not an experiment (experiments: {known})")
        expanded = dict(experiments)
        self.table3_rows["base"] = base
        base_exp = experiments[base]
        base_model = apply_overrides(get_preset(base_exp["preset"]), base_exp["model_overrides"])
        row_seeds = dict(study.get("seeds", {}))
        unknown = sorted(set(row_seeds) - set(study["rows"]) - {"base"})
        if unknown:
            raise ConfigError(f"table3.seeds: {unknown} are not rows of table3.rows")
        if "base" in row_seeds:
            expanded[base] = {**base_exp, "seeds": row_seeds["base"]}
        for row_name in study["rows"]:
            if row_name not in TABLE3 or row_name == "base":
                known = ", ".join(r for r in TABLE3 if r != "base")
                raise ConfigError(f"table3.rows: unknown Table 3 row '{row_name}' (rows: {known})")
            name = f"{base}.{row_name}"
            if name in experiments:
                raise ConfigError(f"table3.rows: '{name}' is already an experiment of the config")
            exp = copy.deepcopy(experiments[base])
            exp["model_overrides"] = {
                **exp["model_overrides"],
                **table3_overrides(row_name, base_model, study.get("scale", "paper")),
            }
            if row_name in row_seeds:  # seeds where they decide (the report says which rows)
                exp["seeds"] = row_seeds[row_name]
            expanded[name] = exp
            self.table3_rows[row_name] = name
        train = experiments[base]["train"]
        every, steps = train.get("val_every_steps", 1000), train.get("max_steps", 100_000)
        if not train.get("val_beam_bleu_every_steps") or steps % every:
            raise ConfigError(
                f"table3.base: Table 3's dev numbers are the last validation's (beam search, "
                f"§6.2): set experiments.{base}.train.val_beam_bleu_every_steps and make "
                f"max_steps ({steps}) a multiple of val_every_steps ({every})"
            )
        return expanded

    def _expand_seeds(self, experiments: dict[str, Any]) -> dict[str, Any]:
        """``seeds: [1, 2, 3]`` on experiment E: runs ``E.seed1``, ... with ``train.seed`` set
        (one MLflow run each, grouped under a parent run E by the report)."""
        runs: dict[str, Any] = {}
        for name, exp in experiments.items():
            seeds = exp.get("seeds")
            exp = {k: v for k, v in exp.items() if k != "seeds"}
            if seeds is None:
                runs[name] = exp
                self.groups[name] = [name]
                continue
            self.groups[name] = []
            for seed in seeds:
                run = f"{name}.seed{seed}"
                if run in experiments:
                    raise ConfigError(
                        f"experiments.{name}.seeds: '{run}' is already an experiment of the config"
                    )
                runs[run] = {**exp, "train": {**exp["train"], "seed": seed}}
                self.groups[name].append(run)
        return runs

    def check_significance(self) -> None:
        """``significance.baseline`` is an experiment; runs compare seed by seed, so a baseline
        with seeds needs as many as each experiment with seeds on its pair."""
        study = self.config.get("significance")
        if not study:
            return
        baseline = study["baseline"]
        if baseline not in self.groups:
            known = ", ".join(sorted(self.groups))
            raise ConfigError(
                f"significance.baseline: '{baseline}' is not an experiment (experiments: {known})"
            )
        n_base = len(self.groups[baseline])
        for name in self.compared_experiments():
            n = len(self.groups[name])
            if n_base > 1 and n > 1 and n != n_base:
                raise ConfigError(
                    f"significance.baseline: '{baseline}' has {n_base} seeds but '{name}' has "
                    f"{n}: give both the same number of seeds (or one of them none)"
                )

    def compared_experiments(self) -> list[str]:
        """The experiments the paired bootstrap compares with the baseline: those on its pair."""
        study = self.config.get("significance")
        if not study:
            return []
        baseline = self.run(self.groups[study["baseline"]][0])
        return [
            name
            for name, runs in sorted(self.groups.items())
            if name != study["baseline"]
            and (self.run(runs[0])["dataset"], self.run(runs[0])["pair"])
            == (baseline["dataset"], baseline["pair"])
        ]

    def report_studies(self) -> dict[str, Any]:
        """What the report stage needs to know of the studies (``report --studies``)."""
        significance = self.config.get("significance")
        return {
            # experiments with seeds (runs named otherwise than the experiment)
            "groups": {name: runs for name, runs in self.groups.items() if runs != [name]},
            "table3": dict(self.table3_rows) or None,
            "significance": None
            if not significance
            else {
                "baseline": significance["baseline"],
                "resamples": significance.get("resamples", 1000),
                "runs": {
                    name: self.groups[name]
                    for name in [significance["baseline"], *self.compared_experiments()]
                },
            },
        }

    def report_summaries(self) -> list[str]:
        """The train summaries the report's Table 3 section reads (dev perplexity, BLEU)."""
        return [
            TRAIN_SUMMARY.format(experiment=run)
            for name in self.table3_rows.values()
            for run in self.groups[name]
        ]
