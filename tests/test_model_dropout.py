"""The CPU dropout's mask (model/dropout.py): Bernoulli(1 - p), scaled, seeded, and the same
module as nn.Dropout wherever the fast path does not apply. Word dropout (a flag): whole token
embeddings dropped, on the side its key names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transformer_nmt.errors import ConfigError
from transformer_nmt.model.config import ModelConfig
from transformer_nmt.model.dropout import (
    Dropout,
    WordDropout,
    bernoulli_keep_mask,
    kept_levels,
    rounded_p,
)
from transformer_nmt.model.transformer import Transformer


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


# --- word dropout (model flags p_drop_word_src, p_drop_word_tgt) -------------------------------


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_word_dropout_drops_whole_token_vectors_with_probability_p_and_scales_the_rest(p):
    torch.manual_seed(0)
    x = torch.rand(200, 100, 16, dtype=torch.float64) + 0.5  # no zeros of its own
    x.requires_grad_(True)
    out = WordDropout(p).train()(x)
    dropped = (out == 0).all(dim=-1)  # [200, 100]: a token's vector goes whole or not at all
    assert torch.equal((out == 0).any(dim=-1), dropped)
    n = dropped.numel()
    assert abs(dropped.double().mean().item() - p) < 5 * (p * (1 - p) / n) ** 0.5
    kept = ~dropped
    torch.testing.assert_close(out[kept], x.detach()[kept] / (1 - p), rtol=1e-12, atol=0)
    out.sum().backward()
    expected_grad = kept[..., None].double().expand_as(x) / (1 - p)
    torch.testing.assert_close(x.grad, expected_grad, rtol=1e-12, atol=0)


def test_word_dropout_is_the_identity_in_eval_mode_and_at_p_zero():
    x = torch.rand(4, 5, 8)
    assert WordDropout(0.5).eval()(x) is x
    assert WordDropout(0.0).train()(x) is x


def _model(**flags: float) -> Transformer:
    torch.manual_seed(0)
    shape = {"N": 1, "d_model": 16, "d_ff": 32, "h": 2, "d_k": 8, "d_v": 8, "p_drop": 0.0}
    cfg = ModelConfig(**(shape | flags))
    return Transformer(cfg, vocab_size=30, pad_id=0).double()


@pytest.mark.parametrize("side", ["src", "tgt"])
def test_word_dropout_acts_on_its_own_side_in_training_only(side):
    tokens = torch.randint(3, 30, (64, 12))
    plain = _model()
    model = _model(**{f"p_drop_word_{side}": 0.5})
    model.load_state_dict(plain.state_dict())  # the flag adds no parameters
    plain.train()
    model.train()
    embed = {"src": Transformer.embed_source, "tgt": Transformer.embed_target}
    other = "tgt" if side == "src" else "src"
    # the other side is untouched
    assert torch.equal(embed[other](model, tokens), embed[other](plain, tokens))
    positions = plain.src_pos(12, device=tokens.device, dtype=torch.float64)  # [12, d]
    words = embed[side](plain, tokens) - positions  # [64, 12, d]: the scaled embeddings
    dropped_words = embed[side](model, tokens) - positions
    dropped = (dropped_words.abs() < 1e-12).all(dim=-1)  # [64, 12]
    assert 0.3 < dropped.double().mean().item() < 0.7  # 768 draws of p 0.5
    torch.testing.assert_close(dropped_words[~dropped], 2 * words[~dropped])
    # eval mode (search, scoring): the paper's embeddings
    model.eval()
    plain.eval()
    assert torch.equal(embed[side](model, tokens), embed[side](plain, tokens))


@pytest.mark.parametrize("key", ["p_drop_word_src", "p_drop_word_tgt"])
@pytest.mark.parametrize("value", [-0.1, 1.0, True])
def test_word_dropout_out_of_range_is_a_config_error_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        ModelConfig(**{key: value})


# --- LayerDrop (model flag p_drop_layer) -------------------------------------------------------


def _layers_that_ran(model: Transformer) -> tuple[list[int], list[int], list]:
    """Forward hooks recording which encoder and decoder layers run (their indices)."""
    ran: tuple[list[int], list[int]] = ([], [])
    hooks = [
        layer.register_forward_hook(lambda *_, i=i, side=side: ran[side].append(i))
        for side, stack in enumerate((model.encoder_layers, model.decoder_layers))
        for i, layer in enumerate(stack)
    ]
    return ran[0], ran[1], hooks


def test_layer_drop_skips_each_layer_with_probability_p_in_training_only():
    p, n_layers, passes = 0.3, 4, 300
    model = _model(N=n_layers, p_drop_layer=p).train()
    encoder_ran, decoder_ran, _ = _layers_that_ran(model)
    src, tgt = torch.randint(3, 30, (2, 5)), torch.randint(3, 30, (2, 4))
    torch.manual_seed(1)
    for _ in range(passes):
        model(src, tgt)
    for ran in (encoder_ran, decoder_ran):
        counts = torch.bincount(torch.tensor(ran), minlength=n_layers).double()  # [N]
        kept = counts / passes  # each layer's share of passes it ran in
        assert torch.all((kept - (1 - p)).abs() < 5 * (p * (1 - p) / passes) ** 0.5), kept
    # at inference every layer runs, every time
    model.eval()
    del encoder_ran[:], decoder_ran[:]
    for _ in range(20):
        model(src, tgt)
    assert encoder_ran == decoder_ran == list(range(n_layers)) * 20


def test_a_skipped_layer_passes_its_input_on_and_gets_no_gradient():
    # residual dropout 0: a pass is deterministic but for the layers skipped, so it must equal
    # the plain model run with only the layers that ran
    model = _model(N=4, p_drop_layer=0.5).train()
    plain = _model(N=4).train()
    plain.load_state_dict(model.state_dict())  # the flag adds no parameters
    encoder_ran, decoder_ran, hooks = _layers_that_ran(model)
    src, tgt = torch.randint(3, 30, (3, 6)), torch.randint(3, 30, (3, 5))
    torch.manual_seed(3)
    logits = model(src, tgt)
    for hook in hooks:
        hook.remove()
    assert 0 < len(encoder_ran) + len(decoder_ran) < 8  # some layers ran, some were skipped
    plain.encoder_layers = nn.ModuleList(plain.encoder_layers[i] for i in encoder_ran)
    plain.decoder_layers = nn.ModuleList(plain.decoder_layers[i] for i in decoder_ran)
    torch.testing.assert_close(logits, plain(src, tgt), rtol=1e-12, atol=1e-12)
    logits.sum().backward()
    for side, ran in (("encoder_layers", encoder_ran), ("decoder_layers", decoder_ran)):
        for i, layer in enumerate(getattr(model, side)):
            grads = [q.grad for q in layer.parameters()]
            if i in ran:
                assert all(g is not None and g.abs().sum() > 0 for g in grads), (side, i)
            else:
                assert all(g is None for g in grads), (side, i)


@pytest.mark.parametrize("value", [-0.1, 1.0, True])
def test_layer_drop_out_of_range_is_a_config_error_naming_the_key(value):
    with pytest.raises(ConfigError, match="p_drop_layer"):
        ModelConfig(p_drop_layer=value)
