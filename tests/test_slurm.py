"""profiles/slurm for real: the whole DAG on a slice of Multi30k through a one-node SLURM cluster.

tests/slurm/cluster.sh starts munged, slurmctld and slurmd on this machine (loopback only,
everything in a temporary directory); ``snakemake --profile profiles/slurm`` then submits every
non-local job with sbatch (snakemake-executor-plugin-slurm). The train job is killed once with
``scancel`` after its first checkpoint; Snakemake's retry resubmits it, it resumes from its
newest checkpoint, and the averaged model, the translations and the BLEU equal those of the same
slice run locally (without SLURM, at the same time).

Skipped (with the reason) where the SLURM packages are missing (.ci/run installs Debian's
slurmctld, slurmd, slurm-client and munge) or the cluster cannot start (not root, a container
that does not let slurmd run jobs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sacrebleu
import torch
import yaml

from tests.conftest import REPO_ROOT, checkout_pythonpath, snakemake_command
from transformer_nmt.runs.checkpoints import load_model_file

pytestmark = pytest.mark.slow

CLUSTER_SH = REPO_ROOT / "tests" / "slurm" / "cluster.sh"
PARTITION = "nmt-test"  # not the default partition: sbatch must be given it
EXPERIMENT = "smoke_slurm"
TEST_SET = "test_2016_flickr"
MAX_STEPS = 80
# rules that Snakemake runs itself (the Snakefile's localrules, and `all`): never submitted
LOCAL_RULES = {"train_config", "score", "report", "all"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A running one-node cluster: the environment for its clients (SLURM_CONF)."""
    tools = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
    missing = [t for t in tools if shutil.which(t, path=f"{os.environ['PATH']}:/usr/sbin") is None]
    if missing:
        pytest.skip(
            f"SLURM not installed ({', '.join(missing)} missing): apt-get install slurmctld "
            "slurmd slurm-client munge (.ci/run does so where apt-get works)"
        )
    if os.geteuid() != 0:
        pytest.skip("a one-node SLURM cluster needs root (slurmd starts the jobs)")
    state = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "PATH": f"{os.environ['PATH']}:/usr/sbin:/sbin",
           "SLURMCTLD_PORT": str(_free_port()), "SLURMD_PORT": str(_free_port()),
           "SLURM_TEST_PARTITION": PARTITION}  # fmt: skip
    started = subprocess.run(
        ["bash", str(CLUSTER_SH), "start", str(state)], env=env, capture_output=True, text=True
    )
    if started.returncode != 0:
        # cluster.sh's reason comes first, then the daemons' log tails (all logs in state/log)
        reason = started.stderr.strip().splitlines()[0] if started.stderr.strip() else "no reason"
        pytest.skip(f"the one-node SLURM cluster did not start: {reason} (logs: {state}/log)")
    try:
        yield {"SLURM_CONF": str(state / "slurm.conf")}
    finally:
        subprocess.run(["bash", str(CLUSTER_SH), "stop", str(state)], env=env, check=False)


def _config(mirror: Path) -> dict[str, Any]:
    """One experiment of the repo's test config (.test/config/config.yaml), one test set, long
    enough (MAX_STEPS) that a kill after the first checkpoint lands mid-run."""
    config = yaml.safe_load((REPO_ROOT / ".test" / "config" / "config.yaml").read_text("utf-8"))
    experiment = config["experiments"]["smoke_a"]
    experiment["train"].update(max_steps=MAX_STEPS, checkpoint_every_steps=5, val_every_steps=20)
    experiment["test_sets"] = [TEST_SET]
    return {**config, "data_mirror": str(mirror), "experiments": {EXPERIMENT: experiment}}


def _start_snakemake(workdir: Path, config: dict[str, Any], args: list[str],
                     extra_env: dict[str, str]) -> subprocess.Popen:  # fmt: skip
    workdir.mkdir(parents=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), "utf-8")
    snakemake = snakemake_command()
    cmd = [*snakemake, "--snakefile", str(REPO_ROOT / "Snakefile"), "--directory",
           str(workdir), "--configfile", str(workdir / "config.yaml"), *args]  # fmt: skip
    # PYTHONPATH: the jobs run this checkout's package; sbatch passes this environment on.
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(workdir),
           "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}",
           "PYTHONPATH": checkout_pythonpath(), **extra_env}  # fmt: skip
    with open(workdir / "snakemake.out", "w", encoding="utf-8") as log:  # the child keeps a copy
        return subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait(proc: subprocess.Popen, workdir: Path, timeout: float) -> str:
    proc.wait(timeout=timeout)
    out = (workdir / "snakemake.out").read_text(encoding="utf-8")
    assert proc.returncode == 0, f"{workdir.name}: snakemake failed\n{out[-6000:]}"
    return out


def _slurm_jobs(env: dict[str, str]) -> list[tuple[str, str, str]]:
    """(job id, rule, state) of every job the cluster has seen (it keeps them for MinJobAge)."""
    out = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--format=%i|%k|%T"],
        env={**os.environ, **env}, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    jobs = []
    for line in out.splitlines():
        job_id, comment, state = line.strip().split("|")
        # the plugin's comment: rule_<rule> or rule_<rule>_wildcards_<values>
        rule = re.match(r"rule_(\w+?)(?:_wildcards_.*)?$", comment)
        jobs.append((job_id, rule.group(1) if rule else comment, state))
    return jobs


def _kill_train_after_first_checkpoint(env: dict[str, str], run_dir: Path,
                                       proc: subprocess.Popen) -> str:  # fmt: skip
    """scancel the running train job once its first checkpoint exists; its SLURM job id."""
    deadline = time.monotonic() + 600
    while not list((run_dir / "checkpoints").glob("step=*.ckpt")):
        assert proc.poll() is None, "the SLURM run ended before the train job's first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint of the train job after 10 minutes"
        time.sleep(0.1)
    running = [j for j in _slurm_jobs(env) if j[1] == "train" and j[2] == "RUNNING"]
    assert len(running) == 1, _slurm_jobs(env)
    job_id = running[0][0]
    subprocess.run(["scancel", job_id], env={**os.environ, **env}, check=True)
    return job_id


def test_slurm_runs_every_job_with_sbatch_and_a_killed_train_job_resumes_to_the_same_bleu(
    slurm_cluster: dict[str, str], shared_mirror: Path, tmp_path: Path
) -> None:
    config = _config(shared_mirror)
    local = _start_snakemake(tmp_path / "local", config, ["--cores", "2"], {})
    slurm_args = [
        "--profile", str(REPO_ROOT / "profiles" / "slurm"),
        # this cluster: one small node (the profile's defaults ask for 4 CPUs, 16 GB, 8 GPUs)
        # (options on the command line replace the profile's lists)
        "--default-resources", f"slurm_partition='{PARTITION}'", "mem_mb=1000", "runtime=30",
        "--set-resources", "train:nodes=1",
        "--max-threads", "2",  # as --cores 2 caps the local run's threads (same SentencePiece)
        # no accounting database (slurmdbd): no account, job states from squeue (MinJobAge=3600)
        "--slurm-no-account", "--slurm-status-command", "squeue",
        "--slurm-init-seconds-before-status-checks", "2",
    ]  # fmt: skip
    slurm_dir = tmp_path / "slurm"
    slurm = _start_snakemake(slurm_dir, config, slurm_args, slurm_cluster)
    try:
        run_dir = slurm_dir / "results" / "runs" / EXPERIMENT
        killed = _kill_train_after_first_checkpoint(slurm_cluster, run_dir, slurm)
        slurm_out = _wait(slurm, slurm_dir, timeout=1200)
        local_out = _wait(local, tmp_path / "local", timeout=1200)
    finally:
        for proc in (slurm, local):
            if proc.poll() is None:
                proc.kill()

    # every job that is not a local rule went through sbatch, once; train twice (killed, retried)
    jobs = _slurm_jobs(slurm_cluster)
    # the local run's "Job stats" table: rule, count
    local_jobs = [(r, int(n)) for r, n in re.findall(r"^(\w+)\s+(\d+)$", local_out, re.M)]
    expected = [r for r, n in local_jobs if r not in LOCAL_RULES | {"total"} for _ in range(n)]
    expected.append("train")
    assert sorted(rule for _, rule, _ in jobs) == sorted(expected), jobs
    assert {
        "download_multi30k",
        "prepare_multi30k_en_de",
        "spm_train",
        "encode",
        "train",
        "average",
        "translate",
    } <= set(expected)
    states = {job_id: state for job_id, _, state in jobs}
    assert states.pop(killed) == "CANCELLED"
    assert set(states.values()) == {"COMPLETED"}, jobs
    assert "Trying to restart job" in slurm_out, slurm_out[-3000:]  # Snakemake's retry

    # the resubmitted train job resumed from the checkpoint the killed one left
    summary = json.loads((run_dir / "train_summary.json").read_text(encoding="utf-8"))
    resumed = re.fullmatch(r"step=(\d+)\.ckpt", summary["resumed_from"] or "")
    assert resumed and 0 < int(resumed.group(1)) < MAX_STEPS, summary["resumed_from"]
    assert summary["final_step"] == MAX_STEPS
    step = int(resumed.group(1))
    train_log = (slurm_dir / "logs" / "train" / f"{EXPERIMENT}.log").read_text(encoding="utf-8")
    assert f"resuming from {summary['resumed_from']} at step {step}" in train_log.replace(
        f"results/runs/{EXPERIMENT}/checkpoints/", ""
    )
    killed_log = slurm_dir / ".snakemake" / "slurm_logs" / "rule_train" / EXPERIMENT
    assert f"JOB {killed} ON localhost CANCELLED" in (killed_log / f"{killed}.log").read_text()

    # same model, translations and scores as the uninterrupted local run (seeded, exact resume)
    local_run = tmp_path / "local" / "results" / "runs" / EXPERIMENT
    slurm_model, _ = load_model_file(run_dir / "averaged.pt")
    local_model, _ = load_model_file(local_run / "averaged.pt")
    local_weights = local_model.state_dict()
    for name, tensor in slurm_model.state_dict().items():
        assert torch.equal(tensor, local_weights[name]), name
    hyp = (run_dir / f"{TEST_SET}.hyp").read_text(encoding="utf-8")
    assert hyp == (local_run / f"{TEST_SET}.hyp").read_text(encoding="utf-8")
    assert hyp.strip(), "empty translations: the comparison would prove nothing"
    scores = json.loads((run_dir / f"{TEST_SET}.scores.json").read_text(encoding="utf-8"))
    local_scores = json.loads((local_run / f"{TEST_SET}.scores.json").read_text(encoding="utf-8"))
    assert scores["bleu"] == local_scores["bleu"] and scores["chrf"] == local_scores["chrf"]
    # 80 steps of a tiny model: BLEU is ~0 (0.07, or 0.0, by the seed's draws), so the model's
    # quality is not what this test shows; the stored chrF (~5) is that of these translations
    # against the references, non-zero: the equal outputs above share text with them
    refs = (slurm_dir / "results" / "data" / "multi30k" / "en-de" / f"{TEST_SET}.de").read_text(
        encoding="utf-8"
    )
    chrf = sacrebleu.CHRF().corpus_score(hyp.splitlines(), [refs.splitlines()]).score
    assert scores["chrf"]["score"] == pytest.approx(chrf, abs=1e-9) and chrf > 0.0
