"""The CPU dropout's mask (model/dropout.py): Bernoulli(1 - p), scaled, seeded, and the same
module as nn.Dropout wherever the fast path does not apply."""

from __future__ import annotations

import pytest
import torch

from transformer_nmt.model.dropout import Dropout, bernoulli_keep_mask, kept_levels, rounded_p


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keeps_each_element_with_probability_one_minus_p_and_scales_it(p):
    torch.manual_seed(0)
    x = torch.rand(1000, 1000, dtype=torch.float64) + 0.5  # no zeros of its own
    x.requires_grad_(True)
    out = Dropout(p).train()(x)
    kept = out != 0
    n = kept.numel()
    # within 5 standard deviations of 1 - p
    assert abs(kept.double().mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
    # the scale is that of the realised p (p to 2^-16): E[out] = x exactly
    scale = 1 / (1 - rounded_p(p))
    torch.testing.assert_close(out[kept], x.detach()[kept] * scale, rtol=1e-12, atol=0)
    out.sum().backward()  # d out / d x: the scale where kept, 0 where dropped
    torch.testing.assert_close(x.grad, kept.double() * scale, rtol=1e-12, atol=0)


@pytest.mark.parametrize("p", [2**-16, 0.1, 0.3, 0.5, 1 - 2**-16])
def test_the_mask_keeps_exactly_one_minus_the_realised_p_of_the_levels(p):
    """Each element's uniform int16 is one of 2^16 levels: exactly 2^16 * (1 - rounded_p(p))
    of them, the highest, keep it, so P(kept) = 1 - rounded_p(p) with no sampling error."""
    levels = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)  # all 2^16
    kept = kept_levels(levels, p)
    assert int(kept.sum()) == round((1 - rounded_p(p)) * 2**16)
    assert torch.equal(kept, kept.sort().values)  # the kept levels are the highest ones
    # rounded_p is p to the nearest multiple of 2^-16
    assert rounded_p(p) * 2**16 == round(p * 2**16)
    assert rounded_p(0.1) == 6554 / 2**16


@pytest.mark.parametrize("p", [2**-18, 1 - 2**-18])
def test_a_p_that_rounds_to_0_or_1_is_nn_dropouts(p):
    """Where p rounds to 0 or 1 the mask's scale would be 1 or 1 / 0: nn.Dropout's own path
    keeps elements with probability 1 - p exactly, scaled by 1 / (1 - p), and stays finite."""
    torch.manual_seed(0)
    x = torch.ones(1000, 1000, dtype=torch.float64)
    out = Dropout(p).train()(x)
    torch.manual_seed(0)
    assert torch.equal(out, torch.nn.functional.dropout(x, p, training=True))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_each_16_bit_lane_of_a_64_bit_draw_is_uniform(p):
    # Four mask elements come from one int64 draw. If the draw had random_'s default 63 bits,
    # the fourth lane's top bit would always be 0 and that lane would (almost) never drop.
    torch.manual_seed(1)
    n = 4 * 250_000
    mask = bernoulli_keep_mask(torch.Size([n]), p, torch.device("cpu"))
    tolerance = 5 * (p * (1 - p) / (n / 4)) ** 0.5
    for lane in mask.view(-1, 4).unbind(1):
        assert abs(lane.double().mean().item() - (1 - p)) < tolerance
    # neighbours (same draw or the next) agree as often as independent draws would
    agree = (mask[:-1] == mask[1:]).double().mean().item()
    assert abs(agree - (p * p + (1 - p) ** 2)) < 5 * (0.25 / n) ** 0.5


@pytest.mark.parametrize("shape", [(1,), (3, 5), (2, 7, 3)])
def test_the_mask_has_the_shape_asked_for_whatever_its_size_modulo_4(shape):
    assert bernoulli_keep_mask(torch.Size(shape), 0.2, torch.device("cpu")).shape == shape


def test_the_mask_follows_the_seed_and_the_dtype():
    x = torch.ones(64, 32, dtype=torch.bfloat16)
    torch.manual_seed(3)
    first = Dropout(0.1).train()(x)
    torch.manual_seed(3)
    again = Dropout(0.1).train()(x)
    assert first.dtype == torch.bfloat16
    assert torch.equal(first, again)
    assert not torch.equal(first, Dropout(0.1).train()(x))  # the generator moved on


def test_eval_mode_and_p_zero_are_the_identity_and_p_one_drops_everything():
    x = torch.randn(8, 5)
    assert torch.equal(Dropout(0.3).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))
