"""The rank's own device (training/cluster.py): the local rank comes from the cluster
environment Lightning detects, simulated here through each launcher's variables."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.fabric.plugins.environments import (
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)

from transformer_nmt.data.vocab import VocabInfo
from transformer_nmt.model.config import get_preset
from transformer_nmt.training import preflight, resolution, run
from transformer_nmt.training.cluster import cluster_environment, local_rank
from transformer_nmt.training.config import TrainConfig

LAUNCHER_VARIABLES = (
    "SLURM_NTASKS", "SLURM_JOB_NAME", "SLURM_LOCALID", "SLURM_PROCID", "SLURM_NODEID",
    "SLURM_NNODES", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_STEP_NODELIST",
    "TORCHELASTIC_RUN_ID", "LOCAL_RANK", "RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE",
    "KUBERNETES_PORT", "KF_PIPELINE_RUN", "LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_RANK",
)  # fmt: skip

SRUN_RANK_11_OF_16 = {  # `srun` on the second node of two, 8 tasks each
    "SLURM_NTASKS": "16", "SLURM_JOB_NAME": "train", "SLURM_LOCALID": "3", "SLURM_PROCID": "11",
    "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "8", "SLURM_JOB_ID": "77",
}  # fmt: skip
TORCHRUN_RANK_6_OF_8 = {
    "TORCHELASTIC_RUN_ID": "r1", "LOCAL_RANK": "2", "RANK": "6", "WORLD_SIZE": "8",
    "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "4",
}  # fmt: skip


@pytest.fixture()
def launcher(monkeypatch: pytest.MonkeyPatch):
    """Start from no launcher at all; the test sets one launcher's variables."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def use(variables: dict[str, str]) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return use


def test_srun_gives_each_rank_its_slurm_localid(launcher) -> None:
    launcher({**SRUN_RANK_11_OF_16, "LOCAL_RANK": "0"})  # a stray LOCAL_RANK does not win
    env = cluster_environment()
    assert isinstance(env, SLURMEnvironment) and not env.auto_requeue
    assert (local_rank(), env.global_rank(), env.world_size(), env.node_rank()) == (3, 11, 16, 1)


def test_torchrun_gives_local_rank_also_inside_a_slurm_allocation(launcher) -> None:
    launcher({**SRUN_RANK_11_OF_16, **TORCHRUN_RANK_6_OF_8})  # Lightning: torchelastic first
    env = cluster_environment()
    assert isinstance(env, TorchElasticEnvironment)
    assert (local_rank(), env.global_rank(), env.world_size()) == (2, 6, 8)


def test_an_interactive_slurm_shell_is_not_a_slurm_launch(launcher) -> None:
    # Lightning's rule: job name "bash"/"interactive" = processes launched by hand.
    launcher({**SRUN_RANK_11_OF_16, "SLURM_JOB_NAME": "interactive", "LOCAL_RANK": "1"})
    assert isinstance(cluster_environment(), LightningEnvironment) and local_rank() == 1


def test_one_process_is_rank_zero(launcher) -> None:
    assert isinstance(cluster_environment(), LightningEnvironment) and local_rank() == 0


def test_the_preflight_measures_on_the_ranks_own_gpu(
    launcher, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Under srun, rank 11 (SLURM_LOCALID 3) measures its worst-case batch on cuda:3: the device
    that ``check_fits`` asks about and measures on (CUDA faked: this runs on CPU)."""
    launcher(SRUN_RANK_11_OF_16)
    asked: list[torch.device] = []

    def properties(device: torch.device) -> SimpleNamespace:
        asked.append(device)
        return SimpleNamespace(total_memory=80 * 2**30)

    def plan(*args, measure_on=None, **kwargs):
        asked.append(measure_on)
        return SimpleNamespace(fits=True, batch=1, width=8, peak_bytes=1, peak_source="measured",
                               usable_bytes=1)  # fmt: skip

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "H100")
    monkeypatch.setattr(preflight, "plan_experiment", plan)
    monkeypatch.setattr(run, "check_fits", preflight.check_fits)
    cfg = TrainConfig(max_steps=10, accelerator="gpu", precision="bf16-mixed")
    vocab = VocabInfo(size=500, pad_id=0, unk_id=1, bos_id=2, eos_id=3, sha256="0" * 64)
    model_cfg = get_preset("tiny")
    resolved = resolution.resolve_run(model_cfg, cfg, vocab)
    run.plan_start(tmp_path / "run", model_cfg, cfg, vocab, resolved)
    assert asked == [torch.device("cuda", 3), torch.device("cuda", 3)]
