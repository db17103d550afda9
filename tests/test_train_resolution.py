"""How a TrainConfig resolves on a machine: precision, devices, strategy, trainer."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from tests.training_helpers import train_argv
from transformer_nmt.cli import main
from transformer_nmt.runs.checkpoints import load_checkpoint
from transformer_nmt.training.config import TrainConfig
from transformer_nmt.training.resolution import resolve, strategy_for
from transformer_nmt.training.rules import resolve_precision


def test_cpu_resolution_is_fp32_and_ddp_with_two_processes() -> None:
    from lightning.pytorch.strategies import DDPStrategy

    cpu = TrainConfig(accelerator="cpu")
    assert resolve_precision(cpu) == "32-true"
    assert strategy_for(resolve(cpu)) == "auto"
    ddp = strategy_for(resolve(TrainConfig(accelerator="cpu", devices=2)))
    assert isinstance(ddp, DDPStrategy) and ddp._process_group_backend == "gloo"
    six = resolve(TrainConfig(accelerator="cpu", devices=2, num_nodes=3))
    assert six.world_size == 6
    assert strategy_for(resolve(TrainConfig(accelerator="cpu", strategy="ddp"))) == "ddp"


def test_slurm_jobs_leave_requeueing_to_snakemake(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from transformer_nmt.training.trainer import build_trainer

    for key, value in {
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NAME": "train",
        "SLURM_NODELIST": "node1",
        "SLURM_JOB_ID": "42",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
    }.items():
        monkeypatch.setenv(key, value)
    cfg = TrainConfig(accelerator="cpu", max_steps=3)
    trainer = build_trainer(cfg, tmp_path, resolved=resolve(cfg).with_accumulation(25_000))
    env = trainer._accelerator_connector.cluster_environment
    assert isinstance(env, SLURMEnvironment) and env.auto_requeue is False


def test_the_trainer_hands_freed_heap_pages_back_every_release_interval(tmp_path: Path) -> None:
    from transformer_nmt.cpu_memory import RELEASE_EVERY_STEPS
    from transformer_nmt.training.callbacks import ReleaseFreedMemory
    from transformer_nmt.training.trainer import build_trainer

    cfg = TrainConfig(accelerator="cpu", max_steps=3)
    trainer = build_trainer(cfg, tmp_path, resolved=resolve(cfg).with_accumulation(25_000))
    releases = [c for c in trainer.callbacks if isinstance(c, ReleaseFreedMemory)]
    assert [c.every for c in releases] == [RELEASE_EVERY_STEPS]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_a_gpu_recipe_on_a_cpu_machine_is_one_line_and_no_mlflow_run(
    corpus: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    argv = train_argv(corpus, tmp_path / "run", max_steps=2, accelerator="gpu")
    argv += ["--mlflow-experiment", "toy_en-de", "--mlflow-run", "tiny"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: train config key 'accelerator' is 'gpu'")
    assert "profiles/gpu" in err[0]
    assert not (tmp_path / "mlflow.db").exists()  # no MLflow run (FAILED or otherwise)
    assert not (tmp_path / "run").exists()


@pytest.mark.gpu
def test_gpu_training_uses_bf16_mixed_and_keeps_fp32_weights(
    corpus: dict[str, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=5, accelerator="auto", precision="auto")) == 0
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["precision"] == "bf16-mixed"
    assert math.isfinite(summary["metrics"]["train/loss"])
    ckpt = load_checkpoint(run / "checkpoints" / "step=00000005.ckpt")
    for value in ckpt["state_dict"].values():
        assert value.dtype == torch.float32 and torch.isfinite(value).all()


def test_the_train_stage_runs_the_steps_by_precision_gives_for_its_precision(
    corpus: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``train.by_precision``: the run takes the steps its entry for the precision it trains in
    gives (fp32 here, Lightning's "32" naming it too), logs them, and its summary and
    checkpoints end there; an entry for another precision changes nothing."""
    caplog.set_level(logging.INFO)
    sized = {"32-true": {"max_steps": 5, "checkpoint_every_steps": 5, "val_every_steps": 5}}
    run = tmp_path / "sized"
    argv = train_argv(corpus, run, max_steps=10, precision="32", by_precision=sized)
    assert main(argv) == 0
    assert "train.by_precision for 32: max_steps 5, val_every_steps 5" in caplog.text
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["final_step"] == 5
    other = tmp_path / "other"
    sized_bf16 = {"bf16-mixed": {"max_steps": 5}}
    argv = train_argv(corpus, other, max_steps=10, precision="32-true", by_precision=sized_bf16)
    assert main(argv) == 0
    assert json.loads((other / "train_summary.json").read_text())["final_step"] == 10
