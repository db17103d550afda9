"""The §3 model: positional encoding, masks, padding, the incremental decoder and its cache."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_nmt.errors import ConfigError
from transformer_nmt.model import Transformer, apply_overrides, count_parameters, get_preset
from transformer_nmt.model.attention import CAUSAL, MultiHeadAttention
from transformer_nmt.model.positional import SinusoidalPositions, sinusoidal_encoding

PAD, BOS, EOS = 0, 2, 3
V = 23


def small_cfg(*extra: str):
    return apply_overrides(
        get_preset("tiny"), ["N=2", "d_model=32", "d_ff=48", "h=4", "d_k=8", "d_v=6", *extra]
    )


def make_model(*extra: str, dtype=torch.float64, seed: int = 0, **kwargs) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(small_cfg(*extra), vocab_size=V, pad_id=PAD, **kwargs).to(dtype).eval()


def random_batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (3, 7), generator=g)
    src[1, 4:] = PAD
    src[2, 6:] = PAD
    tgt = torch.randint(4, V, (3, 6), generator=g)
    tgt[:, 0] = BOS
    tgt[0, 3:] = PAD
    return src, tgt


def test_sinusoidal_encoding_equals_closed_form():
    d_model, length = 10, 50
    pe = sinusoidal_encoding(length, d_model, dtype=torch.float64)
    assert pe.shape == (length, d_model)
    for pos in (0, 1, 7, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_sinusoidal_module_grows_beyond_its_table_and_is_not_state():
    module = SinusoidalPositions(d_model=6, initial_length=4)
    out = module(5, offset=7)  # positions 7..11, past the initial table
    torch.testing.assert_close(out, sinusoidal_encoding(12, 6)[7:12])
    out64 = module(3, dtype=torch.float64)
    torch.testing.assert_close(out64, sinusoidal_encoding(3, 6, dtype=torch.float64))
    assert list(module.state_dict()) == [] and list(module.buffers()) == []


@pytest.mark.parametrize("extra", [(), ("norm_first=true",), ("positional=learned",)])
def test_causal_mask_leaks_nothing_from_the_future(extra):
    model = make_model(*extra)
    src, tgt = random_batch()
    tgt = tgt[1:]  # rows without target padding
    src = src[1:]
    base = model(src, tgt)
    changed = tgt.clone()
    changed[:, 3:] = torch.randint(4, V, changed[:, 3:].shape, generator=torch.Generator())
    assert not torch.equal(changed, tgt)
    out = model(src, changed)
    torch.testing.assert_close(out[:, :3], base[:, :3], rtol=0, atol=1e-12)
    assert (out[:, 3:] - base[:, 3:]).abs().max() > 1e-3  # later positions do see the change


@pytest.mark.parametrize("extra", [(), ("norm_first=true",), ("tie_embeddings=false",)])
def test_padding_changes_nothing(extra):
    model = make_model(*extra)
    src, tgt = random_batch()
    batch_out = model(src, tgt)
    for b in range(src.shape[0]):
        s_len = int((src[b] != PAD).sum())
        t_len = int((tgt[b] != PAD).sum())
        alone = model(src[b : b + 1, :s_len], tgt[b : b + 1, :t_len])
        torch.testing.assert_close(batch_out[b : b + 1, :t_len], alone, rtol=0, atol=1e-10)


def test_padding_tokens_get_no_attention():
    model = make_model()
    src, tgt = random_batch()
    logits, attention = model.decode(tgt, model.encode(src), return_attention=True)
    assert attention.shape == (3, 6, 7)
    torch.testing.assert_close(attention.sum(-1), torch.ones(3, 6, dtype=torch.float64))
    assert torch.all(attention[src[:, None, :].expand_as(attention) == PAD] == 0)


@pytest.mark.parametrize(
    "extra", [(), ("norm_first=true",), ("positional=learned",), ("tie_embeddings=false",)]
)
def test_cached_incremental_decoding_equals_full_recompute(extra):
    model = make_model(*extra)
    src, _ = random_batch()
    g = torch.Generator().manual_seed(5)
    tgt = torch.randint(4, V, (3, 9), generator=g)
    tgt[:, 0] = BOS
    enc = model.encode(src)
    full, full_attn = model.decode(tgt, enc, return_attention=True)  # [B, T, V], [B, T, S]
    last, _ = model.decode(tgt, enc, last_only=True)  # [B, 1, V]
    torch.testing.assert_close(last[:, 0], full[:, -1], rtol=0, atol=1e-12)
    state = model.init_state(enc)
    for t in range(tgt.shape[1]):
        logits, attn = model.decode_step(tgt[:, t], state, return_attention=True)
        torch.testing.assert_close(logits, full[:, t], rtol=0, atol=1e-12)
        torch.testing.assert_close(attn, full_attn[:, t], rtol=0, atol=1e-12)
    assert state.step == tgt.shape[1]
    assert state.layers[0].self_k.shape == (3, 4, 9, 8)  # [B, h, t, d_k]
    assert state.layers[0].self_v.shape == (3, 4, 9, 6)  # [B, h, t, d_v]


def test_cache_reorder_selects_rows():
    model = make_model()
    src, _ = random_batch()
    tgt = torch.tensor([[BOS, 5, 6, 7]] * 3)
    enc = model.encode(src)
    state = model.init_state(enc)
    for t in range(2):
        model.decode_step(tgt[:, t], state)
    index = torch.tensor([2, 0, 0])
    state.reorder(index)
    logits, _ = model.decode_step(tgt[index, 2], state)
    full, _ = model.decode(tgt[index, :3], enc.index_select(index))
    torch.testing.assert_close(logits, full[:, 2], rtol=0, atol=1e-12)


def test_reorder_within_one_source_keeps_the_source_tensors_and_equals_a_full_reorder():
    # Beam search: K rows per sentence with the same source; a beam moves only among them.
    model = make_model()
    src, _ = random_batch()
    k = 2
    enc = model.encode(src).index_select(torch.arange(3).repeat_interleave(k))  # [3K, S]
    tgt = torch.randint(4, V, (3 * k, 3), generator=torch.Generator().manual_seed(5))
    tgt[:, 0] = BOS
    within, full = model.init_state(enc), model.init_state(enc)
    for t in range(2):
        model.decode_step(tgt[:, t], within)
        model.decode_step(tgt[:, t], full)
    index = torch.tensor([1, 1, 2, 3, 5, 4])  # every row stays among its sentence's rows
    cross_k = [layer.cross_k for layer in within.layers]
    within.reorder(index, same_source=True)
    full.reorder(index)
    assert all(a is layer.cross_k for a, layer in zip(cross_k, within.layers, strict=True))
    logits_within, _ = model.decode_step(tgt[index, 2], within)
    logits_full, _ = model.decode_step(tgt[index, 2], full)
    # equal up to rounding: a GEMM may round equal input rows differently by their position
    torch.testing.assert_close(logits_within, logits_full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("average_heads", [True, False])
def test_rows_sharing_a_source_attend_to_one_copy_like_k_copies(average_heads):
    # Beam search's state: K rows per sentence read one copy of its cross-attention keys and
    # values (rows_per_source=K). Equal to K copies, through beam reorders within sentences and
    # a reorder that drops a sentence.
    model = make_model()
    src, _ = random_batch()
    k = 2
    enc = model.encode(src)
    tgt = torch.randint(4, V, (3 * k, 5), generator=torch.Generator().manual_seed(5))
    tgt[:, 0] = BOS
    grouped = model.init_state(enc, rows_per_source=k)
    copies = model.init_state(enc.index_select(torch.arange(3).repeat_interleave(k)))
    assert grouped.layers[0].cross_k.shape[0] == 3 and grouped.batch_size == copies.batch_size
    rows = torch.arange(3 * k)  # which row of tgt each state row continues
    reorders = {2: ([1, 1, 2, 3, 5, 4], True), 3: ([0, 1, 4, 5], False)}  # then sentence 1 ends
    for t in range(tgt.shape[1]):
        if t in reorders:
            index, same_source = torch.tensor(reorders[t][0]), reorders[t][1]
            grouped.reorder(index, same_source)
            copies.reorder(index, same_source)
            rows = rows[index]
        decoded = []
        for state in (grouped, copies):
            x = model.embed_target(tgt[rows, t][:, None], offset=state.step)
            for layer, cache in zip(model.decoder_layers, state.layers, strict=True):
                x, weights = layer(
                    x, cache.cross_k, cache.cross_v, None, state.cross_attn_mask, cache=cache,
                    need_weights=True, average_heads=average_heads,
                    rows_per_source=state.rows_per_source,
                )  # fmt: skip
            state.step += 1
            decoded.append((x, weights))
        (x_grouped, w_grouped), (x_copies, w_copies) = decoded
        assert w_grouped.shape == w_copies.shape  # [B, 1, S] or [B, h, 1, S]
        torch.testing.assert_close(x_grouped, x_copies, rtol=0, atol=1e-12)
        torch.testing.assert_close(w_grouped, w_copies, rtol=0, atol=1e-12)
    assert grouped.layers[0].cross_k.shape[0] == 2 and grouped.cross_attn_mask.shape[0] == 2
    logits, attn = model.decode_step(tgt[rows, 0], grouped, return_attention=True)
    expected, expected_attn = model.decode_step(tgt[rows, 0], copies, return_attention=True)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(attn, expected_attn, rtol=0, atol=1e-12)


def test_rows_per_source_must_be_positive():
    model = make_model()
    with pytest.raises(ValueError, match="rows_per_source"):
        model.init_state(model.encode(random_batch()[0]), rows_per_source=0)


def test_embeddings_shared_scaled_and_initialised():
    torch.manual_seed(0)
    cfg = apply_overrides(get_preset("tiny"), ["N=1", "d_model=64", "d_ff=64", "h=2", "d_k=8"])
    model = Transformer(cfg, vocab_size=4000, pad_id=PAD)
    # §3.4: one matrix; the pre-softmax projection is x @ E^T.
    assert model.tgt_embed is None and model.out_proj is None
    x = torch.randn(1, 2, 64)
    torch.testing.assert_close(model.project(x), x @ model.src_embed.weight.T)
    # N(0, d_model^-0.5): after the sqrt(d_model) scale the embeddings have unit variance.
    assert model.src_embed.weight.std().item() == pytest.approx(64**-0.5, rel=0.05)
    model.eval()
    tokens = torch.tensor([[7]])
    expected = model.src_embed.weight[7] * 8.0 + sinusoidal_encoding(1, 64)[0]
    torch.testing.assert_close(model.embed_source(tokens)[0, 0], expected)


def test_untied_model_has_separate_matrices_and_target_vocabulary():
    model = make_model("tie_embeddings=false", tgt_vocab_size=11)
    src, _ = random_batch()
    tgt = torch.tensor([[BOS, 4, 5]] * 3)
    assert model(src, tgt).shape == (3, 3, 11)
    tied = make_model()
    assert count_parameters(model) == count_parameters(tied) + 11 * 32 * 2


def test_attention_projections_are_bias_free_unless_flagged():
    # §3.2.2: W^Q, W^K, W^V, W^O are plain matrices; attention_bias=true adds a bias to each.
    model = make_model()
    projections = [
        module
        for attn in model.modules()
        if isinstance(attn, MultiHeadAttention)
        for module in attn.children()
    ]
    # N=2: one attention per encoder layer, two per decoder layer; self-attention stacks
    # W^Q, W^K, W^V in one layer (+ W^O), cross-attention W^Q and [W^K; W^V] (+ W^O)
    assert len(projections) == 4 * 2 + 2 * 3
    assert all(p.bias is None for p in projections)
    biased = make_model("attention_bias=true")
    assert count_parameters(biased) - count_parameters(model) == 6 * (2 * 4 * 8 + 4 * 6 + 32)
    src, tgt = random_batch()
    assert torch.isfinite(biased(src, tgt)).all()


def test_tied_model_rejects_a_different_target_vocabulary():
    with pytest.raises(ConfigError, match="tie_embeddings"):
        Transformer(small_cfg(), vocab_size=V, tgt_vocab_size=V + 1)


def test_learned_positions_refuse_positions_past_max_positions():
    model = make_model("positional=learned", "max_positions=8")
    src = torch.full((1, 9), 5)
    with pytest.raises(ValueError, match="max_positions=8"):
        model.encode(src)


def test_empty_source_row_gives_finite_outputs():
    model = make_model()
    src = torch.tensor([[5, 6, EOS], [PAD, PAD, PAD]])
    tgt = torch.tensor([[BOS, 4], [BOS, 4]])
    assert torch.isfinite(model(src, tgt)).all()


def test_dropout_only_in_training_mode():
    model = make_model(dtype=torch.float32)
    src, tgt = random_batch()
    torch.testing.assert_close(model(src, tgt), model(src, tgt))
    model.train()
    assert not torch.allclose(model(src, tgt), model(src, tgt))


@pytest.mark.parametrize("extra", [[], ["norm_first=true"]])
def test_fast_masks_equal_the_explicit_masks_on_real_positions(extra):
    """The decoder's self-attention as CAUSAL (SDPA is_causal) and no padding mask for a batch
    without padding give what explicit boolean masks give, on every real position."""
    from transformer_nmt.model.transformer import key_padding_mask

    model = make_model(*extra)
    src, tgt = random_batch()
    tgt[0, 4:] = PAD  # padded target rows too
    enc = model.encode(src)
    t = tgt.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    explicit = causal[None, None] & (tgt != PAD)[:, None, None, :]  # the former mask [B,1,T,T]
    x = model.embed_target(tgt)
    for layer in model.decoder_layers:
        cross_k, cross_v = layer.cross_attn.project_kv(enc.memory)
        x, _ = layer(x, cross_k, cross_v, explicit, enc.attn_mask())
    if model.decoder_norm is not None:
        x = model.decoder_norm(x)
    reference = model.project(x)
    fast, _ = model.decode(tgt, enc)
    real = tgt != PAD
    torch.testing.assert_close(fast[real], reference[real], rtol=1e-10, atol=1e-12)
    # a batch without padding needs no key padding mask at all
    assert key_padding_mask(torch.ones(2, 5, dtype=torch.bool)) is None
    assert key_padding_mask(src != PAD).shape == (3, 1, 1, 7)


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal"])
def test_per_head_attention_weights_equal_explicit_softmax(mask_kind):
    from transformer_nmt.model.attention import CAUSAL, MultiHeadAttention

    torch.manual_seed(3)
    h, d_k, d_v = 4, 5, 3
    mha = MultiHeadAttention(16, h, d_k, d_v, bias=True).double().eval()
    x_q, x_kv = torch.randn(2, 6, 16, dtype=torch.float64), torch.randn(2, 6, 16).double()
    mask = None
    if mask_kind == "padding":
        mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
        mask[1, ..., 4:] = False
    elif mask_kind == "causal":
        mask = CAUSAL
    _, per_head = mha(x_q, x_kv, mask, need_weights=True, average_heads=False)
    _, averaged = mha(x_q, x_kv, mask, need_weights=True)
    assert per_head.shape == (2, h, 6, 6)
    # softmax(Q K^T / sqrt(d_k)) per head, from the projection matrices by hand (§3.2.1)
    (w_q, w_k, _), (b_q, b_k, _) = (
        t.split(mha.qkv_sizes) for t in (mha.w_qkv.weight, mha.w_qkv.bias)
    )
    q = (x_q @ w_q.T + b_q).view(2, 6, h, d_k).transpose(1, 2)
    k = (x_kv @ w_k.T + b_k).view(2, 6, h, d_k).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # [B, h, L_q, L_k]
    if mask_kind == "padding":
        scores[1, :, :, 4:] = float("-inf")
    elif mask_kind == "causal":
        scores = scores.masked_fill(torch.ones(6, 6).triu(1).bool(), float("-inf"))
    expected = torch.exp(scores - scores.amax(-1, keepdim=True))
    expected = expected / expected.sum(-1, keepdim=True)
    torch.testing.assert_close(per_head, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(per_head.sum(-1), torch.ones(2, h, 6, dtype=torch.float64))
    torch.testing.assert_close(per_head.mean(dim=1), averaged, rtol=0, atol=1e-15)


def test_decode_returns_per_head_cross_attention_of_a_chosen_layer():
    model = make_model()
    src, tgt = random_batch()
    enc = model.encode(src)
    _, averaged = model.decode(tgt, enc, return_attention=True)  # last layer, [B, T, S]
    _, last = model.decode(tgt, enc, return_attention=True, average_heads=False)
    _, first = model.decode(tgt, enc, return_attention=True, attention_layer=0, average_heads=False)
    _, first_again = model.decode(
        tgt, enc, return_attention=True, attention_layer=-2, average_heads=False
    )
    assert last.shape == first.shape == (3, 4, 6, 7)  # [B, h, T, S]
    torch.testing.assert_close(last.mean(dim=1), averaged, rtol=0, atol=1e-15)
    torch.testing.assert_close(first, first_again, rtol=0, atol=0)
    assert not torch.allclose(first, last)
    torch.testing.assert_close(first.sum(-1), torch.ones(3, 4, 6, dtype=torch.float64))
    padded = (src == PAD)[:, None, None, :].expand_as(first)
    assert torch.all(first[padded] == 0) and torch.all(last[padded] == 0)
    with pytest.raises(ConfigError, match="attention_layer 2 out of range for 2"):
        model.decode(tgt, enc, return_attention=True, attention_layer=2)


def _unfused_attention(attn: MultiHeadAttention, x_q, x_kv, mask) -> torch.Tensor:
    """§3.2.2 written out with separate W^Q, W^K, W^V (the blocks of the stacked matrices) and
    an explicit softmax: the reference for the fused projections."""
    if attn.self_attention:
        w_q, w_k, w_v = attn.w_qkv.weight.split(attn.qkv_sizes)
    else:
        w_q = attn.w_q.weight
        w_k, w_v = attn.w_kv.weight.split(attn.kv_sizes)
    heads = []
    for i in range(attn.h):
        rows_k = slice(i * attn.d_k, (i + 1) * attn.d_k)
        rows_v = slice(i * attn.d_v, (i + 1) * attn.d_v)
        q, k, v = x_q @ w_q[rows_k].T, x_kv @ w_k[rows_k].T, x_kv @ w_v[rows_v].T
        scores = q @ k.transpose(-2, -1) / math.sqrt(attn.d_k)  # [B, L_q, L_k]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        heads.append(scores.softmax(dim=-1) @ v)  # [B, L_q, d_v]
    return torch.cat(heads, dim=-1) @ attn.w_o.weight.T  # Concat(head_1..h) W^O


def test_stacked_projections_equal_separate_matrices():
    model = make_model()
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    memory = torch.randn(3, 7, 32, dtype=torch.float64)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    layer = model.decoder_layers[0]
    self_out, _ = layer.self_attn(x, x, CAUSAL)
    torch.testing.assert_close(self_out, _unfused_attention(layer.self_attn, x, x, causal))
    # the self-attention's split paths (queries alone, keys/values alone) agree too
    k, v = layer.self_attn.project_kv(x)
    split_out, _ = layer.self_attn.attend(x, k, v, CAUSAL)
    torch.testing.assert_close(split_out, self_out, rtol=0, atol=1e-12)
    cross_out, _ = layer.cross_attn(x, memory)
    torch.testing.assert_close(cross_out, _unfused_attention(layer.cross_attn, x, memory, None))


def test_stacked_blocks_are_initialised_like_separate_matrices():
    # Xavier's bound uses each matrix's own fan-out, not the stacked layer's
    torch.manual_seed(0)
    cfg = apply_overrides(get_preset("tiny"), ["N=1", "d_model=256", "h=4", "d_k=64", "d_v=64"])
    attn = Transformer(cfg, vocab_size=V).encoder_layers[0].self_attn
    bound = math.sqrt(6 / (256 + 256))
    for block in attn.w_qkv.weight.split(attn.qkv_sizes):
        assert block.abs().max().item() <= bound
        assert block.abs().max().item() > 0.95 * bound  # not the stacked layer's smaller bound


def test_preallocated_cache_grows_and_reorders_like_full_recompute(monkeypatch):
    # a small first capacity: the buffers double several times during 9 steps
    from transformer_nmt.model.layers import LayerCache

    monkeypatch.setattr(LayerCache, "MIN_CAPACITY", 2)
    model = make_model()
    src, _ = random_batch()
    g = torch.Generator().manual_seed(5)
    tgt = torch.randint(4, V, (3, 9), generator=g)
    tgt[:, 0] = BOS
    enc = model.encode(src)
    state = model.init_state(enc)
    rows = torch.arange(3)  # which original row each cached row continues
    # beam-style reorderings with repeated rows (steps 3-5, the batch keeps its size), then
    # finished rows dropped (step 6)
    reorders = {3: [2, 0, 0], 4: [1, 2, 0], 5: [0, 0, 1], 6: [1, 2]}
    capacities, buffers = set(), set()
    for t in range(tgt.shape[1]):
        if t in reorders:
            index = torch.tensor(reorders[t])
            state.reorder(index)
            rows = rows[index]
            if t in (4, 5):
                buffers.add(state.layers[0]._k.data_ptr())
        logits, _ = model.decode_step(tgt[rows, t], state)
        full, _ = model.decode(tgt[rows, : t + 1], enc.index_select(rows))
        torch.testing.assert_close(logits, full[:, t], rtol=0, atol=1e-12)
        capacities.add(state.layers[0].capacity)
    assert capacities == {2, 6, 14}  # grown in place of a copy per step
    # reorders of one batch size alternate between two buffers instead of allocating
    assert len(buffers) == 2
    assert state.layers[0].self_k.shape == (2, 4, 9, 8)


def test_decode_step_into_a_reused_logits_buffer_equals_fresh_logits():
    model = make_model().eval()
    src, _ = random_batch()
    g = torch.Generator().manual_seed(9)
    tgt = full_tgt = torch.randint(4, V, (3, 5), generator=g)
    enc = model.encode(src)
    with torch.no_grad():
        fresh_state, reused_state = model.init_state(enc), model.init_state(enc)
        reused_state.reuse_logits = True
        pointers = set()
        for t in range(tgt.shape[1]):
            if t == 3:  # a finished row leaves: the buffer's first rows serve the smaller batch
                for state in (fresh_state, reused_state):
                    state.reorder(torch.tensor([0, 2]))
                tgt = tgt[[0, 2]]
            expected, _ = model.decode_step(tgt[:, t], fresh_state)
            logits, _ = model.decode_step(tgt[:, t], reused_state)
            torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)
            pointers.add(logits.data_ptr())
    assert len(pointers) == 1  # one buffer for every step
    with torch.no_grad():  # the default: a new tensor per step, which a caller may keep
        state = model.init_state(enc)
        first, _ = model.decode_step(full_tgt[:, 0], state)
        kept = first.clone()
        model.decode_step(full_tgt[:, 1], state)
    assert torch.equal(first, kept)


def test_the_logits_buffer_is_not_used_under_autocast_and_decoding_is_unchanged():
    """Beam search on a GPU decodes under bf16 autocast, where the projection's dtype is
    autocast's and not the buffer's: the same branch on a CPU's autocast takes the plain
    projection, a new bf16 tensor per step equal to the no-buffer state's."""
    model = make_model().float().eval()  # (autocast leaves float64 alone)
    src, _ = random_batch()
    tgt = torch.randint(4, V, (3, 5), generator=torch.Generator().manual_seed(9))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        enc = model.encode(src)
        fresh_state, reused_state = model.init_state(enc), model.init_state(enc)
        reused_state.reuse_logits = True
        for t in range(tgt.shape[1]):
            expected, _ = model.decode_step(tgt[:, t], fresh_state)
            logits, _ = model.decode_step(tgt[:, t], reused_state)
            assert logits.dtype == expected.dtype == torch.bfloat16
            assert torch.equal(logits, expected)
    assert reused_state._logits is None  # never allocated


@pytest.mark.parametrize("mask_kind", ["padding", "causal"])
def test_cpu_bf16_attention_is_the_explicit_product_with_sdpas_numbers(mask_kind, monkeypatch):
    """On a CPU in bf16 eq. 1 runs as written (faster there than SDPA's kernels); its output
    and gradients equal SDPA's within bf16 rounding, and its weights are those returned."""
    from transformer_nmt.model import attention

    assert attention._explicit_product(torch.zeros(1).bfloat16())
    assert not attention._explicit_product(torch.zeros(1))
    g = torch.Generator().manual_seed(5)
    mask = CAUSAL
    if mask_kind == "padding":
        mask = torch.ones(3, 1, 1, 9, dtype=torch.bool)
        mask[1, ..., 6:] = False
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=16, h=4, d_k=8, d_v=8).bfloat16()
    x = torch.randn(3, 9, 16, generator=g).bfloat16()

    def attend() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xq = x.clone().requires_grad_()
        q, k, v = mha.project_qkv(xq)
        out, weights = mha.attend(xq, k, v, mask, need_weights=True, q=q)
        out.float().square().sum().backward()
        return out.float(), xq.grad.float(), weights.float()

    out_explicit, grad_explicit, weights_explicit = attend()
    # the weights are, per head, the ones the explicit product multiplied V by: out = w_o(P V)
    with torch.no_grad():
        q, k, v = mha.project_qkv(x)
        out, per_head = mha.attend(x, k, v, mask, need_weights=True, average_heads=False, q=q)
        assert per_head.shape == (3, 4, 9, 9)
        heads = (per_head @ v).transpose(1, 2).reshape(3, 9, 4 * 8)  # [B, L, h*d_v]
        assert torch.equal(mha.w_o(heads), out)
    monkeypatch.setattr(attention, "_explicit_product", lambda q: False)
    out_sdpa, grad_sdpa, _ = attend()
    torch.testing.assert_close(out_explicit, out_sdpa, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(grad_explicit, grad_sdpa, atol=5e-2, rtol=5e-2)
    # The weights returned are eq. 1's softmax(Q K^T / sqrt(d_k)) under the mask, against a
    # float64 computation from the same bf16 Q and K
    with torch.no_grad():
        q, k, _ = (t.double() for t in mha.project_qkv(x))
        scores = q @ k.transpose(-2, -1) / 8**0.5  # [B, h, L, L]
        allowed = torch.ones(9, 9, dtype=torch.bool).tril() if mask_kind == "causal" else mask
        reference = scores.masked_fill(~allowed, float("-inf")).softmax(-1).mean(1)  # [B, L, L]
    # bf16 rounds the scores (|s| < 2 here: <= 2^-8 absolute, moving a weight w <= 1 by < 2 *
    # 2^-8 * w) and then each weight (<= 2^-9 w): together < 0.01 (seen: 8e-4, 1.3e-3)
    assert scores.abs().max() < 2
    torch.testing.assert_close(weights_explicit.double(), reference, atol=1e-2, rtol=0)
    if mask_kind == "padding":
        assert weights_explicit[1, :, 6:].abs().sum() == 0  # no weight on padding
    else:
        assert torch.equal(weights_explicit[0].triu(1), torch.zeros(9, 9))  # none on the future


@pytest.mark.parametrize("norm", ["norm_first=false", "norm_first=true"])
def test_the_training_forward_compiles_to_one_graph(norm, monkeypatch):
    """``train.compile``: torch.compile sees the whole training forward as one graph, padding
    and the CPU's dropout fast path included; a graph break (a value read back from a tensor, an
    in-place random draw) splits it, and the compiler can then fuse nothing across the split."""
    monkeypatch.setenv("TRANSFORMER_NMT_CPU_FAST_PATHS", "on")
    model = make_model(norm, dtype=torch.float32).train()
    src, tgt_in = random_batch()  # padded: the key padding mask is needed
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(src, tgt_in)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1
