"""Training: TrainConfig, resume (step, LR, data position, weights), NaN stop, corrupt checkpoint,
2-process DDP (disjoint batches, one set of checkpoints). Tiny models, few steps, CPU."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import checkout_pythonpath
from transformer_nmt.cli import main
from transformer_nmt.data.batch import training_batch
from transformer_nmt.data.sampler import TokenBatchSampler
from transformer_nmt.data.token_array import TokenArray, write_token_array
from transformer_nmt.errors import ConfigError
from transformer_nmt.runs.checkpoints import is_weights_only, list_checkpoints, load_checkpoint
from transformer_nmt.training.config import STRATEGIES, TrainConfig
from transformer_nmt.training.optimizer import paper_lr
from transformer_nmt.training.resolution import resolve, strategy_for
from transformer_nmt.training.rules import accumulation, resolve_precision

VOCAB = 64
MODEL = {
    "preset": "tiny",
    "overrides": {"N": 1, "d_model": 32, "d_ff": 64, "h": 2, "d_k": 16, "d_v": 16},
}
BASE_TRAIN = {
    "max_tokens": 64,
    "tokens_per_update": 64,
    "warmup": 10,
    "accelerator": "cpu",
    "devices": 1,
    "checkpoint_every_steps": 5,
    "keep_checkpoints": 3,
    "val_every_steps": 10,
    "log_every_steps": 5,
    "seed": 3,
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return reversal_corpus(tmp_path_factory.mktemp("corpus"))


def reversal_corpus(root: Path) -> dict[str, Path]:
    """A SentencePiece model with the fixed special ids and a reversal task as token arrays."""
    import sentencepiece as spm

    rng = np.random.default_rng(0)
    text = root / "text.txt"
    words = ["".join(rng.choice(list("abcdefgh"), size=rng.integers(2, 6))) for _ in range(400)]
    text.write_text("\n".join(" ".join(words[i : i + 8]) for i in range(0, 400, 8)) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(root / "spm"),
        vocab_size=VOCAB,
        model_type="bpe",
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        minloglevel=2,
    )
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for split, n in (("train", 120), ("valid", 16)):
        src = [rng.integers(4, VOCAB, size=rng.integers(3, 9)).tolist() for _ in range(n)]
        write_token_array(bin_dir / f"{split}.en", src, VOCAB)
        write_token_array(bin_dir / f"{split}.de", [s[::-1] for s in src], VOCAB)
    return {"spm": root / "spm.model", "bin": bin_dir}


def train_argv(corpus: dict[str, Path], run_dir: Path, **train: object) -> list[str]:
    cfg = {**BASE_TRAIN, **train}
    return [
        "train",
        "--bin-dir",
        str(corpus["bin"]),
        "--spm-model",
        str(corpus["spm"]),
        "--src",
        "en",
        "--tgt",
        "de",
        "--run-dir",
        str(run_dir),
        "--model",
        json.dumps(MODEL),
        "--train",
        json.dumps(cfg),
    ]


def spawn_training(argv: list[str], log_file) -> subprocess.Popen:
    """``python -m transformer_nmt <argv>`` in a subprocess (this checkout's code), output to
    ``log_file``."""
    env = {**os.environ, "PYTHONPATH": checkout_pythonpath()}
    return subprocess.Popen(
        [sys.executable, "-m", "transformer_nmt", *argv],
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )


def read_trace(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _dev_bleu(checkpoint: Path, corpus: dict[str, Path], n: int, *, beam: bool) -> float:
    """sacreBLEU of ``checkpoint``'s weights on the first ``n`` dev sentences of ``corpus``,
    greedy or beam 4, α = 0.6 (§6.1), decoded to text by the SentencePiece model."""
    import sacrebleu
    import sentencepiece as spm

    from transformer_nmt.data.batch import source_batch
    from transformer_nmt.data.vocab import BOS_ID, EOS_ID, PAD_ID
    from transformer_nmt.runs.checkpoints import load_model_file
    from transformer_nmt.search import beam_search, greedy_search

    model, _ = load_model_file(checkpoint)
    sp = spm.SentencePieceProcessor(model_file=str(corpus["spm"]))
    src, tgt = TokenArray(corpus["bin"] / "valid.en"), TokenArray(corpus["bin"] / "valid.de")
    batch = source_batch([src[i] for i in range(n)])
    ids = {"bos_id": BOS_ID, "eos_id": EOS_ID, "pad_id": PAD_ID, "max_len_b": 50}
    if beam:
        out = [
            nbest[0].tokens for nbest in beam_search(model, batch, beam_size=4, alpha=0.6, **ids)
        ]
    else:
        out = greedy_search(model, batch, **ids)
    hyps = [sp.decode(list(map(int, tokens))) for tokens in out]
    refs = [sp.decode(tgt[i].astype(int).tolist()) for i in range(n)]
    return sacrebleu.corpus_bleu(hyps, [refs]).score


def _dev_loss(checkpoint: Path, corpus: dict[str, Path]) -> float:
    """§5.4 label-smoothed loss per target token of ``checkpoint``'s weights on the whole dev
    set of ``corpus``, in one batch."""
    from transformer_nmt.data.batch import flatten
    from transformer_nmt.data.vocab import PAD_ID
    from transformer_nmt.runs.checkpoints import load_model_file
    from transformer_nmt.training.objective import label_smoothed_cross_entropy

    model, meta = load_model_file(checkpoint)
    src, tgt = TokenArray(corpus["bin"] / "valid.en"), TokenArray(corpus["bin"] / "valid.de")
    every = range(len(src))
    batch = training_batch(
        *flatten([src[i] for i in every]), *flatten([tgt[i] for i in every]), every
    )
    batch = {k: torch.from_numpy(v) for k, v in batch.items()}
    with torch.no_grad():
        logits = model(batch["src"], batch["tgt_in"])
    eps = meta["model_config"]["eps_ls"]
    out = label_smoothed_cross_entropy(logits, batch["tgt_out"], eps=eps, pad_id=PAD_ID)
    return float(out.loss / out.ntokens)


# --- TrainConfig -------------------------------------------------------------------------------


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


def test_gradient_accumulation_reaches_tokens_per_update() -> None:
    # §5.1: ~25k real target tokens per step = real tokens per batch x GPUs x accumulation.
    one_gpu = TrainConfig(max_tokens=4096, tokens_per_update=25_000, devices=1)
    eight_gpus = TrainConfig(max_tokens=4096, tokens_per_update=25_000, devices=8)
    two_nodes = TrainConfig(max_tokens=3125, tokens_per_update=25_000, devices=4, num_nodes=2)
    assert accumulation(one_gpu) == 6  # without data: 6 x 4096 = 24,576 is closest to 25,000
    # batches of ~2,900 real target tokens (max_tokens 3125 counts padding and the longer side)
    assert accumulation(one_gpu, tgt_tokens_per_batch=2900.0) == 9  # 26,100 vs 23,200 for 8
    assert accumulation(eight_gpus) == 1
    assert accumulation(two_nodes) == 1
    assert accumulation(two_nodes, tgt_tokens_per_batch=1000.0) == 3  # 8 x 3 x 1000 = 24,000


def test_real_tokens_per_batch_count_sentences_and_eos_without_padding() -> None:
    # 4 sentence pairs; every batch is within max_tokens counting padding and BOS/EOS
    sampler = TokenBatchSampler(
        np.array([3, 5, 2, 9]), np.array([4, 4, 1, 10]), max_tokens=12, shuffle=False
    )
    src, tgt = sampler.real_tokens_per_batch()
    assert src * sampler.num_batches == (3 + 5 + 2 + 9) + 4  # x EOS
    assert tgt * sampler.num_batches == (4 + 4 + 1 + 10) + 4  # y EOS


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


# --- training, resume ---------------------------------------------------------------------------


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


def test_only_the_newest_checkpoint_keeps_the_training_state(
    corpus: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The older checkpoints kept for §6.1 averaging hold the weights only; a run whose newest
    checkpoint is one of them (its full successor deleted by hand) is a clear error, not a
    resume with a fresh optimizer."""
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=20)) == 0
    found = list_checkpoints(run / "checkpoints")
    assert [p.name for p in found] == [f"step={s:08d}.ckpt" for s in (10, 15, 20)]
    payloads = [load_checkpoint(p) for p in found]
    assert [is_weights_only(p) for p in payloads] == [True, True, False]
    assert [("optimizer_states" in p) for p in payloads] == [False, False, True]
    found[-1].unlink()
    (run / "checkpoints" / "finished.json").unlink()
    capsys.readouterr()
    assert main(train_argv(corpus, run, max_steps=30)) == 2
    err = capsys.readouterr().err
    assert "step=00000015.ckpt: the newest checkpoint holds weights only" in err
    assert len(err.strip().splitlines()) == 1
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == [p.name for p in found[:2]]


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
) -> None:
    """max_tokens halves the accumulation (the update keeps tokens_per_update): the run goes on
    from its newest checkpoint, with the step count, the §5.3 schedule and Adam's state, and
    says so; nothing is moved aside. MLflow holds the geometry as tags, which may change within
    a run (tests/test_tracking.py: a geometry change alone does not supersede the run)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
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


def test_log_lines_show_progress_eta_window_loss_and_validation_once(
    corpus: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from transformer_nmt.training.callbacks import _clock

    caplog.set_level(logging.INFO, logger="transformer_nmt.training.callbacks")
    assert main(train_argv(corpus, tmp_path / "run", max_steps=10, val_every_steps=10)) == 0
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("transformer_nmt.training.callbacks")
    ]
    progress = [line for line in lines if line.startswith("step ")]
    assert [line.split("  ")[0] for line in progress] == ["step 5/10 (50%)", "step 10/10 (100%)"]
    for line in progress:
        fields = dict(part.split(" ", 1) for part in line.split("  ")[1:])
        assert {"elapsed", "eta", "loss", "lr", "grad_norm", "tgt"} <= fields.keys()
        assert math.isfinite(float(fields["loss"]))
    assert progress[-1].split("  ")[2] == "eta 0m00s"
    validations = [line for line in lines if line.startswith("validation")]
    assert len(validations) == 1 and validations[0].startswith("validation at step 10: loss ")
    assert not any("val" in line for line in progress)  # validation values only where measured
    assert (_clock(3723.4), _clock(59.6), _clock(float("nan"))) == ("1h02m03s", "1m00s", "?")


def test_validation_falls_on_its_steps_under_gradient_accumulation(
    corpus: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Updates of 2 micro-batches over epochs of an odd number of batches: an epoch's last update
    # must not be short, or the micro-batch-counted validation interval drifts off the steps.
    caplog.set_level(logging.INFO, logger="transformer_nmt.training")
    argv = train_argv(corpus, tmp_path / "run", max_steps=12, tokens_per_update=150,
                      val_every_steps=4, checkpoint_every_steps=4)  # fmt: skip
    assert main(argv) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("§5.1 batch: 2 micro-batch(es)") for line in lines), lines[:5]
    validations = [line.split(":")[0] for line in lines if line.startswith("validation at")]
    assert validations == [f"validation at step {s}" for s in (4, 8, 12)]


def test_metrics_history_survives_a_resume_without_duplicate_steps(
    corpus: dict[str, Path], tmp_path: Path
) -> None:
    """metrics.csv of a run killed after its step-10 rows but before the step-10 checkpoint,
    then resumed from step 5, equals that of an uninterrupted run: the rows beyond step 5 are
    dropped and re-done once; the clock continues from the last row kept."""
    from transformer_nmt.runs.layout import METRICS_FILE
    from transformer_nmt.runs.metrics_history import read_metrics

    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main(train_argv(corpus, whole, max_steps=20)) == 0
    assert main(train_argv(corpus, split, max_steps=10)) == 0
    first = read_metrics(split / METRICS_FILE)
    # as if killed before saving step 10: step 5 still the newest, with its training state
    assert main(train_argv(corpus, tmp_path / "to5", max_steps=5)) == 0
    step_5 = tmp_path / "to5" / "checkpoints" / "step=00000005.ckpt"
    step_5.replace(split / "checkpoints" / step_5.name)
    (split / "checkpoints" / "step=00000010.ckpt").unlink()
    (split / "checkpoints" / "finished.json").unlink()
    with open(split / METRICS_FILE, "a") as handle:
        handle.write("11,3.5,2.")  # a row cut short by the kill
    assert main(train_argv(corpus, split, max_steps=20)) == 0

    expected, rows = read_metrics(whole / METRICS_FILE), read_metrics(split / METRICS_FILE)
    kinds = [(r.step, sorted(r.values)) for r in rows]
    train = ["lr", "train_loss"]
    assert kinds == [(5, train), (10, train), (10, ["val_loss", "val_ppl"]), (15, train),
                     (20, train), (20, ["val_loss", "val_ppl"])]  # fmt: skip
    assert kinds == [(r.step, sorted(r.values)) for r in expected]
    for got, want in zip(rows, expected, strict=True):  # resume-exact training: same values
        assert got.values == pytest.approx(want.values, rel=1e-5)
    assert rows[0] == first[0]  # the row of step 5 kept as it was
    elapsed = [r.elapsed_s for r in rows]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0
    # §5.3: the row's lr is the one its update used; the loss is the window's mean
    for r in rows[::3]:
        assert r.values["lr"] == pytest.approx(paper_lr(r.step, 32, warmup=10))
    assert rows[2].values["val_ppl"] > 1.0


def test_checkpoints_load_weights_only_with_plain_hparams(
    corpus: dict[str, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=5, tokens_per_update=128)) == 0
    (only,) = list_checkpoints(run / "checkpoints")
    ckpt = torch.load(only, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 5
    hp = ckpt["hyper_parameters"]
    assert hp["model_config"]["d_model"] == 32 and hp["vocab"]["size"] == VOCAB
    assert hp["train_config"]["tokens_per_update"] == 128
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["accumulate_grad_batches"] == 2  # 128 / 64 tokens per micro-batch
    assert all(k.startswith("model.") for k in ckpt["state_dict"])


def test_time_based_checkpoints_keep_the_newest_and_validation_bleu(
    corpus: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    argv = train_argv(
        corpus,
        run,
        max_steps=4,
        checkpoint_every_steps=None,
        checkpoint_every_minutes=1e-9,  # due at every step
        keep_checkpoints=2,
        val_every_steps=2,
        val_bleu_sentences=8,
        val_beam_bleu_every_steps=4,
    )
    caplog.set_level(logging.INFO, logger="transformer_nmt.training.callbacks")
    assert main(argv) == 0
    validations = [r.getMessage() for r in caplog.records if "validation at step" in r.getMessage()]
    assert "beam bleu" not in validations[0] and "greedy bleu" in validations[0]  # step 2
    assert "beam bleu" in validations[1]  # step 4: measured there
    names = [p.name for p in list_checkpoints(run / "checkpoints")]
    assert names == ["step=00000003.ckpt", "step=00000004.ckpt"]
    metrics = json.loads((run / "train_summary.json").read_text())["metrics"]
    # the BLEUs of step 4 are those of the weights saved at step 4: greedy on the first 8 dev
    # sentences, the §6.1 beam search on all 16, recomputed here from the checkpoint
    step_4 = run / "checkpoints" / "step=00000004.ckpt"
    assert metrics["val/bleu"] == pytest.approx(_dev_bleu(step_4, corpus, 8, beam=False), abs=1e-9)
    assert metrics["val/bleu_beam"] == pytest.approx(
        _dev_bleu(step_4, corpus, 16, beam=True), abs=1e-9
    )
    assert metrics["val/ppl"] == pytest.approx(math.exp(metrics["val/nll"]))
    # metrics.csv: the BLEUs only in the rows of the validations that measured them
    from transformer_nmt.runs.layout import METRICS_FILE
    from transformer_nmt.runs.metrics_history import read_metrics

    rows = [(r.step, sorted(r.values)) for r in read_metrics(run / METRICS_FILE)]
    val = ["val_bleu", "val_loss", "val_ppl"]
    assert [r for r in rows if "val_loss" in r[1]] == [
        (2, val),
        (4, sorted([*val, "val_bleu_beam"])),
    ]


def test_corrupt_newest_checkpoint_is_named_and_not_skipped(
    corpus: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=5)) == 0
    bad = run / "checkpoints" / "step=00000010.ckpt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    capsys.readouterr()
    assert main(train_argv(corpus, run, max_steps=15)) == 2
    err = capsys.readouterr().err
    assert "step=00000010.ckpt" in err and "cannot be read" in err
    assert "delete it (or move it away) to resume from the previous one" in err
    assert err.rstrip().endswith("step=00000005.ckpt")
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == [
        "step=00000005.ckpt",
        "step=00000010.ckpt",
    ]
    # where the previous one was kept for averaging (weights only) it cannot resume either
    other = tmp_path / "other"
    assert main(train_argv(corpus, other, max_steps=10)) == 0
    (other / "checkpoints" / "step=00000010.ckpt").write_bytes(b"PK\x03\x04 broken later")
    capsys.readouterr()
    assert main(train_argv(corpus, other, max_steps=20)) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith(
        f"move {other / 'checkpoints'} aside to train this run from scratch"
    )


def test_nan_loss_stops_and_keeps_last_good_checkpoint(
    corpus: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from transformer_nmt.training.module import TranslationModule

    original = TranslationModule._loss

    def poisoned(self, batch, **options):
        out = original(self, batch, **options)
        if self.global_step >= 12:  # the 13th update sees a NaN loss
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(TranslationModule, "_loss", poisoned)
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=20)) == 2
    err = capsys.readouterr().err
    assert "non-finite training loss" in err and "at step 13" in err
    assert "last good checkpoint: step=00000010.ckpt" in err
    kept = list_checkpoints(run / "checkpoints")
    assert [p.name for p in kept] == ["step=00000005.ckpt", "step=00000010.ckpt"]
    for value in load_checkpoint(kept[-1])["state_dict"].values():
        assert torch.isfinite(value).all()
    assert not (run / "train_summary.json").exists()


def test_nan_gradient_stops_before_the_optimizer_step(
    corpus: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from transformer_nmt.training.module import TranslationModule

    original = TranslationModule._loss

    def poisoned(self, batch, **options):
        out = original(self, batch, **options)
        if self.global_step >= 7:  # finite loss, NaN gradient: 0 * d/dx sqrt(x) at x = 0
            w = self.model.src_embed.weight[4, 0]
            out.loss = out.loss + 0.0 * torch.sqrt(w * 0.0)
        return out

    monkeypatch.setattr(TranslationModule, "_loss", poisoned)
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=20)) == 2
    err = capsys.readouterr().err
    assert "non-finite gradient norm" in err and "at step 8" in err
    kept = list_checkpoints(run / "checkpoints")
    assert [p.name for p in kept] == ["step=00000005.ckpt"]
    for value in load_checkpoint(kept[-1])["state_dict"].values():
        assert torch.isfinite(value).all()


def test_a_run_stopped_early_writes_no_summary_and_says_how_to_resume(
    corpus: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from transformer_nmt.training.module import TranslationModule

    original = TranslationModule.training_step

    def stopping(self, batch, batch_idx):
        if self.global_step == 7:
            self.trainer.should_stop = True  # as an early-stopping callback or a signal would
        return original(self, batch, batch_idx)

    monkeypatch.setattr(TranslationModule, "training_step", stopping)
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, max_steps=20)) == 2
    err = capsys.readouterr().err
    assert "before max_steps=20" in err and "newest checkpoint: step=00000005.ckpt" in err
    assert not (run / "train_summary.json").exists()
    monkeypatch.setattr(TranslationModule, "training_step", original)
    assert main(train_argv(corpus, run, max_steps=20)) == 0
    assert json.loads((run / "train_summary.json").read_text())["final_step"] == 20


def test_mlflow_tracking_of_a_training_run(
    corpus: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from mlflow.tracking import MlflowClient

    from transformer_nmt.io_utils import sha256_file

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # The data stages' records beside their outputs: spm.json and clean_report.json.
    spm_model = tmp_path / "spm" / "spm.model"
    spm_model.parent.mkdir()
    shutil.copy(corpus["spm"], spm_model)
    spm_settings = {"vocab_size": VOCAB, "seed": 1, "input_lines": {"train.en": 3}, "sha256": "x"}
    (tmp_path / "spm" / "spm.json").write_text(json.dumps(spm_settings))
    report = tmp_path / "clean_report.json"
    rules = {"max_length": 250, "dedupe": True, "max_sentences": None}
    report.write_text(json.dumps({"dataset": "toy", "pair": "en-de", "rules": rules}))
    argv = train_argv({**corpus, "spm": spm_model}, tmp_path / "run", max_steps=10)
    argv += ["--mlflow-experiment", "toy_en-de", "--mlflow-run", "tiny"]
    argv += ["--clean-report", str(report)]
    assert main(argv) == 0
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("toy_en-de")
    (run,) = client.search_runs([exp.experiment_id])
    params = run.data.params
    assert params["train.max_steps"] == "10" and params["train.model.d_model"] == "32"
    assert (
        run.data.tags["data.spm_sha256"]
        == json.loads((tmp_path / "run" / "train_summary.json").read_text())["vocab"]["sha256"]
    )
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in losses) == [5, 10]
    assert all(math.isfinite(m.value) for m in losses)
    assert client.get_metric_history(run.info.run_id, "val/loss")
    assert client.get_metric_history(run.info.run_id, "train/lr")
    assert client.get_metric_history(run.info.run_id, "train/grad_norm")
    rates = client.get_metric_history(run.info.run_id, "train/tgt_tokens_per_s")
    assert sorted(m.step for m in rates) == [5, 10] and all(m.value > 0 for m in rates)
    artifacts = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"data", "train_summary.json"} <= artifacts
    assert run.info.status == "FINISHED" and run.info.end_time >= run.info.start_time
    # The data stages' settings as data.* params, the data's checksums as tags.
    data_params = {k: v for k, v in params.items() if k.startswith("data.")}
    assert data_params == {
        "data.vocab_size": str(VOCAB), "data.spm.vocab_size": str(VOCAB), "data.spm.seed": "1",
        "data.dataset": "toy", "data.pair": "en-de", "data.clean.max_length": "250",
        "data.clean.dedupe": "True", "data.clean.max_sentences": "null",
    }  # fmt: skip
    for split in ("train", "valid"):
        for lang in ("en", "de"):
            for kind in ("tokens", "offsets"):
                path = corpus["bin"] / f"{split}.{lang}.{kind}.npy"
                assert run.data.tags[f"data.{split}.{lang}.{kind}_sha256"] == sha256_file(path)

    # Retraining from scratch with unchanged params (a forced re-run) opens a fresh run whose
    # description says why; the old run points to it.
    (tmp_path / "run" / "train_summary.json").unlink()
    assert main(argv) == 0
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
    assert len(runs) == 2
    newest, old = runs
    assert old.data.tags["transformer_nmt.superseded_by"] == newest.info.run_id
    assert "forced re-run" in newest.data.tags["mlflow.note.content"]
    assert newest.data.params["data.vocab_size"] == str(VOCAB)  # logged anew, not copied


def test_mlflow_logger_shifts_steps_and_survives_a_tracking_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from transformer_nmt.training.callbacks import StageRunLogger

    class FakeRun:
        run_id, run_name = "r1", "tiny"

        def __init__(self) -> None:
            self.logged: list[tuple[dict, int | None]] = []
            self.down = False

        def logged_steps(self, key: str, *, retry: bool = True) -> set[int]:
            return set()

        def log_metrics(self, metrics: dict, step: int | None = None, *, retry=True) -> None:
            if self.down:
                raise ConnectionError("tracking server unreachable")
            self.logged.append((metrics, step))

    run = FakeRun()
    logger = StageRunLogger(run)
    logger.log_metrics({"train/loss": torch.tensor(2.5), "epoch": 0.0}, step=4)
    assert run.logged == [({"train/loss": 2.5}, 5)]
    run.down = True
    with caplog.at_level(logging.WARNING):
        logger.log_metrics({"train/loss": 2.0}, step=9)
    assert "could not log 1 metric point(s) of run 'tiny' at step 10" in caplog.text


# --- distributed -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_process_ddp_disjoint_batches_and_single_checkpoints(
    corpus: dict[str, Path], tmp_path: Path, strategy: str
) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "TRANSFORMER_NMT_TRACE_BATCHES": str(run / "trace")}
    env["PYTHONPATH"] = checkout_pythonpath()
    argv = train_argv(
        corpus,
        run,
        max_steps=6,
        devices=2,
        strategy=strategy,
        checkpoint_every_steps=3,
        val_every_steps=3,
        val_bleu_sentences=4,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "transformer_nmt", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0 = read_trace(run / "trace" / "rank0.jsonl")
    rank1 = read_trace(run / "trace" / "rank1.jsonl")
    assert len(rank0) == len(rank1) == 6
    seen0 = {i for r in rank0 for i in r["index"]}
    seen1 = {i for r in rank1 for i in r["index"]}
    # 6 of each rank's ~9 batches of epoch 0: no padding repeats, so fully disjoint.
    assert seen0 and seen1 and not seen0 & seen1
    # Checkpoints written once (rank 0), no per-rank duplicates such as step=...-v1.ckpt.
    files = sorted(p.name for p in (run / "checkpoints").iterdir() if p.suffix == ".ckpt")
    assert files == ["step=00000003.ckpt", "step=00000006.ckpt"]
    assert list_checkpoints(run / "checkpoints") == [run / "checkpoints" / f for f in files]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["final_step"] == 6
    # Validation sums are reduced over both ranks: the loss is the whole dev set's, each
    # sentence once, as one process computes it from step 6's weights; BLEU is computed on
    # rank 0 and broadcast.
    step_6 = run / "checkpoints" / "step=00000006.ckpt"
    metrics = summary["metrics"]
    assert metrics["val/loss"] == pytest.approx(_dev_loss(step_6, corpus), rel=1e-5)
    assert metrics["val/bleu"] == pytest.approx(_dev_bleu(step_6, corpus, 4, beam=False), abs=1e-9)


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


def test_training_with_pad_multiple_sees_few_shapes_and_keeps_the_bound(
    corpus: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few training steps over varied lengths (issue 20 §5): with pad_multiple 8 every batch
    the model sees has widths that are multiples of 8, at most max_tokens tokens, and fewer
    distinct shapes than with widths as they come."""
    shapes = {}
    for multiple in (1, 8):
        run = tmp_path / f"run{multiple}"
        monkeypatch.setenv("TRANSFORMER_NMT_TRACE_BATCHES", str(run / "trace"))
        argv = train_argv(corpus, run, max_steps=12, val_every_steps=12, pad_multiple=multiple)
        assert main(argv) == 0
        trace = read_trace(run / "trace" / "rank0.jsonl")
        assert len(trace) == 12
        seen = {(tuple(r["shape"]["src"]), tuple(r["shape"]["tgt"])) for r in trace}
        for src, tgt in seen:
            assert src[0] * max(src[1], tgt[1]) <= BASE_TRAIN["max_tokens"]
            if multiple == 8:
                assert src[1] % 8 == 0 and tgt[1] % 8 == 0
        shapes[multiple] = seen
    widths = {w for src, tgt in shapes[8] for w in (src[1], tgt[1])}
    assert len(widths) <= 2  # the corpus's rows (3-9 tokens + EOS/BOS) round to 8 or 16
    assert len(shapes[8]) < len(shapes[1])


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
