"""§5.1/§5.4: one optimizer update follows the gradient of the label-smoothed loss summed over
*all* its target tokens divided by their number, across gradient-accumulation micro-batches
and DDP ranks (float64, CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from transformer_nmt.data.batch import flatten, training_batch
from transformer_nmt.training.module import TranslationModule

VOCAB = {"size": 40, "pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3, "sha256": "ab" * 32}
MODEL = {"N": 1, "d_model": 16, "d_ff": 32, "h": 2, "d_k": 8, "d_v": 8, "p_drop": 0.0}
# Micro-batches of very different target token counts (1 x 2 tokens ... 3 x 12 tokens).
SHAPES = [(1, 2), (3, 12), (2, 5), (4, 3)]


def _model_config() -> dict:
    from transformer_nmt.model.config import apply_overrides, get_preset

    return apply_overrides(get_preset("tiny"), MODEL).to_dict()


def _batches(shapes=SHAPES, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    out = []
    for n, length in shapes:
        src = [rng.integers(4, 40, size=rng.integers(2, 8)) for _ in range(n)]
        tgt = [
            rng.integers(4, 40, size=length - rng.integers(0, 2) * (length > 1)) for _ in range(n)
        ]
        batch = training_batch(*flatten(src), *flatten(tgt), list(range(n)))
        out.append({k: torch.from_numpy(v) for k, v in batch.items()})
    return out


def _merge(batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One batch holding every sentence of ``batches`` (right-padded to the longest)."""
    merged = {}
    for key in ("src", "tgt_in", "tgt_out"):
        width = max(b[key].shape[1] for b in batches)
        merged[key] = torch.cat(
            [torch.nn.functional.pad(b[key], (0, width - b[key].shape[1])) for b in batches]
        )
    merged["index"] = torch.arange(len(merged["src"]))
    return merged


class GradientRecorder(TranslationModule):
    """Keeps a copy of the gradient the optimizer would apply (after normalisation)."""

    recorded: dict[str, torch.Tensor] | None = None

    def on_before_optimizer_step(self, optimizer) -> None:
        super().on_before_optimizer_step(optimizer)
        self.recorded = {n: p.grad.detach().clone() for n, p in self.named_parameters()}


def _module(**train: object) -> GradientRecorder:
    torch.manual_seed(0)
    train = {"accelerator": "cpu", "precision": "64-true", "max_steps": 1, **train}
    return GradientRecorder(_model_config(), dict(VOCAB), train).double()


def update_gradient(batches: list[dict[str, torch.Tensor]], accumulate: int, **train) -> dict:
    module = _module(**train)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision="64-true",
        max_steps=1,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    return module.recorded


def _assert_equal_gradients(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-10, atol=1e-12, msg=name)


def test_accumulated_micro_batches_give_the_gradient_of_one_batch() -> None:
    batches = _batches()
    tokens = [int((b["tgt_out"] != 0).sum()) for b in batches]
    assert len(set(tokens)) == len(tokens)  # really different token counts
    one = update_gradient([_merge(batches)], accumulate=1)
    accumulated = update_gradient(batches, accumulate=len(batches))
    _assert_equal_gradients(accumulated, one)
    # the rule this replaces (Lightning's mean of per-micro-batch means) is measurably different
    mean_of_means = _mean_of_per_batch_means(batches)
    assert max(float((mean_of_means[n] - one[n]).abs().max()) for n in one) > 1e-4


def test_chunked_loss_flag_gives_the_same_update_gradient() -> None:
    # train.loss_chunk_tokens: projection + loss 5 target tokens at a time (memory only)
    batches = _batches()
    plain = update_gradient(batches, accumulate=len(batches))
    chunked = update_gradient(batches, accumulate=len(batches), loss_chunk_tokens=5)
    _assert_equal_gradients(chunked, plain)


def _mean_of_per_batch_means(batches: list[dict[str, torch.Tensor]]) -> dict:
    from transformer_nmt.training.objective import label_smoothed_cross_entropy

    module = _module()
    for batch in batches:
        out = label_smoothed_cross_entropy(
            module.model(batch["src"], batch["tgt_in"]), batch["tgt_out"], eps=0.1, pad_id=0
        )
        (out.loss / out.ntokens / len(batches)).backward()
    return {n: p.grad for n, p in module.named_parameters()}


DDP_SCRIPT = """
import sys, torch, lightning as L
from torch.utils.data import DataLoader
sys.path.insert(0, {tests!r})
from test_loss_normalisation import _batches, _module

class RankBatches(L.LightningDataModule):
    def train_dataloader(self):
        rank = self.trainer.global_rank
        return DataLoader(_batches()[rank * 2 : rank * 2 + 2], batch_size=None)

module = _module()
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", precision="64-true",
                    max_steps=1, accumulate_grad_batches=2, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, use_distributed_sampler=False)
trainer.fit(module, datamodule=RankBatches())
if trainer.global_rank == 0:
    torch.save(module.recorded, {out!r})
"""


@pytest.mark.slow
def test_two_ddp_ranks_with_accumulation_give_the_gradient_of_one_batch(tmp_path: Path) -> None:
    out = tmp_path / "ddp_grad.pt"
    script = tmp_path / "ddp_grad.py"
    script.write_text(DDP_SCRIPT.format(tests=str(Path(__file__).parent), out=str(out)))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ddp = torch.load(out, weights_only=True)
    _assert_equal_gradients(ddp, update_gradient([_merge(_batches())], accumulate=1))


@pytest.mark.usefixtures("one_torch_thread")
def test_the_module_runs_the_fused_loss_when_train_fused_loss_says_so(monkeypatch) -> None:
    """``train.fused_loss: true`` reaches the loss (on a CPU too, where auto leaves it off and
    fp32 takes the projected fast path): the same loss and gradients as that path's."""
    import shutil

    from transformer_nmt.training import objective

    if shutil.which(os.environ.get("CXX", "g++")) is None and shutil.which("gcc") is None:
        pytest.skip("torch.compile's CPU backend (inductor) needs a C++ compiler; none found")
    calls = []
    real = objective.label_smoothed_cross_entropy

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(kwargs["fused"])
        return real(*args, **kwargs)

    monkeypatch.setattr(objective, "label_smoothed_cross_entropy", spy)
    batch = _batches()[1]
    runs = []
    for setting in ("auto", True):
        torch.manual_seed(0)
        train = {"accelerator": "cpu", "max_steps": 1, "fused_loss": setting}
        module = TranslationModule(_model_config(), dict(VOCAB), train)
        out = module._loss(batch)
        (out.loss / out.ntokens).backward()
        runs.append((out.loss.detach(), [p.grad.clone() for p in module.parameters()]))
    assert calls == [True]  # auto: the projected path, no logits
    torch.testing.assert_close(runs[1][0], runs[0][0])
    for fused, eager in zip(runs[1][1], runs[0][1], strict=True):
        torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_compiled_training_steps_equal_eager_ones() -> None:
    """``train.compile``: three forward/backward/Adam steps of the torch.compile'd model give
    the eager model's losses and weights (float32; inductor builds C++ kernels on CPU)."""
    import shutil

    if shutil.which(os.environ.get("CXX", "g++")) is None and shutil.which("gcc") is None:
        pytest.skip("torch.compile's CPU backend (inductor) needs a C++ compiler; none found")
    batch = _batches()[1]
    runs = {}
    for compile_ in (False, True):
        torch.manual_seed(0)
        train = {"accelerator": "cpu", "max_steps": 3, "compile": compile_}
        module = TranslationModule(_model_config(), dict(VOCAB), train)
        optimizer = module.configure_optimizers()["optimizer"]
        losses = []
        for _ in range(3):
            out = module._loss(batch)
            (out.loss / out.ntokens).backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(out.loss.detach())
        assert ("_compiled_model" in module.__dict__) == compile_
        runs[compile_] = (torch.stack(losses), dict(module.model.state_dict()))
        assert list(module.state_dict()) == [f"model.{k}" for k in module.model.state_dict()]
    torch.testing.assert_close(runs[True][0], runs[False][0], rtol=1e-5, atol=1e-5)
    for key, value in runs[False][1].items():
        torch.testing.assert_close(runs[True][1][key], value, rtol=1e-4, atol=1e-5, msg=key)
