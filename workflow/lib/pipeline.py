"""What the Snakefile needs from the config and the dataset registry: file names and params.

Only lookups live here (no computation): the rules stay thin shell calls into the package CLI.
The registry is read once, through ``transformer_nmt.data.registry`` (the same parser and
validation as the stages use). Cross-checks that a JSON schema cannot express (an experiment
naming a dataset pair with no ``data:`` block, a test set the registry does not have) raise
``ConfigError`` naming the key.

Every output path of the pipeline is one template below (docs/interfaces.md "Data files");
rules use them as their output patterns and the methods fill them in.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema

from transformer_nmt.data.local import CONFIG_KEY as LOCAL_DATASETS_KEY
from transformer_nmt.data.local import merged_registry
from transformer_nmt.data.registry import Dataset, parse_registry, read_registry
from transformer_nmt.errors import ConfigError
from transformer_nmt.io_utils import write_json
from transformer_nmt.model.config import TABLE3
from transformer_nmt.runs import layout as run_files
from transformer_nmt.tracking.store import check_uri

# --- output path templates (Snakemake wildcards in braces) ------------------------------------
RAW_DIR = "resources/{dataset}"
# the registry plus the config's own datasets (``datasets:``), what the stages read
MERGED_REGISTRY = "results/datasets.yaml"
CHECKSUM_LOCK = RAW_DIR + "/checksums.lock.json"  # sha256 pinned by the first download
TEXT_DIR = "results/data/{dataset}/{pair}"
TEXT_FILE = TEXT_DIR + "/{split}.{lang}"
CLEAN_REPORT = TEXT_DIR + "/clean_report.json"
SPM_PREFIX = "results/spm/{dataset}/{pair}/spm"
SPM_MODEL = SPM_PREFIX + ".model"
SPM_VOCAB = SPM_PREFIX + ".vocab"
BIN_DIR = "results/bin/{dataset}/{pair}"
TOKENS = BIN_DIR + "/{split}.{lang}.tokens.npy"
OFFSETS = BIN_DIR + "/{split}.{lang}.offsets.npy"
RUN_DIR = "results/runs/{experiment}"  # its files: transformer_nmt.runs.layout
TRAIN_CONFIG = f"{RUN_DIR}/{run_files.TRAIN_CONFIG_FILE}"
TRAIN_SUMMARY = f"{RUN_DIR}/{run_files.SUMMARY_FILE}"
CHECKPOINT_DIR = f"{RUN_DIR}/{run_files.CHECKPOINT_DIR}"
AVERAGED_MODEL = f"{RUN_DIR}/{run_files.AVERAGED_MODEL}"
MLFLOW_MODEL = f"{RUN_DIR}/{run_files.MLFLOW_MODEL_FILE}"  # the registered MLflow model's URIs
ALPHA_SELECTION = f"{RUN_DIR}/{run_files.ALPHA_SELECTION_FILE}"  # translate.alpha: auto
HYPOTHESES = RUN_DIR + "/{test_set}.hyp"
SCORES = RUN_DIR + "/{test_set}.scores.json"
RUN_FIGURES_DIR = (
    f"{RUN_DIR}/{run_files.FIGURES_DIR}"  # every PNG here is a figure of the run (report, MLflow)
)
ATTENTION_MAP = RUN_FIGURES_DIR + "/attention_{line}.png"  # line: 1-based line of the test set
ATTENTION_MAP_CSV = RUN_FIGURES_DIR + "/attention_{line}.csv"  # the figure's numbers
REPORT = "results/report.md"
REPORT_TABLE = "results/report_table.csv"  # the report's results table (the report's landing page)
FIGURES_DIR = "results/figures"  # the report's figures: runs/{experiment}/, pairs/{D}_{P}/


def canonical_json(value: Any) -> str:
    """Canonical JSON: equal values give equal strings, so params compare exactly."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def config_error_line(err: Exception) -> str:
    """One line naming the config key at fault, for a ``ConfigError`` or a failed
    ``snakemake.utils.validate`` (a WorkflowError raised while handling the jsonschema error)."""
    causes = (*err.args, err.__cause__, err.__context__)
    error = next((c for c in causes if isinstance(c, jsonschema.ValidationError)), None)
    if error is None:
        return f"config: {err}"
    path = ".".join(str(part) for part in error.absolute_path)
    where = f"{path}: " if path else ""
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(known))
        names = ", ".join(f"'{key}'" for key in unknown)
        noun = "key" if len(unknown) == 1 else "keys"
        return f"config: {where}unknown {noun} {names} (known: {', '.join(known)})"
    return f"config: {where}{error.message}"


def rerun_command(configfiles: list[Any], overrides: Mapping[str, Any], repo: str | Path) -> str:
    """The ``snakemake`` command line that re-runs this workflow from a checkout of ``repo``:
    its ``--configfile``s (relative to the checkout when inside it) and ``--config`` values.
    Every job gets it as ``$TRANSFORMER_NMT_RERUN``: MLflow runs show it as their description
    (``transformer_nmt.tracking.stage``)."""
    words = ["snakemake", "--cores", "all"]
    for path in configfiles:
        path = Path(path).absolute()
        if path.is_relative_to(Path(repo).absolute()):
            path = path.relative_to(Path(repo).absolute())
        words += ["--configfile", str(path)]
    if overrides:
        words.append("--config")
        for key, value in overrides.items():
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            words.append(f"{key}={text}")
    return shlex.join(words)


def write_train_config(path: str, settings_json: str, log: str) -> None:
    """The ``train_config`` rule: an experiment's settings (``Pipeline.train_config``, as
    canonical JSON) to the file that ``train --config-file`` reads."""
    write_json(path, json.loads(settings_json))
    Path(log).write_text(f"wrote {path}\n", encoding="utf-8")


class Pipeline:
    """The experiments of a (validated) config, resolved against the dataset registry."""

    def __init__(self, config: dict[str, Any], repo: str | Path) -> None:
        self.config = config
        registry = config.get("registry") or str(Path(repo) / "config" / "datasets.yaml")
        self.registry_path = str(Path(registry).resolve())
        # a user's own corpora (data/local.py): relative paths from where snakemake runs
        self._registry_raw = merged_registry(
            read_registry(self.registry_path), config.get(LOCAL_DATASETS_KEY), Path.cwd()
        )
        self.registry: dict[str, Dataset] = parse_registry(self._registry_raw, self.registry_path)
        if config.get(LOCAL_DATASETS_KEY):
            self.registry_path = str(Path(MERGED_REGISTRY).resolve())
        # studies: Table 3 rows, then seeds, expand the config's experiments into the runs
        self.table3_rows: dict[str, str] = {}  # Table 3 row -> experiment (before seeds)
        studied = self._expand_table3(config["experiments"])
        self.groups: dict[str, list[str]] = {}  # experiment -> its runs (one per seed)
        self._experiments = self._expand_seeds(studied)
        self._check()
        self._check_significance()
        if self.tracking_uri():  # no password in it: it would reach the jobs' records and logs
            source = "tracking_uri" if config.get("tracking_uri") else "MLFLOW_TRACKING_URI"
            check_uri(self.tracking_uri(), source)

    # -- studies: Table 3 and seeds (docs/interfaces.md, "Studies") -------------------------------

    def _expand_table3(self, experiments: dict[str, Any]) -> dict[str, Any]:
        """``table3: {base: E, rows: [A1, ...]}`` adds ``E.A1``, ...: E with the row's model
        overrides on top of its own (the paper's values, Table 3), everything else (data,
        ``train`` budget, seeds, search) E's."""
        study = self.config.get("table3")
        if not study:
            return dict(experiments)
        base = study["base"]
        if base not in experiments:
            known = ", ".join(sorted(experiments))
            raise ConfigError(f"table3.base: '{base}' is not an experiment (experiments: {known})")
        expanded = dict(experiments)
        self.table3_rows["base"] = base
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
                **TABLE3[row_name].overrides_dict(),
            }
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

    def _check_significance(self) -> None:
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
        baseline = self.experiment(self.groups[study["baseline"]][0])
        return [
            name
            for name, runs in sorted(self.groups.items())
            if name != study["baseline"]
            and (self.experiment(runs[0])["dataset"], self.experiment(runs[0])["pair"])
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

    # -- validation beyond the schema ---------------------------------------------------------

    def _check(self) -> None:
        for dataset, pairs in self.config["data"].items():
            for pair in pairs:
                self._registry_dataset(dataset, pair, f"data.{dataset}.{pair}")
        for name, exp in self._experiments.items():
            key = f"experiments.{name}"
            dataset, pair = exp["dataset"], exp["pair"]
            entry = self._registry_dataset(dataset, pair, key)
            if pair not in self.config["data"].get(dataset, {}):
                raise ConfigError(
                    f"{key}: no data settings for {dataset} {pair}: "
                    f"add data.{dataset}.{pair} (vocab_size, spm_sample_sentences, spm_seed, "
                    "clean)"
                )
            self._check_average(key, exp)
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
                        f"(registry {self.registry_path}: {', '.join(entry.test_splits)})"
                    )

    @staticmethod
    def _check_average(key: str, exp: dict[str, Any]) -> None:
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
        every, max_steps = train.get("checkpoint_every_steps"), train.get("max_steps", 100_000)
        if every and -(-max_steps // every) < last_k:
            written = -(-max_steps // every)
            raise ConfigError(
                f"{key}.average_last_k: averages {last_k} checkpoints but max_steps={max_steps} "
                f"with checkpoint_every_steps={every} writes only {written}: lower "
                f"{key}.train.checkpoint_every_steps to at most {max_steps // last_k}"
            )

    def _registry_dataset(self, dataset: str, pair: str, key: str) -> Dataset:
        """The registry's entry of ``dataset``, which must have ``pair``; errors name ``key``."""
        if dataset not in self.registry:
            known = ", ".join(sorted(self.registry))
            raise ConfigError(
                f"{key}: unknown dataset '{dataset}' (registry {self.registry_path}: {known})"
            )
        entry = self.registry[dataset]
        if pair not in entry.pairs:
            raise ConfigError(
                f"{key}: dataset '{dataset}' has no pair '{pair}' (has: {', '.join(entry.pairs)})"
            )
        return entry

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

    def langs(self, name: str) -> tuple[str, str]:
        src, tgt = self.experiment(name)["pair"].split("-")
        return src, tgt

    def train_config(self, name: str) -> dict[str, Any]:
        """What ``train --config-file`` reads: the model spec and the ``train:`` keys."""
        exp = self.experiment(name)
        model = {"preset": exp["preset"], "overrides": exp["model_overrides"]}
        return {"model": model, "train": exp["train"]}

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

    def tracking_flags(self, name: str) -> str:
        """One MLflow experiment per dataset pair, one run per pipeline experiment; its run
        directory identifies the run (two checkouts on one store: two runs)."""
        exp = self.experiment(name)
        run_dir = RUN_DIR.format(experiment=name)
        return (
            f"--mlflow-experiment {exp['dataset']}_{exp['pair']} --mlflow-run {name}"
            f" --mlflow-run-dir {run_dir}"
        )

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
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)

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
