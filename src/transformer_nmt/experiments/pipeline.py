"""What the Snakefile needs from a config and the dataset registry: file names and params.

Only lookups live here (no computation): the rules stay thin shell calls into the package CLI.
The registry is read once, through ``transformer_nmt.data.registry`` (the same parser and
validation as the stages use), with the config's own datasets (``datasets:``,
``transformer_nmt.data.local``) merged in, and a pair the config leaves out filled in
(``experiments.pairs``). The studies (Table 3 rows, seeds, significance) are
``experiments.studies``'s; the path templates ``experiments.paths``'s; the cross-checks that a
JSON schema cannot express ``experiments.checks``'s (a ``ConfigError`` naming the key).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from transformer_nmt import fast_paths
from transformer_nmt.data.local import CONFIG_KEY as LOCAL_DATASETS_KEY
from transformer_nmt.data.local import merged_registry
from transformer_nmt.data.registry import DEFAULT_REGISTRY, Dataset, parse_registry, read_registry
from transformer_nmt.experiments.checks import check_experiments
from transformer_nmt.experiments.pairs import with_pairs
from transformer_nmt.experiments.paths import (
    ALPHA_SELECTION,
    ATTENTION_MAP,
    ATTENTION_MAP_CSV,
    BIN_DIR,
    CLEAN_REPORT,
    MERGED_REGISTRY,
    MLFLOW_MODEL,
    OFFSETS,
    RAW_DIR,
    RUN_DIR,
    SCORES,
    SPM_MODEL,
    TEXT_FILE,
    TOKENS,
    TRAIN_CONFIG,
    canonical_json,
)  # fmt: skip
from transformer_nmt.experiments.studies import Studies
from transformer_nmt.io_utils import atomic_open
from transformer_nmt.tracking.store import check_uri


class _Field(str):
    """A value of ``TRAIN_COMMAND``: ``{field:q}`` quotes it for the shell, as Snakemake does."""

    def __format__(self, spec: str) -> str:
        return shlex.quote(self) if spec == "q" else super().__format__(spec)


class Pipeline:
    """The experiments of a (validated) config, resolved against the dataset registry."""

    # The train stage's command line, the one place that composes its flags: the Snakefile's
    # train rule runs it (Snakemake fills in the fields from the rule's params and inputs) and
    # ``train_command`` fills them in alike for a run outside Snakemake (the benchmarks). Its text
    # is part of the rule's shell command: changed, Snakemake reruns every finished training.
    TRAIN_COMMAND = (
        "python -m transformer_nmt train"
        " --bin-dir {params.bin_dir:q} --spm-model {input.spm:q} --src {params.src}"
        " --tgt {params.tgt} --run-dir {params.run_dir:q} --config-file {input.config:q}"
        " --clean-report {input.clean_report:q} {params.tracking}"
    )

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        # the registry: the config's `registry`, else the package's (config/datasets.yaml)
        self.registry_path = str(Path(config.get("registry") or DEFAULT_REGISTRY).resolve())
        # a user's own corpora (data/local.py): relative paths from where snakemake runs
        self._registry_raw = merged_registry(
            read_registry(self.registry_path), config.get(LOCAL_DATASETS_KEY), Path.cwd()
        )
        self.registry: dict[str, Dataset] = parse_registry(self._registry_raw, self.registry_path)
        if config.get(LOCAL_DATASETS_KEY):
            self.registry_path = str(Path(MERGED_REGISTRY).resolve())
        # a pair left out where the dataset has one (experiments/pairs.py): the config in full
        self.config = config = with_pairs(config, self.registry, self.registry_path)
        # studies: Table 3 rows, then seeds, expand the config's experiments into the runs
        self.studies = Studies.expand(config)
        self.table3_rows = self.studies.table3_rows  # Table 3 row -> experiment (before seeds)
        self.groups = self.studies.groups  # experiment -> its runs (one per seed)
        self._experiments = self.studies.runs
        check_experiments(self.config, self._experiments, self.registry, self.registry_path)
        self.studies.check_significance()
        self.cpu_fast_paths()  # an unknown fast path: a ConfigError now, not in every job
        if self.tracking_uri():  # no password in it: it would reach the jobs' records and logs
            source = "tracking_uri" if config.get("tracking_uri") else "MLFLOW_TRACKING_URI"
            check_uri(self.tracking_uri(), source)

    def compared_experiments(self) -> list[str]:
        """The experiments the paired bootstrap compares with the baseline: those on its pair."""
        return self.studies.compared_experiments()

    def report_studies(self) -> dict[str, Any]:
        """What the report stage needs to know of the studies (``report --studies``)."""
        return self.studies.report_studies()

    def report_summaries(self) -> list[str]:
        """The train summaries the report's Table 3 section reads (dev perplexity, BLEU)."""
        return self.studies.report_summaries()

    # -- config lookups ----------------------------------------------------------------------

    def experiment(self, name: str) -> dict[str, Any]:
        """A run's settings: a config experiment, a Table 3 row or one seed of them."""
        return self._experiments[name]

    def experiments(self) -> list[str]:
        return sorted(self._experiments)

    def data_pairs(self) -> list[tuple[str, str]]:
        """Dataset pairs that some experiment uses (others in ``data:`` are not built)."""
        return sorted({(e["dataset"], e["pair"]) for e in self._experiments.values()})

    def datasets(self, downloaded: bool | None = None) -> list[str]:
        """The datasets some experiment uses; ``downloaded``: only the registry's (True) or
        only the config's own local ones (False)."""
        used = {dataset for dataset, _ in self.data_pairs()}
        if downloaded is not None:
            used = {d for d in used if self.registry[d].local != downloaded}
        return sorted(used)

    def data_settings(self, dataset: str, pair: str) -> dict[str, Any]:
        return self.config["data"][dataset][pair]

    # A new option of a stage rides on the value of a param the rule already has, and changes
    # it only when set: Snakemake reruns a job whose shell command template or param values
    # changed, so a new flag of its own would rerun every finished run of an earlier version.

    def lowercase(self, dataset: str, pair: str) -> bool:
        """The pair's data setting ``lowercase``: its vocabulary lowercases every text it
        encodes (``data/spm.py``), and its scores are case-insensitive."""
        return bool(self.data_settings(dataset, pair).get("lowercase", False))

    def spm_seed_and_flags(self, dataset: str, pair: str) -> int | str:
        """spm-train's ``--seed`` value: the seed, followed by ``--lowercase`` where the
        pair's vocabulary lowercases."""
        seed = int(self.data_settings(dataset, pair)["spm_seed"])
        return f"{seed} --lowercase" if self.lowercase(dataset, pair) else seed

    def score_language_and_flags(self, name: str) -> str:
        """score's ``--tgt-lang`` value: the target language, followed by ``--lowercase``
        (case-insensitive scores) where the experiment's vocabulary lowercases; the dev-set
        choices read that from the vocabulary itself."""
        exp, tgt = self.experiment(name), self.langs(name)[1]
        return f"{tgt} --lowercase" if self.lowercase(exp["dataset"], exp["pair"]) else tgt

    def langs(self, name: str) -> tuple[str, str]:
        src, tgt = self.experiment(name)["pair"].split("-")
        return src, tgt

    def train_config(self, name: str) -> dict[str, Any]:
        """What ``train --config-file`` reads: the model spec and the ``train:`` keys."""
        exp = self.experiment(name)
        model = {"preset": exp["preset"], "overrides": exp["model_overrides"]}
        return {"model": model, "train": exp["train"]}

    def train_command(
        self,
        name: str,
        run_dir: str | None = None,
        config_file: str | None = None,
        tracking: bool = True,
    ) -> list[str]:
        """The train rule's command line for ``name`` as words (``TRAIN_COMMAND``, filled in as
        Snakemake fills it in): in ``run_dir`` from the settings in ``config_file`` (default:
        the pipeline's own, ``RUN_DIR`` and ``TRAIN_CONFIG``), the data files relative to the
        DAG's working directory; ``tracking=False`` leaves MLflow out."""
        run_dir = run_dir or RUN_DIR.format(experiment=name)
        src, tgt = (_Field(lang) for lang in self.langs(name))
        params = SimpleNamespace(
            bin_dir=_Field(self.bin_dir(name)), src=src, tgt=tgt, run_dir=_Field(run_dir),
            tracking=_Field(self.tracking_flags(name, run_dir) if tracking else ""),
        )  # fmt: skip
        inputs = SimpleNamespace(
            spm=_Field(self.spm_model(name)),
            clean_report=_Field(self.clean_report(name)),
            config=_Field(config_file or TRAIN_CONFIG.format(experiment=name)),
        )
        return shlex.split(self.TRAIN_COMMAND.format(params=params, input=inputs))

    def train_resource(self, name: str, key: str, default: int) -> int:
        return int(self.experiment(name).get("resources", {}).get(key, default))

    def average_inputs(self, name: str) -> dict[str, str]:
        """``average_last_k: auto`` scores averages on the dev set: the files it reads."""
        if self.experiment(name)["average_last_k"] != "auto":
            return {}
        return {
            "spm": self.spm_model(name),
            "dev_src": self.test_file(name, "valid", "src"),
            "dev_ref": self.test_file(name, "valid", "tgt"),
        }

    def average_flags(self, name: str) -> str:
        """``--last K``, or ``--last auto`` with the dev files and the experiment's search."""
        last_k = self.experiment(name)["average_last_k"]
        if last_k != "auto":
            return f"--last {last_k}"
        files = self.average_inputs(name)
        return (
            f"--last auto --spm-model {files['spm']} --dev-src {files['dev_src']}"
            f" --dev-ref {files['dev_ref']} --tgt-lang {self.langs(name)[1]}"
            f" {self.search_flags(name, chosen_alpha=False)}"
        )

    def tracking_flags(self, name: str, run_dir: str | None = None) -> str:
        """One MLflow experiment per dataset pair, one run per pipeline experiment; its run
        directory (default: the pipeline's) identifies the run (two checkouts on one store: two
        runs)."""
        exp = self.experiment(name)
        run_dir = run_dir or RUN_DIR.format(experiment=name)
        return (
            f"--mlflow-experiment {exp['dataset']}_{exp['pair']} --mlflow-run {name}"
            f" --mlflow-run-dir {run_dir}"
        )

    def cpu_fast_paths(self) -> str:
        """The config's ``cpu_fast_paths`` as the jobs' switch (``fast_paths``: on, off or a
        list); a ConfigError names an unknown path."""
        return fast_paths.switch_text(self.config.get("cpu_fast_paths", True))

    def tracking_uri(self) -> str | None:
        """``tracking_uri``, else ``$MLFLOW_TRACKING_URI``; None: the stages' own default (the
        SQLite store ``mlflow.db`` in their working directory)."""
        return self.config.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or None

    def export_tracking_uri(self) -> bool:
        """Put ``tracking_uri()`` into this process's ``$MLFLOW_TRACKING_URI``, which every job
        inherits (the Snakefile then declares it in ``envvars`` for cluster jobs); False when
        there is none (the stages' default store)."""
        uri = self.tracking_uri()
        if uri:
            os.environ["MLFLOW_TRACKING_URI"] = uri
        return uri is not None

    def mirror(self) -> str | None:
        """``data_mirror`` as an absolute path (None = download from the URLs)."""
        mirror = self.config.get("data_mirror")
        return str(Path(mirror).resolve()) if mirror else None

    def report_experiments(self) -> dict[str, dict[str, str]]:
        return {
            name: {
                "dataset": e["dataset"], "pair": e["pair"], "preset": e["preset"],
                "alpha": e["translate"]["alpha"],
            }
            for name, e in self._experiments.items()
        }  # fmt: skip

    # -- registry lookups --------------------------------------------------------------------

    def write_registry(self) -> None:
        """With datasets of the config's own: write the merged registry the stages read
        (``registry_path``), unless it holds that already."""
        if not self.config.get(LOCAL_DATASETS_KEY):
            return
        import yaml

        text = yaml.safe_dump(self._registry_raw, sort_keys=True, allow_unicode=True)
        path = Path(self.registry_path)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path) as handle:
            handle.write(text)

    def local_files(self, dataset: str) -> list[str]:
        """A local dataset's own files (inputs of its download job: an edited file re-links)."""
        return [spec.path for spec in self.registry[dataset].files.values() if spec.path]

    def download_clean_json(self, dataset: str) -> str:
        """A local dataset's cleaning rules (its one pair's), for its download stage's checks."""
        (pair,) = self.registry[dataset].pairs
        return canonical_json(self.config["data"].get(dataset, {}).get(pair, {}).get("clean", {}))

    def raw_files(self, dataset: str) -> list[str]:
        raw_dir = RAW_DIR.format(dataset=dataset)
        return [f"{raw_dir}/{name}" for name in self.registry[dataset].files]

    def registry_entry_json(self, dataset: str) -> str:
        """The dataset's files (URLs, sha256): a change re-runs its download."""
        files = self.registry[dataset].files
        return canonical_json({name: spec.to_dict() for name, spec in files.items()})

    def registry_pair_json(self, dataset: str, pair: str) -> str:
        """What prepare reads of the registry for one pair: its files, splits and test sets."""
        entry = self.registry[dataset]
        return canonical_json(
            {
                "files": {name: spec.to_dict() for name, spec in entry.files.items()},
                "pair": entry.pairs[pair].to_dict(),
                "test_splits": entry.test_splits,
            }
        )

    def splits(self, dataset: str, pair: str) -> list[str]:
        return self.registry[dataset].pairs[pair].split_names()

    # -- file names --------------------------------------------------------------------------

    def text_files(self, dataset: str, pair: str) -> list[str]:
        return [
            TEXT_FILE.format(dataset=dataset, pair=pair, split=split, lang=lang)
            for split in self.splits(dataset, pair)
            for lang in pair.split("-")
        ]

    def text_file(self, dataset: str, pair: str, split: str, side: str) -> str:
        lang = pair.split("-")[0 if side == "src" else 1]
        return TEXT_FILE.format(dataset=dataset, pair=pair, split=split, lang=lang)

    def test_file(self, name: str, test_set: str, side: str) -> str:
        exp = self.experiment(name)
        return self.text_file(exp["dataset"], exp["pair"], test_set, side)

    def _pair_path(self, template: str, name: str) -> str:
        exp = self.experiment(name)
        return template.format(dataset=exp["dataset"], pair=exp["pair"])

    def clean_report(self, name: str) -> str:
        return self._pair_path(CLEAN_REPORT, name)

    def spm_model(self, name: str) -> str:
        return self._pair_path(SPM_MODEL, name)

    def bin_dir(self, name: str) -> str:
        return self._pair_path(BIN_DIR, name)

    def train_bin_files(self, name: str) -> list[str]:
        exp = self.experiment(name)
        return [
            template.format(dataset=exp["dataset"], pair=exp["pair"], split=split, lang=lang)
            for split in ("train", "valid")
            for lang in self.langs(name)
            for template in (TOKENS, OFFSETS)
        ]

    def alpha_inputs(self, name: str) -> dict[str, str]:
        """``translate.alpha: auto``: the α chosen on the dev set (``select_alpha``'s file),
        an input of every stage that decodes with the experiment's search."""
        if self.experiment(name)["translate"]["alpha"] != "auto":
            return {}
        return {"alpha": ALPHA_SELECTION.format(experiment=name)}

    def search_flags(self, name: str, *, chosen_alpha: bool = True) -> str:
        """The experiment's §6.1 search settings as the stages' flags. ``alpha: auto``:
        ``--alpha-from`` the dev set's choice, or with ``chosen_alpha=False`` (the searches that
        run before it is chosen: ``average --last auto``, ``select-alpha``) the CLI's default,
        the paper's α."""
        search = self.experiment(name)["translate"]
        alpha = f" --alpha {search['alpha']}"
        if search["alpha"] == "auto":
            # no --alpha: the CLI's default, the paper's (SearchSettings)
            alpha = f" --alpha-from {self.alpha_inputs(name)['alpha']}" if chosen_alpha else ""
        flags = (
            f"--beam {search['beam']}{alpha}"
            f" --max-len-b {search['max_len_b']} --max-tokens {search['max_tokens']}"
        )
        # only when set: an unchanged command line does not re-run existing translations
        if search.get("early_stop", "exact") != "exact":
            flags += f" --early-stop {search['early_stop']}"
        return flags

    def quantize_flags(self, name: str) -> str:
        """The decoding weights' quantisation (``translate.quantize``), when set."""
        quantize = self.experiment(name)["translate"].get("quantize", "none")
        return f"--quantize {quantize}" if quantize != "none" else ""

    def translate_flags(self, name: str) -> str:
        """The translate stage's flags: the search's, and the weights' quantisation when set."""
        return f"{self.search_flags(name)} {self.quantize_flags(name)}".rstrip()

    def select_alpha_flags(self, name: str) -> str:
        """``select-alpha``: the dev files, the α to try, and the translate stage's search and
        quantisation (its α aside)."""
        search = self.experiment(name)["translate"]
        candidates = search.get("alpha_candidates")
        flags = (
            f"--dev-src {self.test_file(name, 'valid', 'src')}"
            f" --dev-ref {self.test_file(name, 'valid', 'tgt')} --tgt-lang {self.langs(name)[1]}"
            f" {self.search_flags(name, chosen_alpha=False)} {self.quantize_flags(name)}"
        ).rstrip()
        if candidates:
            flags += " --candidates " + " ".join(f"{float(a):g}" for a in candidates)
        return flags

    def attention_map_lines(self) -> list[int]:
        """Lines 1..N (``attention_map_sentences``, default 3) of each experiment's first test
        set get an attention map."""
        return list(range(1, int(self.config.get("attention_map_sentences", 3)) + 1))

    def attention_map_source(self, name: str) -> str:
        return self.test_file(name, self.experiment(name)["test_sets"][0], "src")

    def all_attention_maps(self) -> list[str]:
        return [
            template.format(experiment=name, line=line)
            for name in self.experiments()
            for line in self.attention_map_lines()
            for template in (ATTENTION_MAP, ATTENTION_MAP_CSV)
        ]

    def all_registered_models(self) -> list[str]:
        """Every experiment's registered MLflow model, unless the config says ``register:
        false``."""
        if not self.config.get("register", True):
            return []
        return [MLFLOW_MODEL.format(experiment=name) for name in self.experiments()]

    def all_scores(self) -> list[str]:
        return [
            SCORES.format(experiment=name, test_set=test_set)
            for name in self.experiments()
            for test_set in self.experiment(name)["test_sets"]
        ]
