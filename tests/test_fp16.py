"""fp16 mixed precision with dynamic loss scaling (`precision: auto` on GPUs without bf16, e.g.
V100), on CPU: an overflowed update is skipped and counted and never stops the run, and the
per-token gradient rescaling sees unscaled gradients. The inf step is faked by poisoning one
gradient after backward, as an fp16 overflow leaves it."""

from __future__ import annotations

from unittest import mock

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.amp.grad_scaler import OptState
from torch.utils.data import DataLoader

from tests.test_loss_normalisation import VOCAB, _batches, _model_config
from transformer_nmt.training.config import TrainConfig
from transformer_nmt.training.module import TranslationModule
from transformer_nmt.training.rules import resolve_precision

INIT_SCALE = 2.0**10
POISONED_STEP = 2  # global_step during the poisoned update (the third)


class Probe(TranslationModule):
    """Poisons one gradient during update ``POISONED_STEP``; records the scaler's stage when the
    per-token rescaling runs, and the weights around each update."""

    def __init__(self, *args, scaler: torch.amp.GradScaler, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scaler = scaler
        self.stages: list[OptState] = []
        self.before: dict[int, torch.Tensor] = {}
        self.after: dict[int, torch.Tensor] = {}

    def _weights(self) -> torch.Tensor:
        return torch.cat([p.detach().flatten().clone() for p in self.parameters()])

    def on_after_backward(self) -> None:
        self.before[self.global_step] = self._weights()
        if self.global_step == POISONED_STEP:
            next(self.parameters()).grad.view(-1)[0] = float("inf")

    def on_before_optimizer_step(self, optimizer) -> None:
        self.stages.append(self.scaler._per_optimizer_states[id(optimizer)]["stage"])
        super().on_before_optimizer_step(optimizer)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.after[self.global_step - 1] = self._weights()


def test_an_overflowed_update_is_skipped_counted_and_the_run_goes_on() -> None:
    torch.manual_seed(0)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
    steps = 5
    train = {"accelerator": "cpu", "max_steps": steps, "warmup": 2}
    module = Probe(_model_config(), dict(VOCAB), train, scaler=scaler)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        plugins=[MixedPrecision("16-mixed", "cpu", scaler)],
    )  # fmt: skip
    batches = _batches([(2, 5), (3, 4), (2, 6)] * 2)
    trainer.fit(module, DataLoader(batches, batch_size=None))

    assert trainer.precision == "16-mixed" and trainer.global_step == steps  # never stopped
    assert module.overflow_steps == 1
    # Lightning unscaled before the per-token rescaling (foreach Adam, not fused, under fp16).
    assert module.stages == [OptState.UNSCALED] * steps
    assert not trainer.optimizers[0].defaults.get("fused")
    # The skipped update left the weights as they were; the others moved them.
    assert torch.equal(module.before[POISONED_STEP], module.after[POISONED_STEP])
    for step in set(range(steps)) - {POISONED_STEP}:
        assert not torch.equal(module.before[step], module.after[step]), step
    assert scaler.get_scale() == INIT_SCALE * scaler.get_backoff_factor()


@pytest.mark.parametrize(
    ("cuda", "bf16", "expected"),
    [(True, True, "bf16-mixed"), (True, False, "16-mixed"), (False, False, "32-true")],
    ids=["ampere", "v100", "no-gpu"],
)
def test_auto_precision_is_fp16_with_loss_scaling_on_gpus_without_bf16(
    cuda: bool, bf16: bool, expected: str
) -> None:
    with (
        mock.patch("torch.cuda.is_available", return_value=cuda),
        mock.patch("torch.cuda.is_bf16_supported", return_value=bf16),
        # no GPU: a CPU without bf16 instructions (the CPU classes: the test below)
        mock.patch("torch.cpu._is_amx_tile_supported", return_value=False),
        mock.patch("torch.cpu._is_avx512_bf16_supported", return_value=False),
    ):
        assert resolve_precision(TrainConfig(accelerator="gpu" if cuda else "cpu")) == expected


# torch's probes of the CPU (mocked) and the bf16 support they mean
EACH_CPU_BF16_SUPPORT = pytest.mark.parametrize(
    ("amx", "avx512_bf16", "kind"),
    [(True, True, "amx"), (False, True, "avx512_bf16"), (False, False, "none")],
)


@EACH_CPU_BF16_SUPPORT
def test_auto_precision_on_a_cpu_follows_its_bf16_support_and_says_why(
    amx: bool, avx512_bf16: bool, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One function decides from the CPU's bf16 support (torch's own probes, mocked here) by
    the measured table; the reason is what the train log and MLflow give."""
    from transformer_nmt.training import hardware, preflight
    from transformer_nmt.training.rules import (
        CPU_AUTO_PRECISION,
        cpu_bf16_support,
        precision_choice,
    )

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert cpu_bf16_support() == kind
    cpu = TrainConfig(accelerator="cpu")
    measured, why = CPU_AUTO_PRECISION[kind]
    assert precision_choice(cpu) == (measured, f"auto on this CPU: {why}")
    # a CPU class measured to pay in bf16 trains in it, and plan says the same
    monkeypatch.setitem(CPU_AUTO_PRECISION, kind, ("bf16-mixed", "measured to pay"))
    assert precision_choice(cpu) == ("bf16-mixed", "auto on this CPU: measured to pay")
    assert preflight.resolve_plan_precision(cpu, hardware.cpu_target()) == "bf16-mixed"
    assert precision_choice(TrainConfig(accelerator="cpu", precision="32-true")) == (
        "32-true", "set in the config",
    )  # fmt: skip


def test_auto_pad_multiple_rounds_widths_only_for_16_bit_training(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pad_multiple: auto`` follows the precision the run trains in: 8 in bf16/fp16 (kernels
    per batch shape), 1 in fp32; a number is kept; anything else is a ConfigError naming it."""
    from transformer_nmt.errors import ConfigError
    from transformer_nmt.training.rules import (
        CPU_AUTO_PRECISION,
        cpu_bf16_support,
        pad_multiple_choice,
    )

    for precision, multiple in (("bf16-mixed", 8), ("16-mixed", 8), ("32-true", 1)):
        cfg = TrainConfig(accelerator="cpu", precision=precision, pad_multiple="auto")
        chosen, why = pad_multiple_choice(cfg)
        assert chosen == multiple and why.startswith(f"auto: {precision}")
    # precision: auto decides first, by the CPU's measured table
    monkeypatch.setitem(CPU_AUTO_PRECISION, cpu_bf16_support(), ("bf16-mixed", "pays"))
    assert pad_multiple_choice(TrainConfig(accelerator="cpu", pad_multiple="auto"))[0] == 8
    monkeypatch.setitem(CPU_AUTO_PRECISION, cpu_bf16_support(), ("32-true", "does not pay"))
    assert pad_multiple_choice(TrainConfig(accelerator="cpu", pad_multiple="auto"))[0] == 1
    assert pad_multiple_choice(TrainConfig(precision="bf16-mixed", pad_multiple=3)) == (
        3, "set in the config",
    )  # fmt: skip
    for bad in (0, "eight", 2.5):
        with pytest.raises(
            ConfigError, match="'pad_multiple' must be a positive integer or 'auto'"
        ):
            TrainConfig(pad_multiple=bad)


@EACH_CPU_BF16_SUPPORT
def test_a_config_that_sizes_a_bf16_run_trains_in_bf16_where_the_cpu_has_it(
    amx: bool, avx512_bf16: bool, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``train.by_precision`` with a bf16-mixed entry: ``auto`` on a CPU with bf16 (AMX or
    AVX512-BF16) trains in bf16-mixed with that entry's steps, and says so; a CPU without bf16
    keeps fp32 and the config's own steps. ``plan`` resolves and sizes the same way."""
    from transformer_nmt.training import hardware, preflight
    from transformer_nmt.training.rules import CPU_AUTO_PRECISION, precision_choice

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    bf16_steps = {"max_steps": 2400, "lr_cooldown_steps": 750}
    cfg = TrainConfig(
        accelerator="cpu", max_steps=1600, lr_cooldown_steps=500,
        by_precision={"bf16-mixed": bf16_steps},
    )  # fmt: skip
    precision, why = precision_choice(cfg)
    if kind == "none":
        assert (precision, why) == ("32-true", f"auto on this CPU: {CPU_AUTO_PRECISION['none'][1]}")
        assert (cfg.for_precision(precision).max_steps, cfg.lr_cooldown_steps) == (1600, 500)
    else:
        assert precision == "bf16-mixed"
        assert "train.by_precision: max_steps 2400, lr_cooldown_steps 750" in why
        sized = cfg.for_precision(precision)
        assert (sized.max_steps, sized.lr_cooldown_steps) == (2400, 750)
    assert preflight.resolve_plan_precision(cfg, hardware.cpu_target()) == precision
    # an empty entry (a benchmark's own steps win) still says: a bf16 run is sized
    empty = precision_choice(TrainConfig(accelerator="cpu", by_precision={"bf16-mixed": {}}))
    assert empty[0] == precision and (kind == "none" or empty[1].endswith("as configured)"))
    # without a bf16-mixed entry the CPU's measured table decides, as before
    fp32_only = TrainConfig(accelerator="cpu", by_precision={"32-true": {"max_steps": 3}})
    assert precision_choice(fp32_only)[0] == CPU_AUTO_PRECISION[kind][0]
    # a precision set in the config is sized by its entry (Lightning's two names of fp32 alike)
    for name in ("32-true", "32"):
        assert fp32_only.for_precision(name).max_steps == 3
    assert fp32_only.for_precision("bf16-mixed").max_steps == fp32_only.max_steps


@pytest.mark.parametrize(
    ("by_precision", "message"),
    [
        ({"bf16": {"max_steps": 2}}, "'by_precision.bf16': not a precision"),
        ({"auto": {"max_steps": 2}}, "'by_precision.auto': not a precision"),
        ({"bf16-mixed": {"seed": 2}}, r"key\(s\) \['seed'\] cannot depend on the precision"),
        ({"bf16-mixed": {"max_steps": 0}}, "'by_precision.bf16-mixed': train config key "
         "'max_steps' must be a positive integer, got 0"),
        ({"bf16-mixed": {"val_beam_bleu_every_steps": 15}}, "'by_precision.bf16-mixed': .*"
         "must be a multiple of 'val_every_steps'"),
        ({"bf16-mixed": 2400}, "'by_precision.bf16-mixed' must map train keys to values"),
        ([2400], "'by_precision' must map a precision to train keys"),
    ],
)  # fmt: skip
def test_a_bad_by_precision_entry_is_a_config_error_naming_it(by_precision, message) -> None:
    from transformer_nmt.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        TrainConfig(by_precision=by_precision, val_every_steps=10)
