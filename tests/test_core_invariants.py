"""Invariants of the paper's core that mutation testing (benchmarks/mutation_test.py) found
unpinned: the formulas of the residual connections and embeddings, defaults that are the
paper's values, boundaries of the validated settings, and the stopping rules of beam search
on a scripted model whose probabilities are chosen by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.evaluation.score import (
    LC_TOK_BLEU_METHOD,
    moses_tokenize,
    score_files,
    score_lines,
)
from transformer_nmt.model import Transformer, apply_overrides, count_parameters, get_preset
from transformer_nmt.model.attention import CAUSAL, MultiHeadAttention, attention_probs
from transformer_nmt.model.config import TABLE3, ModelConfig, Table3Row, model_config_from_spec
from transformer_nmt.model.dropout import Dropout
from transformer_nmt.model.layers import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    LayerCache,
    Residual,
)
from transformer_nmt.model.positional import (
    LearnedPositions,
    SinusoidalPositions,
    sinusoidal_encoding,
)
from transformer_nmt.model.transformer import key_padding_mask
from transformer_nmt.search import SearchSettings, beam_search, greedy_search, length_penalty
from transformer_nmt.search._stepper import Stepper
from transformer_nmt.training.objective import (
    chunked_label_smoothed_cross_entropy,
    label_smoothed_cross_entropy,
)
from transformer_nmt.training.optimizer import (
    PaperSchedule,
    build_optimizer,
    build_scheduler,
    follow_max_steps,
    paper_lr,
)

PAD, UNK, BOS, EOS = 0, 1, 2, 3
IDS = {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD}
V = 23


def small_cfg(*extra: str) -> ModelConfig:
    return apply_overrides(
        get_preset("tiny"), ["N=2", "d_model=32", "d_ff=48", "h=4", "d_k=8", "d_v=6", *extra]
    )


def make_model(*extra: str, seed: int = 0, **kwargs) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(small_cfg(*extra), vocab_size=V, pad_id=PAD, **kwargs).double().eval()


def layer_norm(x: torch.Tensor, norm: torch.nn.LayerNorm, eps: float) -> torch.Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, eps)


# --- configuration --------------------------------------------------------------------------------


def test_a_model_spec_is_a_preset_with_overrides():
    tiny = get_preset("tiny")
    assert model_config_from_spec({"preset": "tiny", "overrides": {"N": 2}}) == apply_overrides(
        tiny, {"N": 2}
    )
    assert model_config_from_spec({}) == get_preset("base")  # the default preset is base
    assert model_config_from_spec({"preset": "big", "overrides": None}) == get_preset("big")
    with pytest.raises(ConfigError, match=r"^model spec: unknown key\(s\) \['layers'\]"):
        model_config_from_spec({"preset": "tiny", "layers": 2})
    with pytest.raises(ConfigError, match="^model spec: 'overrides' must be a mapping"):
        model_config_from_spec({"overrides": ["N=2"]})


def test_overrides_split_at_the_first_equals_sign():
    # key=value: the value keeps any further '=' (and is then validated as a value)
    row = Table3Row("X", ("positional=a=b", "N=2"), 1.0, 1.0, 1.0)
    assert row.overrides_dict() == {"positional": "a=b", "N": 2}
    assert TABLE3["A1"].overrides_dict() == {"h": 1, "d_k": 512, "d_v": 512}
    with pytest.raises(ConfigError, match="'positional' must be one of"):
        apply_overrides(get_preset("base"), ["positional=learned=x"])


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("1", True), ("yes", True), (" YES ", True), ("True", True)]
    + [("false", False), ("0", False), ("no", False), ("NO", False)],
)
def test_boolean_overrides_accept_true_1_yes_false_0_no(text, value):
    assert apply_overrides(get_preset("base"), [f"norm_first={text}"]).norm_first is value


def test_integer_fields_take_whole_floats_only():
    assert apply_overrides(get_preset("base"), {"h": 4.0}).h == 4
    with pytest.raises(ConfigError, match="'h' expects int"):
        apply_overrides(get_preset("base"), {"h": 2.5})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("N", True, "'N' must be a positive integer"),
        ("p_drop", False, r"'p_drop' must be a number in \[0, 1\)"),
        ("ln_eps", True, "^model config key 'ln_eps' must be positive"),
        ("ln_eps", 0.0, "^model config key 'ln_eps' must be positive"),
        ("norm_first", "yes", "^model config key 'norm_first' must be true or false"),
    ],
)
def test_invalid_config_values_are_refused_by_name(field, value, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**{field: value})


def test_config_errors_name_what_was_given_and_what_exists():
    with pytest.raises(ConfigError, match="^model config must be a mapping, got list"):
        ModelConfig.from_dict([("N", 2)])
    with pytest.raises(ConfigError, match=r"choose one of \['base', 'big', 'tiny'\]"):
        get_preset("huge")


def test_search_settings_accept_their_boundaries_and_name_the_flag_otherwise():
    SearchSettings(beam=1, nbest=1, alpha=0.0, max_len_b=0, max_tokens=1)
    assert SearchSettings(beam=3, nbest=3).nbest == 3
    for kwargs, message in [
        ({"beam": 0}, "^--beam must be >= 1, got 0"),
        ({"nbest": 5}, "^--nbest must be between 1 and --beam=4, got 5"),
        ({"alpha": -0.5}, "^--alpha must be >= 0, got -0.5"),
        ({"max_len_b": -1}, "^--max-len-b must be >= 0, got -1"),
        ({"max_tokens": 0}, "^--max-tokens must be >= 1, got 0"),
    ]:
        with pytest.raises(ConfigError, match=message):
            SearchSettings(**kwargs)


# --- §5.3 optimiser and schedule, §5.4 loss -------------------------------------------------------


def test_the_fused_flag_reaches_adam():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert build_optimizer(params, fused=True).defaults["fused"] is True
    assert build_optimizer(params, fused=False).defaults["fused"] is False


def test_the_schedule_defaults_are_the_papers_warmup_4000_and_scale_1():
    schedule = PaperSchedule(512)
    for epoch in (0, 3998, 3999, 4000, 99_999):
        assert schedule(epoch) == pytest.approx(paper_lr(epoch + 1, 512, 4000), rel=1e-12)
    scheduler = build_scheduler(build_optimizer([torch.nn.Parameter(torch.zeros(1))]), d_model=512)
    assert scheduler.lr_lambdas[0](3999) == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-12)


def test_scheduler_arguments_are_checked_at_their_boundaries():
    def optimizer():
        return build_optimizer([torch.nn.Parameter(torch.zeros(1))])

    build_scheduler(optimizer(), d_model=64, warmup=1)  # one warm-up step is allowed
    with pytest.raises(ValueError, match="^warmup must be a positive number of steps, got 0"):
        build_scheduler(optimizer(), d_model=64, warmup=0)
    with pytest.raises(ValueError, match="^a learning-rate cooldown needs max_steps"):
        build_scheduler(optimizer(), d_model=64, cooldown_steps=3)
    # the base lr is the optimiser's initial lr: a second scheduler on it is fine
    opt = optimizer()
    build_scheduler(opt, d_model=64, warmup=10)
    assert opt.param_groups[0]["lr"] != 1.0
    build_scheduler(opt, d_model=64, warmup=10)


def test_follow_max_steps_leaves_other_schedules_alone():
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(1))])
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.5)
    follow_max_steps(scheduler, 10)
    assert opt.param_groups[0]["lr"] == 0.5


def test_chunked_loss_has_the_same_default_smoothing_and_dtype_as_the_full_loss():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 8, generator=g)
    weight = torch.randn(11, 8, generator=g)
    target = torch.randint(1, 11, (2, 5), generator=g)
    target[1, 3:] = 0
    full = label_smoothed_cross_entropy(hidden @ weight.T, target)
    chunked = chunked_label_smoothed_cross_entropy(
        hidden, lambda h: h @ weight.T, target, chunk_tokens=3
    )
    assert chunked.loss.dtype == full.loss.dtype == torch.float32
    torch.testing.assert_close(chunked.loss, full.loss)
    torch.testing.assert_close(chunked.nll, full.nll)


def test_a_bf16_gradient_is_the_float32_gradient_rounded_once():
    """The backward pass computes in float32 and rounds at the end: exactly the float32
    gradient of the same (bf16-valued) logits, cast to bf16."""
    g = torch.Generator().manual_seed(4)
    base = torch.randn(40, 50, generator=g).bfloat16()
    target = torch.randint(1, 50, (40,), generator=g)
    grads = []
    for logits in (base.clone(), base.float()):
        logits.requires_grad_()
        label_smoothed_cross_entropy(logits, target).loss.backward()
        grads.append(logits.grad)
    assert torch.equal(grads[0], grads[1].bfloat16())


# --- §3.5 positions and §3.4 embeddings -----------------------------------------------------------


def test_sinusoidal_table_grows_past_a_small_initial_table_and_is_reused():
    module = SinusoidalPositions(d_model=16, initial_length=4)
    module(3)
    full = module(10)  # grown to exactly 10 positions
    torch.testing.assert_close(full, sinusoidal_encoding(10, 16), rtol=0, atol=0)
    # a table that holds the positions is reused, not recomputed (one storage), up to its end
    assert module(10).data_ptr() == full.data_ptr() == module(3, offset=2).data_ptr() - 2 * 64
    # float64 tables are computed in float64 (no float32 round trip)
    exact = module(5, dtype=torch.float64)
    assert torch.equal(exact, sinusoidal_encoding(5, 16, dtype=torch.float64))


def test_learned_positions_start_at_0_go_up_to_max_positions_and_have_the_embedding_scale():
    torch.manual_seed(0)
    module = LearnedPositions(d_model=64, max_positions=4000)
    assert torch.equal(module(3), module.weight[:3])
    assert module(4000).shape == (4000, 64)
    with pytest.raises(ValueError, match="exceeds max_positions=4000 of the learned positional"):
        module(1, offset=4000)
    # N(0, d_model^-0.5) over 256,000 values: mean within 5 standard errors, std within 1 %
    weight = module.weight.detach().double()
    assert abs(weight.mean().item()) < 5 * 64**-0.5 / weight.numel() ** 0.5
    assert weight.std().item() == pytest.approx(64**-0.5, rel=0.01)


def test_untied_embeddings_and_projection_are_initialised_like_the_shared_one():
    torch.manual_seed(0)
    cfg = apply_overrides(small_cfg(), ["tie_embeddings=false", "d_model=64"])
    model = Transformer(cfg, vocab_size=3000, tgt_vocab_size=2000)
    for weight in (model.src_embed.weight, model.tgt_embed.weight, model.out_proj.weight):
        w = weight.detach().double()
        assert abs(w.mean().item()) < 5 * 64**-0.5 / w.numel() ** 0.5
        assert w.std().item() == pytest.approx(64**-0.5, rel=0.02)


def test_embeddings_are_scaled_tokens_plus_positions_at_every_offset():
    for extra in ((), ("tie_embeddings=false",), ("positional=learned",)):
        model = make_model(*extra)
        tokens = torch.tensor([[5, 9, 4]])
        table = model.tgt_embed if model.tgt_embed is not None else model.src_embed
        for offset in (0, 3):
            pe = model.tgt_pos(10, dtype=torch.float64)[offset : offset + 3]
            expected = table.weight[tokens[0]] * math.sqrt(32) + pe
            got = model.embed_target(tokens, offset=offset)[0]
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
        pe = model.src_pos(3, dtype=torch.float64)
        expected = model.src_embed.weight[tokens[0]] * math.sqrt(32) + pe
        torch.testing.assert_close(model.embed_source(tokens)[0], expected, rtol=0, atol=1e-12)


def test_model_attributes_and_defaults():
    torch.manual_seed(0)
    model = Transformer(small_cfg(), vocab_size=V)
    assert model.pad_id == 0 and model.vocab_size == V and model.tgt_vocab_size == V
    src = torch.tensor([[5, 6, 0]])
    assert torch.equal(model.encode(src).src_mask, torch.tensor([[True, True, False]]))
    untied = Transformer(small_cfg("tie_embeddings=false"), vocab_size=V, tgt_vocab_size=11)
    assert untied.tgt_vocab_size == 11
    Transformer(small_cfg(), vocab_size=1)  # a vocabulary of one is positive
    with pytest.raises(ConfigError, match="^vocab_size must be positive, got 0"):
        Transformer(small_cfg(), vocab_size=0)


def test_count_parameters_excludes_every_embedding_matrix_once():
    d = 32
    tied = make_model()
    assert count_parameters(tied, exclude_embeddings=True) == count_parameters(tied) - V * d
    untied = make_model("tie_embeddings=false", tgt_vocab_size=11)
    dropped = V * d + 11 * d + 11 * d
    assert count_parameters(untied, exclude_embeddings=True) == count_parameters(untied) - dropped
    learned = make_model("positional=learned", "max_positions=50")
    dropped = V * d + 2 * 50 * d  # source and target position tables
    assert count_parameters(learned, exclude_embeddings=True) == count_parameters(learned) - dropped


def test_key_padding_mask_lets_an_empty_row_attend_everywhere():
    token_mask = torch.tensor([[True, True, False], [False, False, False], [True, True, True]])
    expected = torch.tensor([[True, True, False], [True, True, True], [True, True, True]])
    assert torch.equal(key_padding_mask(token_mask), expected[:, None, None, :])
    assert key_padding_mask(torch.ones(2, 3, dtype=torch.bool)) is None


# --- §3.1 residual connections, layers, §3.2 attention --------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_connection_formulas(norm_first):
    torch.manual_seed(0)
    residual = Residual(8, p_drop=0.1, norm_first=norm_first, ln_eps=1e-6).double().eval()
    with torch.no_grad():
        residual.norm.weight.uniform_(0.5, 1.5)
        residual.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 3, 8, dtype=torch.float64)

    def sublayer(y):
        return 2 * y + 1

    out = residual(x, sublayer)
    if norm_first:  # pre-LN: x + Dropout(Sublayer(LayerNorm(x)))
        expected = x + sublayer(layer_norm(x, residual.norm, 1e-6))
    else:  # post-LN (§3.1): LayerNorm(x + Dropout(Sublayer(x)))
        expected = layer_norm(x + sublayer(x), residual.norm, 1e-6)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_and_decoder_layers_are_their_residual_sublayers(norm_first):
    cfg = small_cfg(f"norm_first={norm_first}", "ln_eps=1e-6")
    torch.manual_seed(0)
    enc_layer, dec_layer = EncoderLayer(cfg).double().eval(), DecoderLayer(cfg).double().eval()
    with torch.no_grad():
        for norm in [m for m in (*enc_layer.modules(), *dec_layer.modules())]:
            if isinstance(norm, torch.nn.LayerNorm):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    mem = torch.randn(2, 4, 32, dtype=torch.float64)

    def residual(res, y, sublayer):
        if norm_first:
            return y + sublayer(layer_norm(y, res.norm, 1e-6))
        return layer_norm(y + sublayer(y), res.norm, 1e-6)

    with torch.no_grad():
        y = residual(enc_layer.res_attn, x, lambda z: enc_layer.self_attn(z, z, None)[0])
        y = residual(enc_layer.res_ffn, y, enc_layer.ffn)
        torch.testing.assert_close(enc_layer(x, None), y, rtol=0, atol=1e-12)

        k, v = dec_layer.cross_attn.project_kv(mem)
        y = residual(dec_layer.res_self, x, lambda z: dec_layer.self_attn(z, z, CAUSAL)[0])
        y = residual(dec_layer.res_cross, y, lambda z: dec_layer.cross_attn.attend(z, k, v)[0])
        y = residual(dec_layer.res_ffn, y, dec_layer.ffn)
        out, weights = dec_layer(x, k, v, CAUSAL, None)
        torch.testing.assert_close(out, y, rtol=0, atol=1e-12)
        assert weights is None  # only when asked for


def test_pre_ln_stacks_end_with_a_layer_norm():
    model = make_model("norm_first=true", "ln_eps=1e-6")
    with torch.no_grad():
        for norm in (model.encoder_norm, model.decoder_norm):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    src = torch.tensor([[5, 6, 7, EOS]])
    tgt = torch.tensor([[BOS, 8, 9]])
    with torch.no_grad():
        x = model.embed_source(src)
        for layer in model.encoder_layers:
            x = layer(x, None)
        enc = model.encode(src)
        torch.testing.assert_close(
            enc.memory, layer_norm(x, model.encoder_norm, 1e-6), rtol=0, atol=1e-12
        )
        y = model.embed_target(tgt)
        for layer in model.decoder_layers:
            k, v = layer.cross_attn.project_kv(enc.memory)
            y = layer(y, k, v, CAUSAL, None)[0]
        expected = model.project(layer_norm(y, model.decoder_norm, 1e-6))
        torch.testing.assert_close(model.decode(tgt, enc)[0], expected, rtol=0, atol=1e-12)


def test_defaults_are_the_papers_bias_free_dropout_free_sublayers():
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 2, 4, 4)
    assert all(p.bias is None for p in attention.children())
    ffn = FeedForward(16, 32)
    x = torch.randn(2, 5, 16)
    for module, call in ((attention, lambda m: m(x, x)[0]), (ffn, lambda m: m(x))):
        train = call(module.train())
        torch.testing.assert_close(train, call(module.eval()), rtol=0, atol=0)
    expected = ffn.w_2(torch.relu(ffn.w_1(x)))
    torch.testing.assert_close(ffn(x), expected, rtol=0, atol=0)


def test_attention_dropout_acts_in_training_only():
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 2, 4, 4, p_drop_attn=0.5)
    x = torch.randn(2, 5, 16)
    attention.train()
    assert not torch.equal(attention(x, x)[0], attention(x, x)[0])
    attention.eval()
    q, k, v = attention.project_qkv(x)
    probs = attention_probs(q, k, None)  # [B, h, L, L]
    expected = attention.w_o((probs @ v).transpose(1, 2).reshape(2, 5, 8))
    torch.testing.assert_close(attention(x, x)[0], expected)


def test_self_attention_returns_the_weights_asked_for():
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 2, 4, 4).eval()
    x = torch.randn(2, 5, 16)
    q, k, v = attention.project_qkv(x)
    probs = attention_probs(q, k, CAUSAL)  # [B, h, L, L]
    assert attention(x, x, CAUSAL)[1] is None  # default: no weights
    assert attention.attend(x, k, v, CAUSAL, q=q)[1] is None
    assert attention(x, x, CAUSAL, need_weights=False)[1] is None
    torch.testing.assert_close(attention(x, x, CAUSAL, need_weights=True)[1], probs.mean(dim=1))
    per_head = attention(x, x, CAUSAL, need_weights=True, average_heads=False)[1]
    torch.testing.assert_close(per_head, probs)


def test_causal_attention_probs_of_one_sentence_and_one_head():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 4, 8, generator=g), torch.randn(1, 1, 4, 8, generator=g)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(8)
    future = torch.ones(4, 4, dtype=torch.bool).triu(1)
    expected = scores.masked_fill(future, float("-inf")).softmax(-1)
    torch.testing.assert_close(attention_probs(q, k, CAUSAL), expected)


def test_attention_and_relu_dropout_flags_reach_every_stack():
    src = torch.tensor([[5, 6, 7, EOS]])
    tgt = torch.tensor([[BOS, 8, 9]])
    for flag in ("p_drop_attn", "p_drop_relu"):
        for p, stochastic in ((0.0, False), (0.4, True)):
            model = make_model("p_drop=0.0", f"{flag}={p}")
            enc = model.encode(src)  # eval: fixed
            model.train()
            encoded = [model.encode(src).memory for _ in range(2)]
            decoded = [model.decode(tgt, enc)[0] for _ in range(2)]
            assert torch.equal(*encoded) is not stochastic, (flag, "encoder")
            assert torch.equal(*decoded) is not stochastic, (flag, "decoder")


def test_decoding_returns_attention_only_when_asked():
    model = make_model()
    src, tgt = torch.tensor([[5, 6, EOS]]), torch.tensor([[BOS, 8, 9]])
    enc = model.encode(src)
    assert model.decode(tgt, enc)[1] is None
    assert model.decode(tgt, enc, attention_layer=0)[1] is None
    assert model.decode_step(tgt[:, 0], model.init_state(enc))[1] is None


def test_a_cache_reordered_with_gradients_can_be_reordered_without():
    k = torch.randn(3, 2, 1, 4, requires_grad=True)
    v = torch.randn(3, 2, 1, 4, requires_grad=True)
    cache = LayerCache(torch.zeros(3, 2, 5, 4), torch.zeros(3, 2, 5, 4))
    cache.append(k, v)
    cache.reorder(torch.tensor([2, 0, 1]))  # differentiable
    with torch.no_grad():
        cache.reorder(torch.tensor([1, 1, 0]))
    torch.testing.assert_close(cache.self_k, k[[0, 0, 2]].detach())
    torch.testing.assert_close(cache.self_v, v[[0, 0, 2]].detach())


def test_dropout_in_place_changes_its_input():
    torch.manual_seed(0)
    x = torch.ones(1000)
    out = Dropout(0.5, inplace=True).train()(x)
    assert out.data_ptr() == x.data_ptr() and torch.equal(out, x)
    assert set(x.unique().tolist()) == {0.0, 2.0}


# --- §6.1 search ----------------------------------------------------------------------------------


class ScriptedState:
    def __init__(self, rows: int) -> None:
        self.prefixes: list[tuple[int, ...]] = [()] * rows
        self.reuse_logits = False

    def reorder(self, index: torch.Tensor, same_source: bool = False) -> None:
        self.prefixes = [self.prefixes[i] for i in index.tolist()]


class ScriptedModel(torch.nn.Module):
    """A 'translation model' whose next-token distribution is a table over target prefixes
    (the source is ignored): ``script[prefix] = {token: probability}``; a prefix missing from
    the table ends (EOS with probability 1). Counts its decoder steps."""

    def __init__(self, script: dict[tuple[int, ...], dict[int, float]], vocab: int = 8) -> None:
        super().__init__()
        self.script, self.vocab, self.steps = script, vocab, 0

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        return src

    def init_state(self, enc: torch.Tensor, rows_per_source: int = 1) -> ScriptedState:
        return ScriptedState(enc.shape[0] * rows_per_source)

    def decode_step(self, tokens, state, return_attention=False):
        self.steps += 1
        logits = torch.full((tokens.shape[0], self.vocab), float("-inf"), dtype=torch.float64)
        for row, token in enumerate(tokens.tolist()):
            prefix = state.prefixes[row] + (() if token == BOS else (token,))
            state.prefixes[row] = prefix
            for tok, prob in self.script.get(prefix, {EOS: 1.0}).items():
                logits[row, tok] = math.log(prob)
        return logits, None


SRC = torch.tensor([[5, EOS]])  # two source tokens: outputs up to 2 + max_len_b tokens
A, B = 4, 5


def test_beam_one_stops_at_its_first_eos_like_greedy_whatever_the_length_penalty():
    # "" scores log 0.6; "A" would score log 0.4 / lp(2) = -0.196 with alpha = 10 (better),
    # but a beam of one is used up by its first finished hypothesis (greedy search).
    model = ScriptedModel({(): {EOS: 0.6, A: 0.4}})
    (best,) = beam_search(model, SRC, beam_size=1, alpha=10.0, **IDS)[0]
    assert best.tokens == [] and best.log_prob == pytest.approx(math.log(0.6))
    assert greedy_search(model, SRC, **IDS) == [[]]


def test_exact_early_stopping_bounds_by_the_penalty_of_the_longest_reachable_output():
    # beam 2, alpha 3, at most 2 + 1 = 3 tokens: "" finishes first with log 0.65 = -0.431; the
    # live "A" (log 0.35) can still finish as "A A A" at |Y| = 4: -1.050 / lp(4) = -0.311, and
    # does (its continuations have probability 1), so stopping must wait for it.
    script = {(): {EOS: 0.65, A: 0.35}, (A,): {A: 1.0}, (A, A): {A: 1.0}}
    model = ScriptedModel(script)
    (best,) = beam_search(model, SRC, beam_size=2, alpha=3.0, max_len_b=1, **IDS)[0]
    assert best.tokens == [A, A, A]
    assert best.score == pytest.approx(math.log(0.35) / length_penalty(4, 3.0))


@pytest.mark.parametrize(
    ("p_eos", "steps"),
    [
        (0.5, 1),  # "A" (log 0.5) cannot beat "" (log 0.5) any more: a tie stops at once
        (0.6, 1),  # "A" (log 0.4) cannot beat "" (log 0.6)
        (0.4, 2),  # "A" (log 0.6) can: it finishes as "A" at the next step
    ],
)
def test_exact_early_stopping_stops_as_soon_as_no_live_hypothesis_can_win(p_eos, steps):
    model = ScriptedModel({(): {EOS: p_eos, A: 1 - p_eos}})
    hyps = beam_search(model, SRC, beam_size=3, alpha=0.0, **IDS)[0]
    assert model.steps == steps
    assert hyps[0].log_prob == pytest.approx(math.log(max(p_eos, 1 - p_eos)))


def test_exact_early_stopping_divides_by_the_penalty_of_the_maximum_length():
    # alpha 1, at most 2 + 0 tokens (|Y| <= 3): "" finishes with log 0.56 = -0.580; the live
    # "A" (log 0.44 = -0.821) can reach at best -0.821 / lp(3) = -0.616: the sentence is done
    # after one step (with lp(4) in the bound it would decode on).
    model = ScriptedModel({(): {EOS: 0.56, A: 0.44}})
    hyps = beam_search(model, SRC, beam_size=3, alpha=1.0, max_len_b=0, **IDS)[0]
    assert model.steps == 1 and hyps[0].tokens == []


def test_best_early_stop_waits_for_the_best_candidate_to_end():
    # beam 2, nbest 1: "" finishes at step 1 as the second-best candidate; the best, "A",
    # ends at step 2 and wins. "best" stops only when a step's best candidate ends.
    model = ScriptedModel({(): {A: 0.6, EOS: 0.3, B: 0.1}})
    (best,) = beam_search(model, SRC, beam_size=2, alpha=0.0, early_stop="best", **IDS)[0]
    assert best.tokens == [A] and model.steps == 2


def test_search_uses_the_cache_by_default_and_recomputes_only_when_asked():
    model = make_model()
    src = torch.tensor([[5, 6, EOS]])
    calls = {"decode": 0, "decode_step": 0}
    for name in calls:
        method = getattr(model, name)

        def counted(*args, _method=method, _name=name, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)

        setattr(model, name, counted)
    greedy_search(model, src, max_len_b=2, **IDS)
    assert calls["decode"] == 0 and calls["decode_step"] > 0
    calls["decode_step"] = 0
    greedy_search(model, src, max_len_b=2, use_cache=False, **IDS)
    assert calls["decode"] > 0 and calls["decode_step"] == 0


def test_a_bf16_model_is_searched_on_float32_log_probabilities():
    model = make_model().to(torch.bfloat16)
    src = torch.tensor([[5, 6, EOS]])
    tokens = torch.tensor([BOS])
    with torch.no_grad():
        enc = model.encode(src)
        lprobs, _ = Stepper(model, enc, use_cache=True, return_attention=False).step(tokens)
        state = model.init_state(enc)
        state.reuse_logits = True
        logits, _ = model.decode_step(tokens, state)
    assert lprobs.dtype == torch.float32
    assert torch.equal(lprobs, logits.float().log_softmax(dim=-1))


# --- §6.1 BLEU ------------------------------------------------------------------------------------


def test_moses_tokenization_follows_the_language():
    # English splits "don't" as "don 't", other languages as "don ' t"
    assert moses_tokenize(["I don't know."], "en") == ["I don &apos;t know ."]
    assert moses_tokenize(["I don't know."], "de") == ["I don &apos; t know ."]
    scores = score_lines(["I don't know."], ["I don't know."], "en", resamples=0)
    assert scores.bleu_paper["sys_len"] == scores.bleu_paper["ref_len"] == 5


def test_tokenized_scores_say_how_they_were_computed():
    scores = score_lines(["a b c x e"], ["a b c d e f"], "en", resamples=0)
    lc = scores.bleu_lc_tok
    assert lc["method"] == LC_TOK_BLEU_METHOD
    assert "tok:none" in lc["signature"] and "smooth:none" in lc["signature"]
    assert lc["score"] == 0.0  # no 4-gram match and no smoothing: multi-bleu.perl's 0
    assert (lc["sys_len"], lc["ref_len"]) == (5, 6)
    assert (scores.bleu["sys_len"], scores.bleu["ref_len"]) == (5, 6)


def test_bootstrap_intervals_need_at_least_two_resamples():
    lines = ["Ein Mann fährt Fahrrad .", "Zwei Hunde spielen ."]
    refs = ["Ein Mann fährt Rad .", "Zwei Hunde spielen ."]
    assert "ci95" not in score_lines(lines, refs, "de", resamples=1).bleu
    assert score_lines(lines, refs, "de", resamples=2).bleu["ci95"]["resamples"] == 2


def test_score_files_scores_in_the_target_language_with_the_resamples_asked(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("I don't know.\n", encoding="utf-8")
    ref.write_text("I don't know.\n", encoding="utf-8")
    scores = score_files(hyp, ref, "en", resamples=0)
    assert scores.bleu_paper["sys_len"] == 5 and "ci95" not in scores.bleu
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="^nothing to score: .*empty.txt and .*empty.txt are"):
        score_files(empty, empty, "en")
    with pytest.raises(DataError, match="^nothing to score: no sentences"):
        score_lines([], [], "en")
    with pytest.raises(DataError, match="^2 hypotheses but 1 references"):
        score_lines(["a", "b"], ["a"], "en")
