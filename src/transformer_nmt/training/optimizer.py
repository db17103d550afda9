"""§5.3: Adam and the learning-rate schedule of eq. (3), with the cooldown flag.

No Lightning here: plain functions the LightningModule calls.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR


def paper_lr(step: int, d_model: int, warmup: int = 4000, scale: float = 1.0) -> float:
    """§5.3 eq. (3): lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    ``step`` counts optimiser updates from 1; step <= 0 gives 0.0 (no division by zero).
    ``scale`` (flag, default 1 = the paper) multiplies the whole schedule.
    """
    if step <= 0:
        return 0.0
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def cooldown_factor(step: int, max_steps: int | None, cooldown_steps: int | None) -> float:
    """Flag (paper: none): the last ``cooldown_steps`` updates before ``max_steps`` scale the
    §5.3 learning rate down linearly, update k by (max_steps - k + 1) / cooldown_steps, so the
    last update takes 1/cooldown_steps of it. Annealing the rate at the end of a short run
    gives the low-noise weights that checkpoint averaging (§6.1) otherwise approximates.
    ``cooldown_steps`` None (the paper) = 1.0 everywhere."""
    if cooldown_steps is None or max_steps is None:
        return 1.0
    return min(1.0, max(0.0, (max_steps - step + 1) / cooldown_steps))


def build_optimizer(
    parameters: Iterable[torch.nn.Parameter] | Iterable[dict],
    *,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    fused: bool | None = None,
) -> torch.optim.Adam:
    """§5.3 Adam with beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9.

    The base learning rate is 1.0: ``build_scheduler`` multiplies it by ``paper_lr``.
    ``fused`` is passed to ``torch.optim.Adam`` (speed only; None = PyTorch's default, the
    multi-tensor "foreach" path): ``FUSED_ADAM_DEVICES`` lists where the trainer fuses it.
    """
    return torch.optim.Adam(parameters, lr=1.0, betas=tuple(betas), eps=eps, fused=fused)


# Devices whose parameters get torch's fused Adam kernel (one kernel over all parameters). On
# CPU it is ~4x faster than the default foreach path for the tiny model's 7.6M parameters
# (benchmarks/log/2026-11-22.md), the same update to rounding (tests/test_optimizer.py).
FUSED_ADAM_DEVICES = ("cuda", "cpu")


class PaperSchedule:
    """The LambdaLR factor for scheduler epoch e (= updates done so far): ``paper_lr(e + 1)``,
    times ``cooldown_factor(e + 1, max_steps, cooldown_steps)``.

    A callable object rather than a lambda so that LambdaLR saves its settings in checkpoints.
    ``max_steps`` may change on a resume: ``follow_max_steps`` sets it after the state loads.
    """

    def __init__(
        self,
        d_model: int,
        warmup: int = 4000,
        scale: float = 1.0,
        cooldown_steps: int | None = None,
        max_steps: int | None = None,
    ) -> None:
        self.d_model, self.warmup, self.scale = d_model, warmup, scale
        self.cooldown_steps, self.max_steps = cooldown_steps, max_steps

    def __call__(self, epoch: int) -> float:
        # A checkpoint from before the cooldown existed loads fine: LambdaLR updates this
        # freshly built object's attributes with the saved ones, and these two keep their values.
        factor = cooldown_factor(epoch + 1, self.max_steps, self.cooldown_steps)
        return paper_lr(epoch + 1, self.d_model, self.warmup, self.scale) * factor


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    d_model: int,
    warmup: int = 4000,
    scale: float = 1.0,
    cooldown_steps: int | None = None,
    max_steps: int | None = None,
) -> LambdaLR:
    """A ``LambdaLR`` stepped once per optimiser update: update k (k = 1, 2, ...) uses
    ``paper_lr(k, d_model, warmup, scale) * cooldown_factor(k, max_steps, cooldown_steps)``.
    Needs an optimiser whose base lr is 1.0 (``build_optimizer``)."""
    for group in optimizer.param_groups:
        base = group.get("initial_lr", group["lr"])
        if base != 1.0:
            raise ValueError(
                f"build_scheduler needs optimizer lr 1.0 (the schedule is absolute), got {base}"
            )
    if warmup <= 0:
        raise ValueError(f"warmup must be a positive number of steps, got {warmup}")
    if cooldown_steps is not None and max_steps is None:
        raise ValueError("a learning-rate cooldown needs max_steps (where it ends)")
    return LambdaLR(optimizer, PaperSchedule(d_model, warmup, scale, cooldown_steps, max_steps))


def follow_max_steps(scheduler: LambdaLR, max_steps: int) -> None:
    """After a resume with another ``max_steps``: the cooldown ends there, and the coming
    update's learning rate (restored with the optimizer state) is recomputed for it."""
    groups = scheduler.optimizer.param_groups
    for schedule, group in zip(scheduler.lr_lambdas, groups, strict=True):
        if isinstance(schedule, PaperSchedule) and schedule.max_steps != max_steps:
            schedule.max_steps = max_steps
            group["lr"] = group.get("initial_lr", 1.0) * schedule(scheduler.last_epoch)
