"""Resuming a run: step, schedule, data and weights; new geometries, changed settings, re-runs."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from tests.training_helpers import read_trace, spawn_training, train_argv
from transformer_nmt.cli import main
from transformer_nmt.data.sampler import TokenBatchSampler
from transformer_nmt.data.token_array import TokenArray
from transformer_nmt.runs.checkpoints import is_weights_only, list_checkpoints, load_checkpoint
from transformer_nmt.training.optimizer import paper_lr


def test_resume_continues_step_lr_data_and_weights(
    corpus: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Train 20 steps, then run again with max_steps=40: identical to 40 steps in one go."""
    caplog.set_level(logging.INFO)
    # Resuming at step 20 must be mid-epoch, so that the data position matters.
    train_src = TokenArray(corpus["bin"] / "train.en")
    train_tgt = TokenArray(corpus["bin"] / "train.de")
    per_epoch = len(
        TokenBatchSampler(train_src.lengths, train_tgt.lengths, max_tokens=64, shuffle=True)
    )
    assert 20 % per_epoch != 0 and per_epoch < 40

    whole, split = tmp_path / "whole", tmp_path / "split"
    monkeypatch.setenv("TRANSFORMER_NMT_TRACE_BATCHES", str(whole / "trace"))
    assert main(train_argv(corpus, whole, max_steps=40)) == 0
    # the log names the loss the run uses (fused_loss auto: off on a CPU; fp32: projected)
    assert (
        "loss (§5.4): projected by chunks of rows, no [tokens x V] logits (CPU fast path "
        "projected_loss) (train.fused_loss: auto on cpu)" in caplog.text
    )
    monkeypatch.setenv("TRANSFORMER_NMT_TRACE_BATCHES", str(split / "trace"))
    assert main(train_argv(corpus, split, max_steps=20)) == 0
    first = json.loads((split / "train_summary.json").read_text())
    assert first["final_step"] == 20 and first["resumed_from"] is None
    caplog.clear()
    assert main(train_argv(corpus, split, max_steps=40)) == 0
    assert "resuming from" in caplog.text and "step=00000020.ckpt at step 20" in caplog.text

    summary = json.loads((split / "train_summary.json").read_text())
    assert summary["final_step"] == 40 and summary["resumed_from"] == "step=00000020.ckpt"
    # keep_checkpoints=3: the newest three, every 5 steps, the resumed-from file pruned too.
    expected = ["step=00000030.ckpt", "step=00000035.ckpt", "step=00000040.ckpt"]
    assert [p.name for p in list_checkpoints(split / "checkpoints")] == expected
    assert summary["checkpoints"] == expected
    assert math.isfinite(summary["metrics"]["train/loss"])
    assert math.isfinite(summary["metrics"]["val/loss"])

    a = load_checkpoint(whole / "checkpoints" / "step=00000040.ckpt")
    b = load_checkpoint(split / "checkpoints" / "step=00000040.ckpt")
    assert a["global_step"] == b["global_step"] == 40
    # The schedule continued: the next update would use paper_lr(41).
    lr_next = paper_lr(41, 32, warmup=10)
    for ckpt in (a, b):
        assert ckpt["lr_schedulers"][0]["last_epoch"] == 40
        assert ckpt["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(lr_next)
        assert ckpt["optimizer_states"][0]["state"][0]["step"] == 40
    # Same batches in the same order, across the resume point (mid-epoch).
    trace_a = [(r["epoch"], r["index"]) for r in read_trace(whole / "trace" / "rank0.jsonl")]
    trace_b = [(r["epoch"], r["index"]) for r in read_trace(split / "trace" / "rank0.jsonl")]
    assert len(trace_a) == len(trace_b) == 40
    assert trace_b == trace_a
    # Same final weights (dropout is reseeded per step, so it matches too).
    for key, value in a["state_dict"].items():
        assert torch.equal(b["state_dict"][key], value), key  # bit for bit, on one machine

    # A re-run with a changed logging interval (not a learning setting) only rewrites the
    # summary; it never trains or saves again.
    mtime = (split / "checkpoints" / "step=00000040.ckpt").stat().st_mtime_ns
    assert main(train_argv(corpus, split, max_steps=40, log_every_steps=10)) == 0
    assert (split / "checkpoints" / "step=00000040.ckpt").stat().st_mtime_ns == mtime
    again = json.loads((split / "train_summary.json").read_text())
    assert again["final_step"] == 40 and again["trained_this_job"] is False
    assert not (split / "superseded").exists()
    # Lowering max_steps below the newest checkpoint is refused, not an overwrite.
    assert main(train_argv(corpus, split, max_steps=30)) == 2


def test_a_resume_with_more_steps_moves_the_lr_cooldown_to_the_new_end(
    corpus: dict[str, Path], tmp_path: Path
) -> None:
    """lr_cooldown_steps follows max_steps: a run cooled down towards step 20 and resumed with
    max_steps 30 trains at the §5.3 rate again and cools down towards 30 (the checkpoint's
    schedule said 20)."""
    from transformer_nmt.runs.layout import METRICS_FILE
    from transformer_nmt.runs.metrics_history import read_metrics

    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=20, lr_cooldown_steps=10)) == 0
    assert main(train_argv(corpus, run, max_steps=30, lr_cooldown_steps=10)) == 0
    # the lr of update u (logged every 5): the §5.3 rate times (end + 1 - u) / 10 over the last
    # 10 updates before the end: 20 in the first job, 30 after the resume
    logged = {r.step: r.values["lr"] for r in read_metrics(run / METRICS_FILE) if "lr" in r.values}
    factors = {5: 1.0, 10: 1.0, 15: 0.6, 20: 0.1, 25: 0.6, 30: 0.1}
    assert logged == pytest.approx({u: paper_lr(u, 32, warmup=10) * f for u, f in factors.items()})
    # the newest checkpoint holds the schedule's state: update 31 would be at 0/10 of the rate
    ckpt = load_checkpoint(run / "checkpoints" / "step=00000030.ckpt")
    assert ckpt["optimizer_states"][0]["param_groups"][0]["lr"] == 0.0
    metrics = json.loads((run / "train_summary.json").read_text())["metrics"]
    assert math.isfinite(metrics["train/loss"])


def test_a_new_batch_geometry_resumes_with_the_step_and_the_schedule(
    corpus: dict[str, Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    migrated_store: str,
) -> None:
    """max_tokens halves the accumulation (the update keeps tokens_per_update): the run goes on
    from its newest checkpoint, with the step count, the §5.3 schedule and Adam's state, and
    says so; nothing is moved aside. MLflow holds the geometry as tags, which may change within
    a run (tests/test_tracking.py: a geometry change alone does not supersede the run)."""
    from mlflow.tracking import MlflowClient

    uri = migrated_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracked = ["--mlflow-experiment", "toy_en-de", "--mlflow-run", "tiny"]
    run = tmp_path / "run"
    first = {"max_tokens": 64, "tokens_per_update": 128}  # 2 micro-batches per update
    assert main([*train_argv(corpus, run, max_steps=10, **first), *tracked]) == 0
    caplog.set_level(logging.INFO)
    second = train_argv(corpus, run, max_steps=20, max_tokens=128, tokens_per_update=128)
    assert main([*second, *tracked]) == 0
    assert "in a new batch geometry (train.max_tokens: 64 -> 128)" in caplog.text
    client = MlflowClient(uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "toy_en-de"]
    mlrun = client.search_runs([experiment.experiment_id], order_by=["start_time DESC"])[0]
    assert mlrun.data.tags["train.max_tokens"] == mlrun.data.tags["train.micro_batch_tokens"]
    assert mlrun.data.tags["train.max_tokens"] == "128"
    assert "train.max_tokens" not in mlrun.data.params
    assert mlrun.data.tags["train.precision_chosen"].startswith("32-true (auto on this CPU: ")
    assert mlrun.data.params["train.tokens_per_update"] == "128"
    assert not (run / "superseded").exists()
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["resumed_from"] == "step=00000010.ckpt" and summary["final_step"] == 20
    assert summary["train_config"]["max_tokens"] == 128
    # one record of the job's resolved settings: the summary's and MLflow's tags agree
    resolved = summary["resolved"]
    assert resolved["max_tokens"] == 128 and resolved["accumulation"] == 1
    assert resolved["accelerator"] == "cpu" and resolved["devices"] == 1
    chosen = f"{resolved['precision']} ({resolved['precision_why']})"
    assert mlrun.data.tags["train.precision_chosen"] == chosen
    ckpt = load_checkpoint(run / "checkpoints" / "step=00000020.ckpt")
    assert ckpt["lr_schedulers"][0]["last_epoch"] == 20
    lr_next = paper_lr(21, 32, warmup=10)
    assert ckpt["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(lr_next)
    assert ckpt["optimizer_states"][0]["state"][0]["step"] == 20
    # A change of tokens_per_update changes the update itself: that trains from scratch.
    assert main(train_argv(corpus, run, max_steps=20, max_tokens=128, tokens_per_update=256)) == 0
    assert "train.tokens_per_update: 128 -> 256" in caplog.text
    assert (run / "superseded").is_dir()


def test_a_new_geometry_continues_the_epoch_after_the_same_share_of_its_batches(
    corpus: dict[str, Path],
) -> None:
    from torch.utils.data import DataLoader

    from transformer_nmt.training.resume import ResumableDataLoader

    src = TokenArray(corpus["bin"] / "train.en")
    tgt = TokenArray(corpus["bin"] / "train.de")

    def loader(max_tokens: int) -> ResumableDataLoader:
        sampler = TokenBatchSampler(src.lengths, tgt.lengths, max_tokens=max_tokens, shuffle=True)
        return ResumableDataLoader(DataLoader(range(len(src)), sampler=sampler, batch_size=None))

    small, large = loader(64), loader(128)
    assert len(small) > len(large) > 1
    small.sampler.set_epoch(2)
    small.consumed = len(small) // 2
    state = small.state_dict()
    assert state == {"epoch": 2, "consumed": len(small) // 2, "batches": len(small)}
    large.load_state_dict(state)
    assert large.sampler.epoch == 2
    assert large.sampler.skip == round(state["consumed"] * len(large) / len(small))
    same = loader(64)
    same.load_state_dict(state)  # the same geometry resumes exactly where it was
    assert same.sampler.skip == state["consumed"]
    same.load_state_dict({"epoch": 2, "consumed": 3})  # a state saved before "batches" existed
    assert same.sampler.skip == 3


def test_changed_learning_settings_retrain_and_keep_the_old_checkpoints_aside(
    corpus: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A changed lr_scale (or any setting that changes what is learned) trains from scratch:
    the old checkpoints move to superseded/<time>/, named in the log, never deleted."""
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=10)) == 0
    first = load_checkpoint(run / "checkpoints" / "step=00000010.ckpt")
    caplog.set_level(logging.INFO)
    assert main(train_argv(corpus, run, max_steps=10, lr_scale=0.5)) == 0
    (moved,) = (run / "superseded").iterdir()
    assert f"its checkpoints moved to {moved}" in caplog.text
    assert "train.lr_scale: 1.0 -> 0.5" in caplog.text
    assert [p.name for p in list_checkpoints(moved)] == [
        p.name for p in list_checkpoints(run / "checkpoints")
    ]
    torch.testing.assert_close(
        load_checkpoint(moved / "step=00000010.ckpt")["state_dict"], first["state_dict"]
    )
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["trained_this_job"] is True and summary["resumed_from"] is None
    assert summary["superseded"] == str(moved)
    assert summary["train_config"]["lr_scale"] == 0.5
    retrained = load_checkpoint(run / "checkpoints" / "step=00000010.ckpt")
    assert not torch.equal(
        retrained["state_dict"]["model.src_embed.weight"],
        first["state_dict"]["model.src_embed.weight"],
    )


def test_a_resumed_job_without_validation_still_reports_the_last_one(
    corpus: dict[str, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=10)) == 0  # validates at step 10
    first = json.loads((run / "train_summary.json").read_text())["metrics"]
    assert main(train_argv(corpus, run, max_steps=12)) == 0  # resumes; no validation at 11-12
    second = json.loads((run / "train_summary.json").read_text())["metrics"]
    assert second["val/loss"] == pytest.approx(first["val/loss"])
    assert second["val/step"] == 10


def test_a_job_killed_before_its_final_validation_validates_the_last_checkpoint_on_rerun(
    corpus: dict[str, Path], tmp_path: Path
) -> None:
    """Lightning saves step N's checkpoint before step N's validation: a job killed between
    the two is at max_steps on rerun, and reports the final model's validation, not an older
    one (or none)."""
    run = tmp_path / "run"
    argv = train_argv(corpus, run, max_steps=10, val_every_steps=5, checkpoint_every_steps=5)
    assert main(argv) == 0
    final = json.loads((run / "train_summary.json").read_text())["metrics"]
    assert final["val/step"] == 10
    # the kill: not finished, no summary, and the last validation kept is step 5's
    (run / "train_summary.json").unlink()
    (run / "checkpoints" / "finished.json").unlink()
    last = run / "checkpoints" / "last_validation.json"
    last.write_text(json.dumps({"step": 5, "metrics": {"val/loss": 99.0}}))
    assert main(argv) == 0
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["trained_this_job"] is False and summary["final_step"] == 10
    metrics = summary["metrics"]
    assert metrics["val/step"] == 10
    for key in ("val/loss", "val/nll", "val/ppl"):  # the same weights, the same dev set
        assert metrics[key] == pytest.approx(final[key], rel=1e-5), key
    assert json.loads(last.read_text())["step"] == 10
    # a last step that the fit loop does not validate (12, validations every 5) is not
    # validated on rerun either: the summary is the uninterrupted run's
    other = tmp_path / "other"
    argv = train_argv(corpus, other, max_steps=12, val_every_steps=5, checkpoint_every_steps=4)
    assert main(argv) == 0
    (other / "train_summary.json").unlink()
    (other / "checkpoints" / "finished.json").unlink()
    assert main(argv) == 0
    assert json.loads((other / "train_summary.json").read_text())["metrics"]["val/step"] == 10


def test_a_forced_rerun_of_a_finished_run_trains_again(
    corpus: dict[str, Path], tmp_path: Path
) -> None:
    """snakemake --forcerun train re-runs the job with unchanged settings: from scratch."""
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=5)) == 0
    (run / "train_summary.json").unlink()  # Snakemake removes a job's outputs before it runs
    assert main(train_argv(corpus, run, max_steps=5)) == 0
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["trained_this_job"] is True and summary["superseded"] is not None
    assert len(list((run / "superseded").iterdir())) == 1
    # A run killed after its last checkpoint but before it finished is resumed, not redone.
    (run / "checkpoints" / "finished.json").unlink()
    assert main(train_argv(corpus, run, max_steps=5)) == 0
    again = json.loads((run / "train_summary.json").read_text())
    assert again["trained_this_job"] is False
    assert len(list((run / "superseded").iterdir())) == 1


@pytest.mark.slow
def test_killed_job_resumes_from_its_newest_checkpoint(
    corpus: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILL a training process after its second checkpoint, then run it again."""
    import time

    run = tmp_path / "run"
    ckpt_dir = run / "checkpoints"
    argv = train_argv(corpus, run, max_steps=10_000, keep_checkpoints=50)
    with open(tmp_path / "killed.log", "w") as log_file:
        proc = spawn_training(argv, log_file)
        deadline = time.monotonic() + 240
        while len(list_checkpoints(ckpt_dir)) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-2000:]
            time.sleep(0.2)
        proc.kill()
        proc.wait(timeout=60)
    before = {p.name: p.stat().st_mtime_ns for p in list_checkpoints(ckpt_dir)}
    assert len(before) >= 2 and not (run / "train_summary.json").exists()
    newest = max(int(name[5:13]) for name in before)
    resumed_from = f"step={newest:08d}.ckpt"
    # Full when killed: the newest, and an older one whose demotion the kill cut off (the
    # process saves step N, then demotes the one before it). The resumed run demotes them.
    full_when_killed = {
        name: load_checkpoint(ckpt_dir / name)["state_dict"]
        for name in before
        if not is_weights_only(load_checkpoint(ckpt_dir / name))
    }
    assert resumed_from in full_when_killed

    caplog.set_level(logging.INFO)
    assert main(train_argv(corpus, run, max_steps=newest + 10, keep_checkpoints=50)) == 0
    assert f"step={newest:08d}.ckpt at step {newest}" in caplog.text
    after = {p.name: p.stat().st_mtime_ns for p in list_checkpoints(ckpt_dir)}
    already_slim = {k: v for k, v in before.items() if k not in full_when_killed}
    assert {k: after[k] for k in already_slim} == already_slim  # nothing slim rewritten
    # each checkpoint full when killed is now kept for averaging, with the same weights
    for name, weights in full_when_killed.items():
        kept = load_checkpoint(ckpt_dir / name)
        assert is_weights_only(kept) and "optimizer_states" not in kept
        assert kept["state_dict"].keys() == weights.keys()
        assert all(torch.equal(kept["state_dict"][k], v) for k, v in weights.items())
    assert set(after) - set(before) == {
        f"step={newest + 5:08d}.ckpt",
        f"step={newest + 10:08d}.ckpt",
    }
    final = load_checkpoint(ckpt_dir / f"step={newest + 10:08d}.ckpt")
    assert final["global_step"] == newest + 10
    assert final["lr_schedulers"][0]["last_epoch"] == newest + 10
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["final_step"] == newest + 10
    assert summary["resumed_from"] == f"step={newest:08d}.ckpt"
