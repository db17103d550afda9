"""check-config: a config file's YAML syntax error names its file, line and column; a removed
key names its release and the record that measured it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from transformer_nmt.cli import main
from transformer_nmt.errors import ConfigError
from transformer_nmt.model.config import ModelConfig, apply_overrides
from transformer_nmt.removed_keys import REMOVED_KEYS
from transformer_nmt.training.config import TrainConfig

REPO = Path(__file__).resolve().parent.parent


def test_a_yaml_syntax_error_names_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "my config.yaml"
    bad.write_text("experiments:\n  a:\n    dataset: multi30k\n   pair: en-de\n", encoding="utf-8")
    assert main(["check-config", str(bad)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {bad}:4:4: not valid YAML: expected <block end>")
    assert "at line 2, column 3" in line and "fix it there" in line


def test_a_schema_error_names_the_key_and_a_valid_config_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = (REPO / "config" / "config.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    broken, replaced = re.subn(r"max_steps: \d+", "max_steps: -3", config, count=1)
    assert replaced == 1
    bad.write_text(broken, encoding="utf-8")
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: config: experiments.multi30k_en_de_tiny.train.max_steps:" in err
    assert main(["check-config", str(REPO / "config" / "config.yaml")]) == 0
    assert "valid (1 experiment(s): multi30k_en_de_tiny)" in capsys.readouterr().out


def test_a_removed_key_is_one_line_naming_its_release_and_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    config["experiments"]["multi30k_en_de_tiny"]["model_overrides"]["p_drop_layer"] = 0.1
    bad = tmp_path / "layerdrop.yaml"
    bad.write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["check-config", str(bad)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        f"error: {bad}: config: experiments.multi30k_en_de_tiny.model_overrides: model config "
        "key 'p_drop_layer' was removed in release 0.2.0 (LayerDrop: measured and not adopted, "
        'benchmarks/log/2026-11-28.md, section "LayerDrop: built'
    )
    assert line.endswith("delete the key")
    # the model and train configs' own checks say the same
    for build, key in (
        (lambda: ModelConfig.from_dict({"p_drop_layer": 0.1}), "p_drop_layer"),
        (lambda: apply_overrides(ModelConfig(), ["softmax_vocab=target"]), "softmax_vocab"),
        (lambda: TrainConfig.from_dict({"rdrop_alpha": 5.0}), "rdrop_alpha"),
    ):
        with pytest.raises(ConfigError, match=f"key '{key}' was removed in release 0.2.0"):
            build()
    # a run recorded before the removal holds the keys at the paper's value: the same model
    recorded = {**ModelConfig().to_dict(), "softmax_vocab": "shared", "p_drop_layer": 0.0}
    assert ModelConfig.from_dict(recorded) == ModelConfig()


def test_every_removed_key_names_a_record_that_exists() -> None:
    for key, removed in REMOVED_KEYS.items():
        path, _, section = removed.record.partition(", section ")
        assert (REPO / path).is_file(), key
        if section:
            text = (REPO / path).read_text(encoding="utf-8")
            assert f"### {section.strip(chr(34))}" in text, key


def test_a_pair_left_out_is_the_datasets_one_pair_and_a_choice_where_it_has_several(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``experiments.<name>.pair`` and the pair level of ``data.<dataset>`` may be left out
    where the dataset has one pair; on Multi30k (en-de, en-fr) each is one line naming the key
    and how to name the pair."""
    from transformer_nmt.experiments import validated_pipeline

    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    name = "multi30k_en_de_tiny"
    one_pair = {**demo, "data": {"wmt14_en_de": demo["data"]["multi30k"]["en-de"]}}
    one_pair["experiments"] = {
        name: {**demo["experiments"][name], "dataset": "wmt14_en_de", "test_sets": ["newstest2014"]}
    }
    del one_pair["experiments"][name]["pair"]
    pipeline = validated_pipeline(one_pair, "one.yaml")
    assert pipeline.experiment(name)["pair"] == "en-de" and pipeline.langs(name) == ("en", "de")
    assert pipeline.data_settings("wmt14_en_de", "en-de")["vocab_size"] == 8000
    assert pipeline.data_pairs() == [("wmt14_en_de", "en-de")]

    no_pair = yaml.safe_load(yaml.safe_dump(demo))
    del no_pair["experiments"][name]["pair"]
    with pytest.raises(ConfigError) as err:
        validated_pipeline(no_pair, "two.yaml")
    assert str(err.value) == (
        f"two.yaml: config: experiments.{name}: dataset 'multi30k' has the pairs en-de, en-fr: "
        f"name one (experiments.{name}.pair: en-de)"
    )
    flat = {**demo, "data": {"multi30k": demo["data"]["multi30k"]["en-de"]}}
    with pytest.raises(ConfigError) as err:
        validated_pipeline(flat, "flat.yaml")
    assert str(err.value) == (
        "flat.yaml: config: data.multi30k: dataset 'multi30k' has the pairs en-de, en-fr: "
        "name one (data.multi30k.en-de: {vocab_size: ...})"
    )
    typo = {**demo, "data": {"wmt14_en_de": {**one_pair["data"]["wmt14_en_de"], "vocab": 1}}}
    with pytest.raises(
        ConfigError, match=r"^typo.yaml: config: data.wmt14_en_de: unknown key 'vocab'"
    ):
        validated_pipeline(typo, "typo.yaml")
