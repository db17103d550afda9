"""TrainConfig: keys and values checked and named, paper defaults, --config-file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training_helpers import BASE_TRAIN, MODEL, train_argv
from transformer_nmt.cli import main
from transformer_nmt.errors import ConfigError
from transformer_nmt.training.config import TrainConfig


def test_train_config_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError, match="max_step"):
        TrainConfig.from_dict({"max_step": 10})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_steps", 0),
        ("devices", 0),
        ("precision", "fp8"),
        ("adam_betas", [0.9]),
        ("clip_grad_norm", -1.0),
        ("checkpoint_every_steps", 0),
        ("loss_chunk_tokens", 0),
        ("compile", "yes"),
        ("fused_loss", "yes"),
        ("lr_scale", True),
        ("strategy", "fsdp"),  # sharded: the per-token gradient rescaling needs whole gradients
        ("strategy", "deepspeed"),
    ],
)
def test_train_config_bad_value_names_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        TrainConfig.from_dict({key: value})


def test_compile_and_chunked_loss_are_not_combined() -> None:
    with pytest.raises(ConfigError, match="'compile' and 'loss_chunk_tokens'"):
        TrainConfig(compile=True, loss_chunk_tokens=512)


def test_beam_bleu_interval_must_fall_on_validations() -> None:
    with pytest.raises(
        ConfigError, match="'val_beam_bleu_every_steps' \\(150\\) must be a multiple"
    ):
        TrainConfig(val_every_steps=100, val_beam_bleu_every_steps=150)
    assert TrainConfig(val_every_steps=100, val_beam_bleu_every_steps=300)


def test_train_config_round_trips_and_defaults_follow_the_paper() -> None:
    cfg = TrainConfig()
    assert (cfg.max_steps, cfg.warmup, cfg.adam_betas, cfg.adam_eps) == (
        100_000,
        4000,
        (0.9, 0.98),
        1e-9,
    )
    assert cfg.checkpoint_every_minutes == 10.0 and cfg.clip_grad_norm is None
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_cli_unknown_train_or_model_key_is_a_clear_error(
    corpus: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = train_argv(corpus, tmp_path / "run", max_steps=2, warmpu=3)
    assert main(argv) == 2
    assert "warmpu" in capsys.readouterr().err
    argv = train_argv(corpus, tmp_path / "run", max_steps=2)
    argv[argv.index("--model") + 1] = json.dumps({"preset": "tiny", "overrides": {"dmodel": 8}})
    assert main(argv) == 2
    assert "dmodel" in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()


def _without_flags(argv: list[str], *flags: str) -> list[str]:
    """``argv`` less each flag in ``flags`` and its value."""
    drop = {i + k for i, arg in enumerate(argv) if arg in flags for k in (0, 1)}
    return [arg for i, arg in enumerate(argv) if i not in drop]


def test_cli_config_file_replaces_model_and_train(
    corpus: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pipeline's train_config.json ({"model": spec, "train": keys}) trains as --model and
    --train do; the two ways exclude each other and a bad file is named."""
    settings = tmp_path / "train_config.json"
    settings.write_text(json.dumps({"model": MODEL, "train": {**BASE_TRAIN, "max_steps": 2}}))
    run_dir = tmp_path / "run"
    by_flags = train_argv(corpus, run_dir, max_steps=2)
    argv = [*_without_flags(by_flags, "--model", "--train"), "--config-file", str(settings)]
    assert main(argv) == 0
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["final_step"] == 2 and summary["model_config"]["d_model"] == 32
    assert summary["train_config"]["seed"] == BASE_TRAIN["seed"]

    assert main([*by_flags, "--config-file", str(settings)]) == 2
    assert "--config-file replaces --model and --train" in capsys.readouterr().err
    settings.write_text(json.dumps({"modle": MODEL, "train": {}}))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(settings) in err and "'modle'" in err
