"""The CPU dropout's mask (model/dropout.py): Bernoulli(1 - p), scaled, seeded, and the same
module as nn.Dropout wherever the fast path does not apply."""

from __future__ import annotations

import pytest
import torch

from transformer_nmt.model.dropout import Dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keeps_each_element_with_probability_one_minus_p_and_scales_it(p):
    torch.manual_seed(0)
    x = torch.rand(1000, 1000, dtype=torch.float64) + 0.5  # no zeros of its own
    x.requires_grad_(True)
    out = Dropout(p).train()(x)
    kept = out != 0
    n = kept.numel()
    # within 5 standard deviations of 1 - p (a 24-bit or a [0, 2^24) draw would miss by far)
    assert abs(kept.double().mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
    torch.testing.assert_close(out[kept], x.detach()[kept] / (1 - p), rtol=1e-6, atol=0)
    out.sum().backward()  # d out / d x: 1/(1-p) where kept, 0 where dropped
    torch.testing.assert_close(x.grad, kept.double() / (1 - p), rtol=1e-6, atol=0)


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
