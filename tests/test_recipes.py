"""The paper's recipes and the default config: their values, Snakemake dry runs, config errors."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT, snakemake_command
from transformer_nmt.errors import ConfigError
from transformer_nmt.experiments import Pipeline, paths

# the starter config for a user's own corpus names files the user brings: tests/test_local_data.py
RECIPES = sorted(
    p for p in (REPO_ROOT / "config" / "experiments").glob("*.yaml") if p.stem != "own_data_example"
)
# one experiment each (the Table 3 study expands into many: tests/test_table3.py)
SINGLE = [p for p in RECIPES if not p.stem.startswith("table3_")]
DEFAULT = REPO_ROOT / "config" / "config.yaml"


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _dry_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``snakemake -n -p`` of the repo's Snakefile in an empty working directory (offline)."""
    snakemake = snakemake_command()
    return subprocess.run(
        [*snakemake, "-n", "-p", "--cores", "2", "--snakefile", str(REPO_ROOT / "Snakefile"),
         "--directory", str(tmp_path), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _shell_commands(output: str, stage: str) -> list[str]:
    return [line for line in output.splitlines() if f"python -m transformer_nmt {stage} " in line]


def test_every_paper_recipe_is_present() -> None:
    assert {p.stem for p in RECIPES} == {
        "wmt14_en_de_base", "wmt14_en_de_big", "wmt14_en_fr_base", "wmt14_en_fr_big",
        "multi30k_en_de_base", "multi30k_en_fr_base", "multi30k_en_de_cpu",
        "multi30k_en_de_paper_base", "table3_multi30k", "table3_cpu",
    }  # fmt: skip


@pytest.mark.parametrize("recipe", ["multi30k_en_de_base", "multi30k_en_fr_base"])
def test_multi30k_gpu_recipes_are_the_cpu_recipe_on_a_gpu(recipe: str) -> None:
    """The GPU recipes are the CPU recipe's model, data and search with its bf16 sizing (what was
    measured on a GPU, record cpu_recipe_lc10k_h200); only the machine's keys differ."""
    cpu_config = _load(REPO_ROOT / "config" / "experiments" / "multi30k_en_de_cpu.yaml")
    config = _load(REPO_ROOT / "config" / "experiments" / f"{recipe}.yaml")
    (cpu,) = cpu_config["experiments"].values()
    (exp,) = config["experiments"].values()
    assert (exp["dataset"], exp["preset"]) == ("multi30k", "tiny")
    assert exp["model_overrides"] == cpu["model_overrides"]
    assert config["data"]["multi30k"][exp["pair"]] == cpu_config["data"]["multi30k"]["en-de"]
    for key in ("average_last_k", "translate", "test_sets"):
        assert exp[key] == cpu[key], key
    machine = {"accelerator", "devices", "num_nodes", "strategy", "num_workers"}
    bf16 = {**cpu["train"], **cpu["train"]["by_precision"]["bf16-mixed"]}
    bf16.pop("by_precision")
    # the last validation decodes the dev set with the beam anyway: one more halfway, not nine
    bf16["val_beam_bleu_every_steps"] = 5000
    train = exp["train"]
    assert {k: v for k, v in train.items() if k not in machine} == {
        k: v for k, v in bf16.items() if k not in machine
    }
    assert (train["accelerator"], train["devices"], train["precision"]) == ("gpu", 1, "auto")
    assert exp["resources"]["threads"] == 1  # several seeds share one GPU (host-bound runs)


def test_the_papers_base_on_multi30k_is_a_variant() -> None:
    config = _load(REPO_ROOT / "config" / "experiments" / "multi30k_en_de_paper_base.yaml")
    (exp,) = config["experiments"].values()
    assert exp["preset"] == "base" and exp["model_overrides"] == {"p_drop": 0.3}
    assert exp["train"]["warmup"] == 4000 and exp["train"]["lr_scale"] == 1.0  # §5.3
    assert exp["translate"]["alpha"] == 0.6  # §6.1
    assert config["data"]["multi30k"]["en-de"] == _load(DEFAULT)["data"]["multi30k"]["en-de"]


@pytest.mark.parametrize(
    ("recipe", "preset", "steps", "last_k", "p_drop", "vocab"),
    [
        ("wmt14_en_de_base", "base", 100_000, 5, None, 37000),
        ("wmt14_en_de_big", "big", 300_000, 20, 0.3, 37000),
        ("wmt14_en_fr_base", "base", 100_000, 5, None, 32000),
        ("wmt14_en_fr_big", "big", 300_000, 20, 0.1, 32000),
    ],
)
def test_wmt14_recipes_hold_the_papers_values(
    recipe: str, preset: str, steps: int, last_k: int, p_drop: float | None, vocab: int
) -> None:
    config = _load(REPO_ROOT / "config" / "experiments" / f"{recipe}.yaml")
    (exp,) = config["experiments"].values()
    train = exp["train"]
    assert exp["preset"] == preset
    assert exp["model_overrides"].get("p_drop") == p_drop  # §6.1 big: 0.3 EN-DE, 0.1 EN-FR
    assert train["max_steps"] == steps  # §5.2
    assert exp["average_last_k"] == last_k <= train["keep_checkpoints"]  # §6.1
    assert train["tokens_per_update"] == 25000  # §5.1
    assert train["warmup"] == 4000 and train["lr_scale"] == 1.0  # §5.3
    assert train["adam_betas"] == [0.9, 0.98] and train["adam_eps"] == 1e-9  # §5.3
    assert train["checkpoint_every_minutes"] == 10 and train["checkpoint_every_steps"] is None
    assert exp["translate"] == {"beam": 4, "alpha": 0.6, "max_len_b": 50, "max_tokens": 8192}
    assert exp["test_sets"] == ["newstest2014"]
    assert config["data"][exp["dataset"]][exp["pair"]]["vocab_size"] == vocab  # §5.1


def test_default_config_is_the_cpu_demo_on_multi30k() -> None:
    config = _load(DEFAULT)
    (exp,) = config["experiments"].values()
    assert (exp["dataset"], exp["pair"], exp["preset"]) == ("multi30k", "en-de", "tiny")
    assert exp["train"]["accelerator"] == "cpu"
    assert exp["test_sets"] == ["test_2016_flickr", "test_2017_flickr"]
    # §6.1's beam; its α chosen on the dev set, as the paper chose 0.6 (select_alpha)
    assert exp["translate"]["beam"] == 4 and exp["translate"]["alpha"] == "auto"
    assert exp["average_last_k"] == 5


@pytest.mark.parametrize("recipe", SINGLE, ids=lambda p: p.stem)
def test_dry_run_of_every_recipe(tmp_path: Path, recipe: Path) -> None:
    result = _dry_run(tmp_path, "--configfile", str(recipe))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    (name,) = _load(recipe)["experiments"]
    config = _load(recipe)
    exp = config["experiments"][name]
    # A --configfile replaces the default config: only the recipe's experiment is planned.
    (train,) = _shell_commands(out, "train")
    assert f"--run-dir results/runs/{name} " in train
    # the settings travel in a file (rule train_config), not as JSON on the command line
    assert f"--config-file results/runs/{name}/train_config.json " in train
    assert "{" not in train and "--model" not in train
    assert f"--mlflow-experiment {exp['dataset']}_{exp['pair']} --mlflow-run {name}" in train
    translate = _shell_commands(out, "translate")
    assert len(translate) == len(exp["test_sets"])
    if exp["translate"]["alpha"] == "auto":  # α chosen on the dev set (select_alpha)
        chosen = f"results/runs/{name}/alpha_selection.json"
        assert all(f"--beam 4 --alpha-from {chosen} --max-len-b 50" in c for c in translate)
    else:
        assert all("--beam 4 --alpha 0.6 --max-len-b 50" in cmd for cmd in translate)
    assert len(_shell_commands(out, "score")) == len(exp["test_sets"])
    average = _shell_commands(out, "average")[0]
    if exp["average_last_k"] == "auto":  # the dev set decides K (Multi30k recipes)
        assert f"--last auto --spm-model results/spm/{exp['dataset']}/{exp['pair']}/" in average
        assert "--dev-src results/data/" in average and "/valid." in average
    else:
        assert f"--last {exp['average_last_k']} " in average
    assert "multi30k_en_de_tiny" not in out


def test_dry_run_of_the_default_plans_the_whole_dag(tmp_path: Path) -> None:
    result = _dry_run(tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    # The checkpoints are not an output: Snakemake deletes a failed job's outputs, and a rerun
    # must resume from them.
    train_block = out[out.index("rule train:") :].split("Shell command")[0]
    (outputs,) = re.findall(r"^\s+output: (.*)$", train_block, re.M)
    assert outputs == "results/runs/multi30k_en_de_tiny/train_summary.json"
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out, re.M))
    assert counts == {
        "download_multi30k": "1", "prepare_multi30k_en_de": "1", "spm_train": "1",
        "encode": "4", "train_config": "1", "train": "1", "average": "1", "select_alpha": "1",
        "register": "1", "translate": "2", "score": "2", "attention_maps": "1", "report": "1",
        "all": "1", "total": "19",
    }  # fmt: skip


def test_slurm_profile_runs_train_as_one_ddp_task_per_gpu(tmp_path: Path) -> None:
    recipe = REPO_ROOT / "config" / "experiments" / "wmt14_en_de_base.yaml"
    result = _dry_run(
        tmp_path, "--profile", str(REPO_ROOT / "profiles" / "slurm"), "--configfile", str(recipe)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    (train,) = _shell_commands(out, "train")
    launch = "Shell command: TRANSFORMER_NMT_NOTICE_FD=3 srun python -m transformer_nmt train "
    assert launch in train
    block = out[out.index("rule train:") :].split("Shell command")[0]
    for resource in ("gpu=8", "nodes=1", "tasks_per_node=8", "mpi=srun", "slurm_partition=gpu"):
        assert resource in block
    # devices: auto and num_nodes: 1 take the 8 GPUs / 1 node that SLURM gives the job; the
    # train job reads them from the file of the (local, not submitted) train_config rule.
    settings = Pipeline(_load(recipe)).train_config("wmt14_en_de_base")
    assert settings["train"]["devices"] == "auto" and settings["train"]["num_nodes"] == 1
    assert "--config-file results/runs/wmt14_en_de_base/train_config.json " in train


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda e: e["translate"].update(beam=0), r"experiments\.demo\.translate\.beam: 0 is less"),
        (
            lambda e: e["train"].update(max_stpes=10),
            r"demo\.train: unknown key 'max_stpes' \(known",
        ),
        (lambda e: e.update(preset="huge"), r"experiments\.demo\.preset: 'huge' is not one of"),
        (lambda e: e.update(test_sets=["test_2099"]), r"experiments\.demo\.test_sets: 'test_2099'"),
        (lambda e: e.update(dataset="wmt99"), r"experiments\.demo: unknown dataset 'wmt99'"),
        (lambda e: e.update(pair="en-fr"), r"experiments\.demo: no data settings for multi30k"),
        (lambda e: e.update(average_last_k=9), r"experiments\.demo\.average_last_k"),
        (
            lambda e: e["train"].update(max_steps=100, checkpoint_every_steps=60),
            r"experiments\.demo\.average_last_k: averages 5 checkpoints but max_steps=100 with "
            r"checkpoint_every_steps=60 writes only 2",
        ),
        (
            lambda e: e["train"].update(by_precision={"bf16-mixed": {"max_steps": 100}}),
            r"demo\.average_last_k: averages 5 checkpoints but max_steps=100 with "
            r"checkpoint_every_steps=50 \(by_precision\.bf16-mixed\) writes only 2",
        ),
        (
            lambda e: e["train"].update(by_precision={"bf16": {"max_steps": 1600}}),
            r"experiments\.demo\.train\.by_precision: 'bf16' is not one of",
        ),
        (lambda e: e["train"].update(strategy="dpp"), r"'dpp' is not one of"),
    ],
)
def test_invalid_config_names_the_key(tmp_path: Path, edit: Any, message: str) -> None:
    config = _load(DEFAULT)
    (exp,) = config["experiments"].values()
    config["experiments"] = {"demo": exp}
    edit(exp)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = _dry_run(tmp_path, "--configfile", str(bad))
    assert result.returncode != 0
    out = result.stdout + result.stderr
    (line,) = [ln for ln in out.splitlines() if ln.startswith("config: ")]
    assert re.search(message, line), out[-2000:]
    assert len(out.splitlines()) <= 3, out[-2000:]  # no schema or config dump


def test_misspelled_top_level_key_is_one_short_line(tmp_path: Path) -> None:
    config = _load(DEFAULT)
    config["experimnts"] = config.pop("experiments")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = _dry_run(tmp_path, "--configfile", str(bad))
    assert result.returncode != 0
    assert result.stdout == "" and result.stderr.splitlines()[-1] == (
        "config: unknown key 'experimnts' (known: attention_map_sentences, cpu_fast_paths, data, "
        "data_mirror, datasets, experiments, register, registry, significance, system_metrics, "
        "table3, tracking_uri)"
    )


def test_pipeline_resolves_files_and_params() -> None:
    pipeline = Pipeline(_load(DEFAULT))
    (name,) = pipeline.experiments()
    assert pipeline.data_pairs() == [("multi30k", "en-de")]
    assert pipeline.raw_files("multi30k")[0].startswith("resources/multi30k/")
    assert len(pipeline.raw_files("multi30k")) == 12
    assert pipeline.test_file(name, "test_2016_flickr", "tgt") == (
        "results/data/multi30k/en-de/test_2016_flickr.de"
    )
    assert pipeline.all_scores() == [
        f"results/runs/{name}/test_2016_flickr.scores.json",
        f"results/runs/{name}/test_2017_flickr.scores.json",
    ]
    # canonical JSON: key order does not change the param (no spurious re-runs)
    assert paths.canonical_json({"b": 1, "a": [1, 2]}) == paths.canonical_json(
        {"a": [1, 2], "b": 1}
    )
    # the registry's params keep the file's own form (moving to typed parsing re-runs nothing)
    raw = yaml.safe_load((REPO_ROOT / "config" / "datasets.yaml").read_text(encoding="utf-8"))
    assert pipeline.registry_entry_json("multi30k") == paths.canonical_json(
        raw["multi30k"]["files"]
    )
    assert (
        json.loads(pipeline.registry_pair_json("multi30k", "en-de"))["pair"]
        == (raw["multi30k"]["pairs"]["en-de"])
    )
    with pytest.raises(ConfigError, match="cannot read the dataset registry"):
        pipeline.__class__({**_load(DEFAULT), "registry": "/nonexistent.yaml"})


def test_schema_knows_exactly_the_keys_of_the_stage_configs() -> None:
    from dataclasses import fields

    from transformer_nmt.data.clean import CleanConfig
    from transformer_nmt.model.config import ModelConfig
    from transformer_nmt.training.config import BY_PRECISION_KEYS, PRECISIONS, TrainConfig

    schema = _load(REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml")["$defs"]
    assert set(schema["train"]["properties"]) == {f.name for f in fields(TrainConfig)}
    by_precision = schema["train"]["properties"]["by_precision"]
    assert by_precision["propertyNames"]["enum"] == [p for p in PRECISIONS if p != "auto"]
    sized = by_precision["additionalProperties"]["propertyNames"]["enum"]
    assert sized == list(BY_PRECISION_KEYS)
    assert set(schema["model_overrides"]["properties"]) == {f.name for f in fields(ModelConfig)}
    clean = schema["data_pair"]["properties"]["clean"]["properties"]
    assert set(clean) == {f.name for f in fields(CleanConfig)}


@pytest.mark.parametrize("path", [DEFAULT, *RECIPES], ids=lambda p: p.stem)
def test_configs_are_accepted_by_the_stages_themselves(path: Path) -> None:
    from transformer_nmt.data.clean import CleanConfig
    from transformer_nmt.model.config import model_config_from_spec
    from transformer_nmt.training.config import TrainConfig

    config = _load(path)
    for pairs in config["data"].values():
        for settings in pairs.values():
            CleanConfig.from_dict(settings["clean"])
    for exp in config["experiments"].values():
        train = TrainConfig.from_dict(exp["train"])
        if exp["average_last_k"] == "auto":
            assert exp["dataset"] == "multi30k" and train.keep_checkpoints >= 10
        else:
            assert train.keep_checkpoints >= exp["average_last_k"]
        model = model_config_from_spec(
            {"preset": exp["preset"], "overrides": exp["model_overrides"]}
        )
        if exp["preset"] == "big":
            assert (model.N, model.d_model, model.d_ff, model.h) == (6, 1024, 4096, 16)


def test_search_flags_carry_early_stop_only_when_set() -> None:
    # unset (every recipe): the translate command line is unchanged, so nothing re-runs
    config = _load(DEFAULT)
    (name,) = config["experiments"]
    config["experiments"][name]["translate"]["alpha"] = 0.6
    flags = Pipeline(config).search_flags(name)
    assert flags == "--beam 4 --alpha 0.6 --max-len-b 50 --max-tokens 4096"
    config["experiments"][name]["translate"]["early_stop"] = "best"
    flags = Pipeline(config).search_flags(name)
    assert flags.endswith("--max-tokens 4096 --early-stop best")
    import snakemake.utils

    schema = str(REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml")
    snakemake.utils.validate(config, schema)  # "best" is a valid value
    config["experiments"][name]["translate"]["early_stop"] = "soon"
    with pytest.raises(Exception, match="soon"):
        snakemake.utils.validate(config, schema)


def test_alpha_auto_decodes_with_the_alpha_chosen_on_dev() -> None:
    """``translate.alpha: auto``: select_alpha searches the dev set with the paper's α aside
    (the CLI default) and the translate stage's quantisation; every stage that decodes reads
    the chosen α from its file; a number keeps the plain ``--alpha``."""
    import snakemake.utils

    schema = str(REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml")
    config = _load(DEFAULT)
    (name,) = config["experiments"]
    search = config["experiments"][name]["translate"]
    search.update(alpha="auto", quantize="int8", alpha_candidates=[0.6, 1.5])
    snakemake.utils.validate(config, schema)
    pipeline = Pipeline(config)
    chosen = f"results/runs/{name}/alpha_selection.json"
    assert pipeline.alpha_inputs(name) == {"alpha": chosen}
    assert pipeline.search_flags(name) == (
        f"--beam 4 --alpha-from {chosen} --max-len-b 50 --max-tokens 4096"
    )
    assert pipeline.translate_flags(name).endswith(
        f"{chosen} --max-len-b 50 --max-tokens 4096 --quantize int8"
    )
    assert pipeline.select_alpha_flags(name) == (
        "--dev-src results/data/multi30k/en-de/valid.en"
        " --dev-ref results/data/multi30k/en-de/valid.de --tgt-lang de"
        " --beam 4 --max-len-b 50 --max-tokens 4096 --quantize int8 --candidates 0.6 1.5"
    )
    config["experiments"][name]["average_last_k"] = "auto"
    pipeline = Pipeline(config)
    assert "--alpha" not in pipeline.average_flags(name)  # chosen after averaging
    search["alpha"] = 1.0
    with pytest.raises(ConfigError, match="alpha_candidates: used only with alpha: auto"):
        Pipeline(config)
    del search["alpha_candidates"]
    pipeline = Pipeline(config)
    assert pipeline.alpha_inputs(name) == {}
    assert "--alpha 1.0 " in pipeline.search_flags(name)
    for bad in ("best", -0.5):
        search["alpha"] = bad
        with pytest.raises(Exception, match="alpha"):
            snakemake.utils.validate(config, schema)


def test_translate_flags_carry_the_quantisation_only_when_set() -> None:
    import snakemake.utils

    schema = str(REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml")
    config = _load(DEFAULT)
    (name,) = config["experiments"]
    pipeline = Pipeline(config)
    search = pipeline.search_flags(name)
    quantize = config["experiments"][name]["translate"].get("quantize", "none")
    expected = search if quantize == "none" else f"{search} --quantize {quantize}"
    assert pipeline.translate_flags(name) == expected
    for value, flags in (("none", search), ("int8", f"{search} --quantize int8")):
        config["experiments"][name]["translate"]["quantize"] = value
        snakemake.utils.validate(config, schema)
        pipeline = Pipeline(config)
        assert pipeline.translate_flags(name) == flags
        assert pipeline.search_flags(name) == search  # selection and maps search in fp32
    config["experiments"][name]["translate"]["quantize"] = "int4"
    with pytest.raises(Exception, match="int4"):
        snakemake.utils.validate(config, schema)


def test_the_rerun_command_names_the_configfiles_and_config_values() -> None:
    rerun = paths.rerun_command
    recipe = REPO_ROOT / "config" / "experiments" / "wmt14_en_de_base.yaml"
    assert rerun([], {}, REPO_ROOT) == "snakemake --cores all"
    assert rerun(
        [recipe, "/elsewhere/my config.yaml"], {"data_mirror": "../d", "x": 1}, REPO_ROOT
    ) == (
        "snakemake --cores all --configfile config/experiments/wmt14_en_de_base.yaml"
        " --configfile '/elsewhere/my config.yaml' --config data_mirror=../d x=1"
    )


def test_register_is_a_config_choice_on_by_default(tmp_path: Path) -> None:
    on = _dry_run(tmp_path)
    off = _dry_run(tmp_path, "--config", "register=False")
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    assert len(_shell_commands(on.stdout, "register")) == 1
    assert _shell_commands(off.stdout, "register") == []
    assert len(_shell_commands(off.stdout, "score")) == 2  # the rest of the DAG stays
