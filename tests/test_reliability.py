"""Where clusters hurt: checkpoints whole or absent on any filesystem, honest exits on
SIGTERM/SIGINT, one trainer per run directory (issue 11)."""

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

from tests.test_training import (  # noqa: F401  (corpus: the fixture)
    REPO_ROOT,
    corpus,
    spawn_training,
    train_argv,
)
from transformer_nmt.checkpoints import list_checkpoints, load_checkpoint
from transformer_nmt.cli import main
from transformer_nmt.io_utils import remove_stale_temps
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
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "TMPDIR": str(other_fs)}
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
    corpus: dict[str, Path],  # noqa: F811
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
    corpus: dict[str, Path],  # noqa: F811
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
