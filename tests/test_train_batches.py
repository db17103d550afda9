"""§5.1 batches in training: accumulation, real tokens, padded widths, validation steps."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from tests.training_helpers import BASE_TRAIN, read_trace, train_argv
from transformer_nmt.cli import main
from transformer_nmt.data.sampler import TokenBatchSampler
from transformer_nmt.training.config import TrainConfig
from transformer_nmt.training.rules import accumulation


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


def test_training_with_pad_multiple_sees_few_shapes_and_keeps_the_bound(
    corpus: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few training steps over varied lengths: with pad_multiple 8 every batch
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
