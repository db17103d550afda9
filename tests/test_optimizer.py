"""§5.3 Adam and the learning-rate schedule of eq. (3), with the cooldown flag."""

from __future__ import annotations

import pytest
import torch

from transformer_nmt.training.optimizer import (
    FUSED_ADAM_DEVICES,
    build_optimizer,
    build_scheduler,
    cooldown_factor,
    follow_max_steps,
    paper_lr,
)


def test_paper_lr_values():
    d_model, warmup = 512, 4000

    def formula(step):
        return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)

    assert paper_lr(1, d_model, warmup) == pytest.approx(d_model**-0.5 * warmup**-1.5)
    assert paper_lr(4000, d_model, warmup) == pytest.approx(formula(4000))
    assert paper_lr(4000, d_model, warmup) == pytest.approx(512**-0.5 * 4000**-0.5)  # the peak
    assert paper_lr(100000, d_model, warmup) == pytest.approx(512**-0.5 * 100000**-0.5)
    assert paper_lr(0, d_model, warmup) == 0.0
    assert paper_lr(100, d_model, warmup, scale=2.0) == pytest.approx(2 * formula(100))
    assert paper_lr(3999, d_model) < paper_lr(4000, d_model) > paper_lr(4001, d_model)


def test_scheduler_gives_update_k_the_lr_of_step_k():
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = build_optimizer([param])
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
    scheduler = build_scheduler(optimizer, d_model=64, warmup=10, scale=0.5)
    seen = []
    for _ in range(15):
        seen.append(optimizer.param_groups[0]["lr"])
        param.grad = torch.ones(2)
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([paper_lr(k, 64, 10, 0.5) for k in range(1, 16)])
    # the schedule survives a checkpoint round trip (resume)
    state = scheduler.state_dict()
    optimizer2 = build_optimizer([torch.nn.Parameter(torch.zeros(2))])
    scheduler2 = build_scheduler(optimizer2, d_model=64, warmup=10, scale=0.5)
    scheduler2.load_state_dict(state)
    assert scheduler2.get_last_lr()[0] == pytest.approx(paper_lr(16, 64, 10, 0.5))


def run_schedule(scheduler, optimizer, updates: int) -> list[float]:
    """The learning rate of each of the next ``updates`` optimizer updates."""
    seen = []
    for _ in range(updates):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return seen


def test_cooldown_scales_the_last_n_updates_down_linearly_and_nothing_before():
    assert [cooldown_factor(k, 10, 4) for k in range(1, 11)] == [1.0] * 6 + [1, 0.75, 0.5, 0.25]
    assert cooldown_factor(3, 10, None) == 1.0 and cooldown_factor(11, 10, 4) == 0.0
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.ones(2)
    optimizer = build_optimizer([param])
    scheduler = build_scheduler(
        optimizer, d_model=64, warmup=4, scale=0.5, cooldown_steps=4, max_steps=10
    )
    seen = run_schedule(scheduler, optimizer, 10)
    expected = [paper_lr(k, 64, 4, 0.5) * cooldown_factor(k, 10, 4) for k in range(1, 11)]
    assert seen == pytest.approx(expected)
    assert seen[:6] == pytest.approx([paper_lr(k, 64, 4, 0.5) for k in range(1, 7)])
    assert seen[-1] == pytest.approx(paper_lr(10, 64, 4, 0.5) / 4)
    with pytest.raises(ValueError, match="max_steps"):
        build_scheduler(build_optimizer([param]), d_model=64, cooldown_steps=4)


def test_a_resume_with_a_later_max_steps_moves_the_cooldown_there():
    # A run with max_steps 10 stopped at 8 (inside its cooldown), resumed with max_steps 20:
    # the saved schedule says 10, the resumed job's 20 wins, from the very next update.
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.ones(2)
    optimizer = build_optimizer([param])
    scheduler = build_scheduler(optimizer, d_model=64, warmup=4, cooldown_steps=4, max_steps=10)
    run_schedule(scheduler, optimizer, 8)
    optimizer2 = build_optimizer([param])
    scheduler2 = build_scheduler(optimizer2, d_model=64, warmup=4, cooldown_steps=4, max_steps=20)
    optimizer2.load_state_dict(optimizer.state_dict())
    scheduler2.load_state_dict(scheduler.state_dict())
    assert scheduler2.lr_lambdas[0].max_steps == 10  # what the checkpoint said
    follow_max_steps(scheduler2, 20)
    seen = run_schedule(scheduler2, optimizer2, 12)
    expected = [paper_lr(k, 64, 4) * cooldown_factor(k, 20, 4) for k in range(9, 21)]
    assert seen == pytest.approx(expected)
    assert seen[:9] == pytest.approx([paper_lr(k, 64, 4) for k in range(9, 18)])


def test_scheduler_needs_unit_base_lr():
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="lr 1.0"):
        build_scheduler(optimizer, d_model=512)


def test_fused_adam_on_cpu_makes_the_same_updates_as_the_default_path():
    # FUSED_ADAM_DEVICES includes the CPU: its kernel must be the paper's Adam to rounding.
    assert "cpu" in FUSED_ADAM_DEVICES
    torch.manual_seed(0)
    shapes = [(64, 32), (32,), (7, 5, 3)]
    start = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) for s in shapes] for _ in range(6)]
    finals = {}
    for fused in (None, True):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        optimizer = build_optimizer(params, fused=fused)
        scheduler = build_scheduler(optimizer, d_model=32, warmup=4)
        for step_grads in grads:
            for p, g in zip(params, step_grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
            scheduler.step()
        finals[fused] = params
    for a, b, s in zip(finals[None], finals[True], start, strict=True):
        assert not torch.equal(a, s)  # the parameters moved
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
