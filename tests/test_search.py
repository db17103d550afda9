"""§6.1 search: greedy, beam search, length penalty, early stopping, cache equivalence."""

from __future__ import annotations

import itertools

import pytest
import torch

from transformer_nmt.errors import ConfigError
from transformer_nmt.model import Transformer, apply_overrides, get_preset
from transformer_nmt.search import (
    Hypothesis,
    SearchSettings,
    beam_search,
    beam_search_per_alpha,
    greedy_search,
    length_penalty,
)

PAD, UNK, BOS, EOS = 0, 1, 2, 3
IDS = {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD}


def make_model(vocab: int, eos_bias: float, seed: int = 0) -> Transformer:
    """A random float64 model whose EOS logit is raised by ``eos_bias`` everywhere, so that
    hypotheses end at varied lengths (a random model alone almost never emits EOS)."""
    torch.manual_seed(seed)
    cfg = apply_overrides(get_preset("tiny"), ["N=2", "d_model=32", "d_ff=64", "h=4", "d_k=8"])
    model = Transformer(cfg, vocab_size=vocab, pad_id=PAD).double().eval()
    e_eos = model.src_embed.weight[EOS].detach()
    with torch.no_grad():  # post-LN: the last LayerNorm's bias feeds the tied output projection
        model.decoder_layers[-1].res_ffn.norm.bias += eos_bias * e_eos / e_eos.norm() ** 2
    return model


def sources(vocab: int, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths = [6, 2, 4, 5, 1]
    src = torch.full((len(lengths), max(lengths)), PAD)
    for b, n in enumerate(lengths):
        src[b, : n - 1] = torch.randint(4, vocab, (n - 1,), generator=g)
        src[b, n - 1] = EOS
    return src


def sequence_log_prob(model: Transformer, src_row: torch.Tensor, tokens: list[int]) -> float:
    """log P(tokens EOS | src) by teacher forcing with the full (uncached) model."""
    src = src_row[src_row != PAD][None]
    tgt_in = torch.tensor([[BOS, *tokens]])
    tgt_out = torch.tensor([[*tokens, EOS]])
    with torch.no_grad():
        lprobs = model(src, tgt_in).log_softmax(-1)  # [1, T, V]
    return lprobs.gather(2, tgt_out[..., None]).sum().item()


def test_length_penalty_formula():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(10, 0.6) == pytest.approx((15 / 6) ** 0.6)
    assert length_penalty(51, 0.6) == pytest.approx((56 / 6) ** 0.6)
    assert length_penalty(7, 0.0) == 1.0


@pytest.mark.parametrize("use_cache", [True, False])
def test_beam_size_one_is_greedy(use_cache):
    model = make_model(15, eos_bias=1.0)
    src = sources(15)
    greedy = greedy_search(model, src, max_len_b=6, use_cache=use_cache, **IDS)
    beam = beam_search(model, src, beam_size=1, max_len_b=6, use_cache=use_cache, **IDS)
    assert [hyps[0].tokens for hyps in beam] == greedy
    assert len({len(out) for out in greedy}) > 1  # outputs of varied lengths were produced


def test_cache_and_recompute_give_identical_searches():
    model = make_model(15, eos_bias=1.5)
    src = sources(15)
    kwargs = {"beam_size": 4, "nbest": 4, "max_len_b": 5, "return_attention": True, **IDS}
    cached = beam_search(model, src, use_cache=True, **kwargs)
    recomputed = beam_search(model, src, use_cache=False, **kwargs)
    for hyps_a, hyps_b in zip(cached, recomputed, strict=True):
        assert [h.tokens for h in hyps_a] == [h.tokens for h in hyps_b]
        for a, b in zip(hyps_a, hyps_b, strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-10)
            torch.testing.assert_close(a.attention, b.attention, rtol=0, atol=1e-6)


def test_batch_equals_one_sentence_at_a_time():
    model = make_model(15, eos_bias=1.5)
    src = sources(15)
    batched = beam_search(model, src, nbest=2, max_len_b=5, **IDS)
    batched_greedy = greedy_search(model, src, max_len_b=5, **IDS)
    for b in range(src.shape[0]):
        row = src[b : b + 1, : int((src[b] != PAD).sum())]
        alone = beam_search(model, row, nbest=2, max_len_b=5, **IDS)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[b]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batched[b]], abs=1e-10)
        assert greedy_search(model, row, max_len_b=5, **IDS)[0] == batched_greedy[b]


def test_hypothesis_scores_are_length_penalised_log_probs():
    model = make_model(15, eos_bias=1.5)
    src = sources(15)
    alpha = 0.6
    results = beam_search(model, src, beam_size=4, nbest=4, alpha=alpha, max_len_b=5, **IDS)
    for b, hyps in enumerate(results):
        assert len(hyps) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 4
        for h in hyps:
            assert isinstance(h, Hypothesis)
            assert PAD not in h.tokens and BOS not in h.tokens and EOS not in h.tokens
            assert h.log_prob == pytest.approx(sequence_log_prob(model, src[b], h.tokens), abs=1e-9)
            assert h.score == pytest.approx(h.log_prob / length_penalty(len(h.tokens) + 1, alpha))


def test_attention_rows_cover_the_unpadded_source():
    model = make_model(15, eos_bias=1.5)
    src = sources(15)
    results = beam_search(model, src, max_len_b=5, return_attention=True, **IDS)
    for b, hyps in enumerate(results):
        attn = hyps[0].attention
        src_len = int((src[b] != PAD).sum())
        assert attn.shape == (len(hyps[0].tokens) + 1, src_len)
        torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[0], dtype=attn.dtype))
    assert beam_search(model, src, max_len_b=5, **IDS)[0][0].attention is None


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_equals_exhaustive_enumeration(alpha):
    """Vocabulary {PAD, UNK, BOS, EOS, 4, 5}: PAD and BOS are never generated, so outputs are
    words over {UNK, 4, 5} of length 0..L then EOS, L = len(source) + max_len_b. A beam of 64
    keeps every prefix (at most 3^3 = 27 live), so it must find the exhaustive optimum of
    log P(y EOS | x) / lp(|y| + 1)."""
    vocab = 6
    model = make_model(vocab, eos_bias=1.5, seed=4)
    src = torch.tensor([[4, 5, EOS], [5, EOS, PAD]])  # L = 3 and 2 with max_len_b = 0
    results = beam_search(model, src, beam_size=64, nbest=5, alpha=alpha, max_len_b=0, **IDS)
    for b, max_len in enumerate([3, 2]):
        scored = []
        for n in range(max_len + 1):
            for tokens in itertools.product([UNK, 4, 5], repeat=n):
                log_prob = sequence_log_prob(model, src[b], list(tokens))
                scored.append((log_prob / length_penalty(n + 1, alpha), list(tokens)))
        scored.sort(key=lambda item: -item[0])
        best = results[b]
        assert [h.tokens for h in best] == [tokens for _, tokens in scored[:5]]
        assert [h.score for h in best] == pytest.approx([s for s, _ in scored[:5]], abs=1e-10)


def test_early_stopping_never_changes_the_best_hypothesis():
    """With nbest=1 the exact bound stops a sentence as soon as no live hypothesis can beat the
    best finished one; with nbest=beam_size it runs until the beam is used up. Same winner."""
    for seed in range(4):
        model = make_model(15, eos_bias=1.5, seed=seed)
        src = sources(15, seed=seed)
        early = beam_search(model, src, beam_size=4, nbest=1, alpha=0.6, max_len_b=8, **IDS)
        full = beam_search(model, src, beam_size=4, nbest=4, alpha=0.6, max_len_b=8, **IDS)
        for e, f in zip(early, full, strict=True):
            assert e[0].tokens == f[0].tokens
            assert e[0].score == pytest.approx(f[0].score, abs=1e-12)


def test_maximum_length_is_source_length_plus_max_len_b():
    model = make_model(15, eos_bias=-50.0)  # EOS practically never chosen: outputs run to the end
    src = sources(15)
    src_len = (src != PAD).sum(1).tolist()
    greedy = greedy_search(model, src, max_len_b=3, **IDS)
    beam = beam_search(model, src, max_len_b=3, **IDS)
    assert [len(out) for out in greedy] == [n + 3 for n in src_len]
    assert [len(hyps[0].tokens) for hyps in beam] == [n + 3 for n in src_len]


def test_min_len_forbids_early_eos():
    model = make_model(15, eos_bias=50.0)  # EOS always first choice when allowed
    src = sources(15)
    assert greedy_search(model, src, max_len_b=5, **IDS) == [[]] * src.shape[0]
    out = greedy_search(model, src, max_len_b=5, min_len=4, **IDS)
    assert [len(tokens) for tokens in out] == [4] * src.shape[0]
    beam = beam_search(model, src, max_len_b=5, min_len=4, **IDS)
    assert [len(hyps[0].tokens) for hyps in beam] == [4] * src.shape[0]


def test_search_restores_training_mode_and_checks_arguments():
    model = make_model(15, eos_bias=0.0).train()
    src = sources(15)
    first = greedy_search(model, src, max_len_b=2, **IDS)
    assert model.training
    assert greedy_search(model, src, max_len_b=2, **IDS) == first  # no dropout during search
    with pytest.raises(ValueError, match="nbest"):
        beam_search(model, src, beam_size=2, nbest=3, **IDS)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, beam_size=0, **IDS)
    assert beam_search(model, src[:0], **IDS) == [] and greedy_search(model, src[:0], **IDS) == []


def count_decoded_rows(model: Transformer) -> list[int]:
    """Record the rows (live hypotheses) of every cached decoder step of ``model``."""
    rows: list[int] = []
    step = model.decode_step

    def counting(tokens, *args, **kwargs):
        rows.append(tokens.shape[0])
        return step(tokens, *args, **kwargs)

    model.decode_step = counting
    return rows


def test_best_early_stop_decodes_less_and_never_finds_a_better_hypothesis():
    """early_stop="best" (OpenNMT-py/eole, CTranslate2) follows the same beams as "exact" and
    stops a sentence sooner: its winner is among exact's finished hypotheses, so it never scores
    higher than exact's, and beam 1 is still greedy search."""
    fewer = 0
    for seed in range(4):
        model = make_model(15, eos_bias=1.0, seed=seed)
        src = sources(15, seed=seed)
        rows = count_decoded_rows(model)
        kwargs = {"beam_size": 4, "alpha": 0.6, "max_len_b": 8, **IDS}
        exact = beam_search(model, src, early_stop="exact", **kwargs)
        exact_rows, rows[:] = sum(rows), []
        best = beam_search(model, src, early_stop="best", **kwargs)
        best_rows = sum(rows)
        assert best_rows <= exact_rows
        fewer += best_rows < exact_rows
        for i, (e, b) in enumerate(zip(exact, best, strict=True)):
            assert b[0].score <= e[0].score + 1e-12
            assert b[0].score == pytest.approx(
                sequence_log_prob(model, src[i], b[0].tokens)
                / length_penalty(len(b[0].tokens) + 1, 0.6),
                abs=1e-9,
            )
        greedy = greedy_search(model, src, max_len_b=8, **IDS)
        beam1 = beam_search(model, src, beam_size=1, max_len_b=8, early_stop="best", **IDS)
        assert [hyps[0].tokens for hyps in beam1] == greedy
    assert fewer > 0  # the rule did stop some searches sooner
    with pytest.raises(ValueError, match="early_stop"):
        beam_search(model, src, early_stop="soon", **IDS)
    with pytest.raises(ConfigError, match="--early-stop"):
        SearchSettings(early_stop="soon")


ALPHAS = (0.0, 0.6, 1.0, 1.6, 3.0)


@pytest.mark.parametrize("early_stop", ["exact", "best"])
@pytest.mark.parametrize("nbest", [1, 2])
def test_one_search_for_several_alphas_equals_one_search_per_alpha(early_stop, nbest):
    """beam_search_per_alpha: each α's n-best (tokens, scores, order) equals beam_search's with
    that α, over models whose outputs end at varied lengths, and the one search decodes no more
    rows than the α that searches longest alone."""
    differ = longer = 0
    for seed in range(5):
        model = make_model(15, eos_bias=1.0 + 0.25 * seed, seed=seed)
        src = sources(15, seed=seed)
        rows = count_decoded_rows(model)
        kwargs = {"beam_size": 4, "nbest": nbest, "max_len_b": 8, "early_stop": early_stop, **IDS}
        together = beam_search_per_alpha(model, src, ALPHAS, **kwargs)
        together_rows, rows[:] = sum(rows), []
        assert list(together) == list(ALPHAS)
        alone_rows = []
        for alpha in ALPHAS:
            alone = beam_search(model, src, alpha=alpha, **kwargs)
            alone_rows.append(sum(rows))
            rows[:] = []
            for t, a in zip(together[alpha], alone, strict=True):
                assert [h.tokens for h in t] == [h.tokens for h in a]
                # The two searches decode different sets of live sentences, so their float64
                # GEMMs have other row counts, and BLAS may pick other kernels for them (a
                # 2-core Xeon with AVX512: 1 ulp apart). Bound: <= 14 steps of ~20 products
                # over <= 64 terms, each within 64 eps relative: ~4e-12; 2e-11 with a margin.
                assert [h.score for h in t] == pytest.approx([h.score for h in a], rel=2e-11)
                assert [h.log_prob for h in t] == pytest.approx([h.log_prob for h in a], rel=2e-11)
        assert together_rows <= max(alone_rows)
        longer += min(alone_rows) < max(alone_rows)
        bests = {tuple(tuple(h[0].tokens) for h in together[a]) for a in ALPHAS}
        differ += len(bests) > 1
    assert differ > 0  # α changed some winner: the test can tell the α apart
    if early_stop == "exact":
        assert longer > 0  # some α searched longer alone than others: the bound depends on α


def test_per_alpha_search_checks_its_alphas_and_keeps_each_once():
    model = make_model(15, eos_bias=1.0)
    src = sources(15)
    with pytest.raises(ValueError, match="alpha"):
        beam_search_per_alpha(model, src, [], **IDS)
    with pytest.raises(ValueError, match="alpha"):
        beam_search_per_alpha(model, src, [0.6, -0.1], **IDS)
    out = beam_search_per_alpha(model, src, [1.0, 0.6, 1], max_len_b=4, **IDS)
    assert list(out) == [1.0, 0.6]
    assert beam_search_per_alpha(model, src[:0], [0.6, 1.0], **IDS) == {0.6: [], 1.0: []}


@pytest.mark.parametrize("block", [16, 128])
@pytest.mark.parametrize("vocab", [7, 100, 1000, 1024])
@pytest.mark.parametrize("k", [1, 7])  # the search asks for min(2K, V) <= V
def test_row_topk_returns_torch_topk_values(block, vocab, k, monkeypatch):
    from transformer_nmt.search import topk

    monkeypatch.setattr(topk, "ROW_TOPK_BLOCK", block)
    g = torch.Generator().manual_seed(vocab + k)
    scores = torch.randint(-50, 50, (6, vocab), generator=g).float()  # many equal values
    scores[1] = float("-inf")  # a row whose only finite entry is one token (at max length)
    scores[1, vocab - 1] = 0.0
    scores[2, :] = 3.0  # a row of ties
    values, columns = topk.row_topk(scores, k)
    expected = scores.topk(k, dim=1).values
    assert torch.equal(values, expected)
    assert torch.equal(scores.gather(1, columns), values)
    assert all(len(set(row)) == k for row in columns.tolist())  # k distinct columns per row


@pytest.mark.parametrize("use_cache", [True, False])
def test_block_top_k_search_equals_plain_top_k_search(use_cache, monkeypatch):
    from transformer_nmt.search import topk

    model = make_model(15, eos_bias=1.5)
    src = sources(15)
    kwargs = {"beam_size": 2, "nbest": 2, "max_len_b": 6, "use_cache": use_cache, **IDS}
    monkeypatch.setattr(topk, "ROW_TOPK_BLOCK", 10**9)  # torch.topk over whole rows
    plain = beam_search(model, src, **kwargs)
    monkeypatch.setattr(topk, "ROW_TOPK_BLOCK", 2)  # 7 blocks and a tail column
    blocked = beam_search(model, src, **kwargs)
    for a, b in zip(plain, blocked, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == [h.score for h in b]
