"""Where clusters hurt: checkpoints whole or absent on any filesystem, honest exits on
SIGTERM/SIGINT, one trainer per run directory."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import checkout_pythonpath
from tests.training_helpers import read_trace, spawn_training, train_argv
from transformer_nmt.cli import main
from transformer_nmt.io_utils import remove_stale_temps
from transformer_nmt.runs.checkpoints import list_checkpoints, load_checkpoint
from transformer_nmt.runs.metrics_history import read_metrics
from transformer_nmt.training.run import run_dir_lock
from transformer_nmt.training.trainer import AtomicCheckpointIO

WRITER = """
import sys, torch
from transformer_nmt.training.trainer import AtomicCheckpointIO
big = {"w": torch.ones(96 * 2**20 // 4)}  # 96 MiB: the write takes a moment
AtomicCheckpointIO().save_checkpoint(big, sys.argv[1])
"""


def _other_filesystem_tmpdir(tmp_path: Path) -> Path | None:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != tmp_path.stat().st_dev:
        target = Path(os.environ.get("TMPDIR_TEST_OTHER_FS", shm)) / f"tnmt-{os.getpid()}"
        target.mkdir(exist_ok=True)
        return target
    return None


def test_a_checkpoint_writer_killed_mid_write_leaves_no_checkpoint(tmp_path: Path) -> None:
    other_fs = _other_filesystem_tmpdir(tmp_path)
    if other_fs is None:
        pytest.skip("no writable filesystem other than the test's (/dev/shm) for TMPDIR")
    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    target = ckpt_dir / "step=00000010.ckpt"
    env = {**os.environ, "PYTHONPATH": checkout_pythonpath(), "TMPDIR": str(other_fs)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], env=env)
    deadline = time.monotonic() + 120
    # kill it while the temporary file (beside the target, not in TMPDIR) is being written
    while not list(ckpt_dir.glob(".*.tmp")) and time.monotonic() < deadline:
        assert proc.poll() is None, "the writer ended before it was killed"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert not target.exists()
    assert list_checkpoints(ckpt_dir) == []
    assert list(other_fs.iterdir()) == []  # nothing leaked into $TMPDIR
    stale = list(ckpt_dir.glob(".*.tmp"))
    assert len(stale) == 1 and remove_stale_temps(ckpt_dir) == stale
    assert list(ckpt_dir.iterdir()) == []
    other_fs.rmdir()


def test_a_full_disk_leaves_nothing_partial(tmp_path: Path, monkeypatch) -> None:
    def half_then_enospc(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", half_then_enospc)
    target = tmp_path / "step=00000010.ckpt"
    with pytest.raises(OSError, match="No space left"):
        AtomicCheckpointIO().save_checkpoint({"w": torch.ones(3)}, target)
    assert list(tmp_path.iterdir()) == []


def test_a_second_trainer_on_the_same_run_directory_fails_at_once(
    corpus: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    with run_dir_lock(run):  # the first trainer (this process) holds the run directory
        started = time.monotonic()
        assert main(train_argv(corpus, run, max_steps=5)) == 2
        assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert "another trainer is running in this run directory" in err
    assert f"pid {os.getpid()} on " in err
    assert not (run / "checkpoints").exists()
    assert main(train_argv(corpus, run, max_steps=5)) == 0  # the lock is released


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_a_checkpoint_and_exits_non_zero_then_resumes(
    corpus: dict[str, Path],
    tmp_path: Path,
    signum: int,
) -> None:
    run = tmp_path / "run"
    ckpt_dir = run / "checkpoints"
    # periodic checkpoints are rare: the one after the signal is the stop's own
    argv = train_argv(corpus, run, max_steps=100_000, checkpoint_every_steps=100_000)
    log = tmp_path / "train.log"
    with open(log, "w") as log_file:
        proc = spawn_training(argv, log_file)
        deadline = time.monotonic() + 240
        while "step 10/" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        proc.send_signal(signum)
        code = proc.wait(timeout=120)
    text = log.read_text()
    name = signal.Signals(signum).name
    assert code == 2, text[-2000:]
    assert f"error: stopped by {name} at step " in text
    (saved,) = list_checkpoints(ckpt_dir)
    step = load_checkpoint(saved)["global_step"]
    assert f"stopped by {name} at step {step} (newest checkpoint: {saved.name})" in text
    assert not (run / "train_summary.json").exists()
    assert main(train_argv(corpus, run, max_steps=step + 5, checkpoint_every_steps=5)) == 0


@pytest.mark.slow
def test_a_signal_to_ddp_ranks_stops_them_at_one_update_and_the_resumed_run_matches(
    corpus: dict[str, Path],
    tmp_path: Path,
) -> None:
    """SIGUSR1 (SLURM's warning before the time limit) to every rank of a two-process gloo run,
    as SLURM sends it: all ranks stop at the same update with one checkpoint and a non-zero
    exit; the resumed run ends with the weights of an uninterrupted one."""
    steps = 12
    common = {"devices": 2, "max_steps": steps, "checkpoint_every_steps": 100_000}
    whole, split = tmp_path / "whole", tmp_path / "split"
    env = {**os.environ, "PYTHONPATH": checkout_pythonpath()}
    done = subprocess.run([sys.executable, "-m", "transformer_nmt",
                           *train_argv(corpus, whole, **common)],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    log = tmp_path / "train.log"
    trace = split / "trace"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "transformer_nmt", *train_argv(corpus, split, **common)],
            env={**env, "TRANSFORMER_NMT_TRACE_BATCHES": str(trace)},
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # both ranks past their third update
            lines = [p.read_text().count("\n") for p in trace.glob("rank*.jsonl")]
            if len(lines) == 2 and min(lines) >= 3:
                break
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGUSR1)  # every process of the job, as SLURM signals
        code = proc.wait(timeout=120)
    text = log.read_text()
    assert code == 2, text[-3000:]
    (saved,) = list_checkpoints(split / "checkpoints")
    step = load_checkpoint(saved)["global_step"]
    assert 3 <= step < steps
    assert f"stopped by SIGUSR1 at step {step} (newest checkpoint: {saved.name})" in text
    ranks = [read_trace(p) for p in sorted(trace.glob("rank*.jsonl"))]
    assert [len(r) for r in ranks] == [step, step]  # both ranks stopped after that update

    resumed = subprocess.run([sys.executable, "-m", "transformer_nmt",
                              *train_argv(corpus, split, **common)],
                             env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = f"step={steps:08d}.ckpt"
    a = load_checkpoint(whole / "checkpoints" / final)["state_dict"]
    b = load_checkpoint(split / "checkpoints" / final)["state_dict"]
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _tracked(argv: list[str]) -> list[str]:
    return [*argv, "--mlflow-experiment", "toy_en-de", "--mlflow-run", "tiny"]


def test_a_killed_then_resumed_run_has_one_point_per_step_and_both_attempt_logs(
    corpus: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    migrated_store: str,
) -> None:
    import json
    import logging

    from mlflow.tracking import MlflowClient

    from transformer_nmt.training.module import TranslationModule

    caplog.set_level(logging.INFO)  # as the CLI sets it (pytest's handlers come first here)
    uri = migrated_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    run = tmp_path / "run"
    argv = _tracked(train_argv(corpus, run, max_steps=12, log_every_steps=1))
    original = TranslationModule.training_step

    def killed(self, batch, batch_idx):
        if self.global_step == 11:  # update 11 is logged, not checkpointed (every 5)
            raise RuntimeError("killed during update 12")
        return original(self, batch, batch_idx)

    monkeypatch.setattr(TranslationModule, "training_step", killed)
    with pytest.raises(RuntimeError, match="killed during update 12"):
        main(argv)
    client = MlflowClient(tracking_uri=uri)
    run_id = json.loads((run / "mlflow_run.json").read_text())["run_id"]
    steps = sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))
    assert steps == list(range(1, 12))  # the killed attempt's points, past its checkpoint
    checkpoints = [p.name for p in list_checkpoints(run / "checkpoints")]
    assert checkpoints == ["step=00000005.ckpt", "step=00000010.ckpt"]

    monkeypatch.setattr(TranslationModule, "training_step", original)
    assert main(argv) == 0
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["resumed_from"] == "step=00000010.ckpt" and summary["mlflow_points_lost"] == 0
    assert json.loads((run / "mlflow_run.json").read_text())["run_id"] == run_id  # one run
    for key in ("train/loss", "train/lr", "train/tgt_tokens_per_s"):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == list(range(1, 13)), key  # no step twice
    (validation,) = client.get_metric_history(run_id, "val/loss")
    # measured by the killed attempt after its last checkpoint: still in the summary
    assert validation.step == 10 and summary["metrics"]["val/step"] == 10
    assert summary["metrics"]["val/loss"] == pytest.approx(validation.value, rel=1e-6)
    # the x-axis of dev metrics against minutes: one point per validation, at its step, from
    # the metrics history's clock (which goes on across the resume)
    (minutes,) = client.get_metric_history(run_id, "val/train_minutes")
    rows = [r for r in read_metrics(run / "metrics.csv") if "val_loss" in r.values]
    assert minutes.step == 10 and [r.step for r in rows] == [10]
    assert minutes.value == pytest.approx(rows[0].elapsed_s / 60, rel=1e-6)

    # Each attempt's own log survives beside the checkpoints (Snakemake deletes the job's log).
    first, second = sorted((run / "logs").glob("attempt-*.log"))
    assert first.name.startswith("attempt-001-") and second.name.startswith("attempt-002-")
    killed_log = first.read_text()
    assert "step 11/12" in killed_log and "step 12/12" not in killed_log
    assert "attempt ended by RuntimeError" in killed_log and "killed during update 12" in killed_log
    assert "GPU available" in killed_log  # Lightning's own lines too
    resumed_log = second.read_text()
    assert "resuming from" in resumed_log and "step=00000010.ckpt" in resumed_log
    assert "step 12/12" in resumed_log and "wrote " in resumed_log


def test_a_full_disk_under_mlflow_is_one_notice_and_training_goes_on(
    corpus: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import json
    import logging

    from mlflow.tracking import MlflowClient

    from transformer_nmt import tracking

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setattr(tracking.stage, "_noticed", set())
    terminal = tmp_path / "terminal.txt"  # what Snakemake's stderr (descriptor 3) receives
    fd = os.open(terminal, os.O_WRONLY | os.O_CREAT)
    monkeypatch.setenv(tracking.NOTICE_FD_ENV, str(fd))
    refused: list[int] = []
    healthy = MlflowClient.log_batch

    def full_disk(self, run_id, metrics=(), **kwargs):
        if metrics:  # params and tags (logged before training) still go in
            refused.append(len(metrics))
            raise OSError(errno.ENOSPC, "No space left on device")
        return healthy(self, run_id, metrics=metrics, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", full_disk)
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        assert main(_tracked(train_argv(corpus, run, max_steps=10))) == 0
    os.close(fd)
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["final_step"] == 10
    assert summary["mlflow_points_lost"] == sum(refused) and len(refused) >= 2
    (line,) = terminal.read_text().splitlines()
    assert "MLflow: could not log" in line and "No space left on device" in line
    messages = [r.getMessage() for r in caplog.records]
    assert sum("could not log" in m and "metric point" in m for m in messages) == 1
    assert any(f"{sum(refused)} metric point(s) were not logged" in m for m in messages)
