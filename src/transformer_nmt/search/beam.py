"""§6.1 Batched beam search with the GNMT length penalty and exact early stopping.

Objective: a finished hypothesis Y (tokens then EOS) scores log P(Y | X) / lp(Y), with
lp(Y) = ((5 + |Y|) / 6)^alpha and |Y| counting the final EOS (``length_penalty``).

One step, for every sentence of the batch with K = ``beam_size`` live hypotheses:
1. extend every live hypothesis by every token: K * V candidates scored by their log-probability;
2. take the 2K best candidates (at most K of them end in EOS, so K others remain);
3. an EOS candidate ranked among the best K is finished (it fills one of the K slots of the
   beam, as in fairseq and Wu et al. 2016); the K best non-EOS candidates live on.
A sentence is done when (a) it has K finished hypotheses (the beam is used up; this is what
makes ``beam_size=1`` identical to greedy search), or (b) early stopping: it has ``nbest``
finished hypotheses and no live one can still beat the worst of them, or (c) every hypothesis
reached the maximum length ``len(source) + max_len_b`` tokens, where EOS is forced.
With ``early_stop="best"`` (a speed flag; the default "exact" is the rule above) (b) becomes
the heuristic of OpenNMT-py/eole and CTranslate2: the sentence is done once it has ``nbest``
finished hypotheses and the best candidate of a step ends in EOS. It decodes fewer steps, and
may miss a longer hypothesis that the length penalty would have ranked first.

The bound in (b) is exact for the length-penalised objective: log-probabilities only decrease as
tokens are added, so a live hypothesis with log-probability s <= 0 can finish with at best
s / lp_max, where lp_max is the largest penalty of any length it can still reach (its next
length or the maximum length; lp is monotonic in |Y|). A longer hypothesis's normalised score
can improve with alpha > 0, which is why the bound divides by the largest reachable lp and not
by the current one. (b) therefore never changes the result of (a)/(c): it only stops earlier.

Finished sentences leave the batch (their rows are dropped from the cache) so the others run on
a smaller batch.

Several α in one search (``beam_search_per_alpha``, for choosing α on a dev set, §6.1): α enters
nothing but the finished hypotheses' scores and the bound of (b). The candidates of steps 1.-3.
are ranked by log-probability alone, and (a), (c) and ``early_stop="best"`` do not read a score,
so the live hypotheses and the finished ones are the same for every α. One search that stops a
sentence only once (b) holds for every α of the set has, for each α, every hypothesis that α's
own search finishes, and none that could beat that α's best (the bound): each α's n-best equals
what ``beam_search`` with that α returns, for the cost of the α that searches longest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from transformer_nmt.model.transformer import Transformer
from transformer_nmt.search._stepper import Stepper, eval_mode, restrict_
from transformer_nmt.search.length_penalty import length_penalty
from transformer_nmt.search.settings import EARLY_STOP, SearchSettings
from transformer_nmt.search.topk import top_k_per_row


@dataclass
class Hypothesis:
    """A finished hypothesis: ``tokens`` (no BOS, no EOS), ``score`` = log_prob / lp(Y),
    ``log_prob`` = log P(tokens EOS | source) and, when asked for, ``attention`` [T, S]: the last
    decoder layer's encoder-decoder attention averaged over heads, one row per generated symbol
    (T = len(tokens) + 1, EOS included) and one column per source token (S without padding)."""

    tokens: list[int]
    score: float
    log_prob: float
    attention: torch.Tensor | None = None


def beam_search(
    model: Transformer, src: torch.Tensor, *, alpha: float = SearchSettings.alpha, **options: Any
) -> list[list[Hypothesis]]:
    """Beam-search ``src`` [B, S] (padded with ``pad_id``); returns, in input order, each
    sentence's ``nbest`` best finished hypotheses, best first. ``options``: the keyword
    arguments of ``beam_search_per_alpha`` (``bos_id``, ``eos_id``, ``pad_id`` required).

    ``min_len`` (default 0, for benchmarks) forbids EOS before that many tokens.
    """
    return beam_search_per_alpha(model, src, (alpha,), **options)[alpha]


def beam_search_per_alpha(
    model: Transformer,
    src: torch.Tensor,
    alphas: Sequence[float],
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    beam_size: int = SearchSettings.beam,
    max_len_b: int = SearchSettings.max_len_b,
    nbest: int = SearchSettings.nbest,
    use_cache: bool = True,
    return_attention: bool = False,
    min_len: int = 0,
    early_stop: str = SearchSettings.early_stop,
) -> dict[float, list[list[Hypothesis]]]:
    """``beam_search`` of ``src`` for every α of ``alphas`` in one search (module docstring):
    α -> each sentence's ``nbest`` best finished hypotheses under that α, best first."""
    alphas = tuple(dict.fromkeys(float(a) for a in alphas))  # distinct, in the given order
    if not alphas:
        raise ValueError("alphas must name at least one length penalty")
    if min(alphas) < 0:
        raise ValueError(f"every alpha must be >= 0, got {alphas}")
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest must be between 1 and beam_size={beam_size}, got {nbest}")
    if early_stop not in EARLY_STOP:
        raise ValueError(f"early_stop must be one of {EARLY_STOP}, got {early_stop!r}")
    batch, k = src.shape[0], beam_size
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    if batch == 0:
        return {alpha: [] for alpha in alphas}
    device = src.device
    src_len = (src != pad_id).sum(dim=1)  # [B]
    max_len = (src_len + max_len_b).tolist()  # longest output (tokens without EOS) per sentence
    src_len_list = src_len.tolist()
    neg_inf = float("-inf")

    with eval_mode(model):
        # Encode once per sentence; its K hypotheses are rows b*K .. b*K + K-1 of the decoder,
        # which share the sentence's cross-attention keys and values.
        stepper = Stepper(
            model,
            model.encode(src),
            use_cache=use_cache,
            return_attention=return_attention,
            rows_per_source=k,
        )
        active = list(range(batch))  # original index of each live sentence
        scores = torch.zeros(batch, k, device=device)  # [n, K] log-probs of live hypotheses
        scores[:, 1:] = neg_inf  # at the start only one (empty) hypothesis per sentence
        tokens = torch.empty(batch * k, 0, dtype=torch.long, device=device)  # [n*K, t]
        attn_hist = None  # [n*K, t, S] cross-attention rows of live hypotheses
        last = torch.full((batch * k,), bos_id, dtype=torch.long, device=device)
        step = 0  # tokens generated so far by every live hypothesis
        while active:
            n = len(active)
            lprobs, attn = stepper.step(last)  # [n*K, V], [n*K, S] or None
            row_max_len = torch.tensor(max_len, device=device)[active].repeat_interleave(k)
            restrict_(
                lprobs,
                step=step,
                max_len=row_max_len,
                min_len=min_len,
                bos_id=bos_id,
                eos_id=eos_id,
                pad_id=pad_id,
            )
            # 1.-2. The 2K best of the K * V candidates are among each hypothesis's own 2K best
            # tokens (a candidate with 2K better ones in its own row has 2K better ones in
            # all), so rank per row first: [n*K, V] is only read, never added to or copied.
            width = min(2 * k, lprobs.shape[1])
            row_lprobs, row_tok = top_k_per_row(lprobs, width)  # [n*K, W]
            # scores follow the model's dtype (float64 models search in float64)
            cand = (scores.to(lprobs.dtype).reshape(n * k, 1) + row_lprobs).view(n, k * width)
            top_scores, top_idx = cand.topk(min(2 * k, k * width), dim=1)  # [n, 2K]
            top_beam = torch.div(top_idx, width, rounding_mode="floor")  # [n, 2K]
            top_tok = row_tok.view(n, k * width).gather(1, top_idx)  # [n, 2K]
            is_eos = top_tok == eos_id
            rank = torch.arange(top_idx.shape[1], device=device)
            ends = is_eos & (rank < k)[None] & torch.isfinite(top_scores)  # [n, 2K]

            # 3a. finish the EOS candidates ranked among the K best.
            for i, j in ends.nonzero().tolist():
                b = active[i]
                row = i * k + int(top_beam[i, j])
                hyp_tokens = tokens[row].tolist()
                log_prob = float(top_scores[i, j])
                attention = None
                if attn is not None:
                    rows = [attn_hist[row]] if attn_hist is not None else []
                    attention = torch.cat([*rows, attn[row][None]], dim=0)  # [t+1, S]
                    attention = attention[:, : src_len_list[b]].float().cpu()
                # scored under the first α; _nbest ranks and scores it under each α at the end
                finished[b].append(
                    Hypothesis(
                        tokens=hyp_tokens,
                        score=log_prob / length_penalty(len(hyp_tokens) + 1, alphas[0]),
                        log_prob=log_prob,
                        attention=attention,
                    )
                )

            # 3b. the K best non-EOS candidates live on (sort key: EOS last, then rank).
            order = (is_eos.long() * top_idx.shape[1] + rank[None]).argsort(dim=1)[:, :k]
            scores = top_scores.gather(1, order)  # [n, K]
            new_tok = top_tok.gather(1, order)  # [n, K]
            parent = torch.arange(n, device=device)[:, None] * k + top_beam.gather(1, order)
            parent = parent.view(-1)  # [n*K] rows of the previous step
            tokens = torch.cat([tokens[parent], new_tok.view(-1, 1)], dim=1)  # [n*K, t+1]
            if attn is not None:
                new_attn = attn[parent][:, None]  # [n*K, 1, S]
                attn_hist = (
                    new_attn
                    if attn_hist is None
                    else torch.cat([attn_hist[parent], new_attn], dim=1)
                )
            stepper.reorder(parent, same_source=True)  # parents are beams of the same sentence
            last = new_tok.view(-1)
            step += 1

            # Which sentences are done? (a) K finished, (b) early stopping, (c) maximum length.
            best_live = scores.max(dim=1).values.tolist()  # [n]
            best_ended = ends[:, 0].tolist() if early_stop == "best" else [False] * n  # [n]
            keep = []
            for i, b in enumerate(active):
                done_b = len(finished[b]) >= k or step > max_len[b] or best_live[i] == neg_inf
                if not done_b and len(finished[b]) >= nbest and best_ended[i]:
                    done_b = True  # early_stop="best": this step's best candidate ended
                if not done_b and len(finished[b]) >= nbest:  # (b), for every α
                    done_b = all(
                        _no_live_can_win(finished[b], best_live[i], step, max_len[b], a, nbest)
                        for a in alphas
                    )
                if not done_b:
                    keep.append(i)
            if len(keep) < n:
                keep_t = torch.tensor(keep, dtype=torch.long, device=device)
                rows = (keep_t[:, None] * k + torch.arange(k, device=device)[None]).view(-1)
                stepper.reorder(rows)
                scores, tokens, last = scores[keep_t], tokens[rows], last[rows]
                if attn_hist is not None:
                    attn_hist = attn_hist[rows]
                active = [active[i] for i in keep]

    return {alpha: [_nbest(hyps, alpha, nbest) for hyps in finished] for alpha in alphas}


def _scored(hyp: Hypothesis, alpha: float) -> float:
    """log P(Y | X) / lp(Y) of a finished hypothesis (|Y| counts its EOS)."""
    return hyp.log_prob / length_penalty(len(hyp.tokens) + 1, alpha)


def _no_live_can_win(
    finished: list[Hypothesis], best_live: float, step: int, max_len: int, alpha: float, nbest: int
) -> bool:
    """(b) under ``alpha``: no live hypothesis (the best has log-probability ``best_live``) can
    finish above the ``nbest``-th best finished one, dividing by the largest reachable lp."""
    worst_nbest = sorted(_scored(h, alpha) for h in finished)[-nbest]
    lp_max = max(length_penalty(step + 1, alpha), length_penalty(max_len + 1, alpha))
    return best_live / lp_max <= worst_nbest


def _nbest(finished: list[Hypothesis], alpha: float, nbest: int) -> list[Hypothesis]:
    """The ``nbest`` best of ``finished`` under ``alpha``, best first (ties: the one finished
    first), each with its score under ``alpha``."""
    ranked = sorted(((_scored(h, alpha), h) for h in finished), key=lambda pair: -pair[0])
    return [replace(h, score=score) for score, h in ranked[:nbest]]
