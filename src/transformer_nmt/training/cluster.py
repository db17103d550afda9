"""Which cluster environment a training process runs in, chosen as Lightning chooses it.

One home for that choice, so that the trainer's plugin and the pre-flight's device agree: under
``srun`` a rank's GPU is ``SLURM_LOCALID``, under ``torchrun`` it is ``LOCAL_RANK``, alone it is
GPU 0. (A rank that read ``LOCAL_RANK`` under ``srun``, where it is unset, would measure its
worst-case batch on GPU 0, eight ranks at once.) The order is Lightning's own
(``_AcceleratorConnector._choose_and_init_cluster_environment``): torchelastic (also inside a
SLURM allocation), SLURM, LSF, MPI, else Lightning's environment for the processes it launches
itself.
"""

from __future__ import annotations

from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)


def cluster_environment() -> ClusterEnvironment:
    """The environment of this process. Under SLURM, Lightning's own requeue on SIGUSR1 stays
    off: Snakemake's executor owns resubmission, and a rerun resumes from the run's checkpoints
    (``resume.start_point``) rather than Lightning's ``hpc_ckpt_*.ckpt`` files."""
    if TorchElasticEnvironment.detect():
        return TorchElasticEnvironment()
    if SLURMEnvironment.detect():
        return SLURMEnvironment(auto_requeue=False)
    for kind in (LSFEnvironment, MPIEnvironment):
        if kind.detect():
            return kind()
    return LightningEnvironment()


def local_rank() -> int:
    """This process's rank on its node: the index of its GPU."""
    return cluster_environment().local_rank()
