"""Beam search's per-row top-k (§6.1: the K best continuations of each hypothesis), with a
faster way to find them on a CPU (``row_topk``) behind the CPU fast-path switch."""

from __future__ import annotations

import torch

from transformer_nmt import fast_paths


def top_k_per_row(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(scores, k, dim=1)``'s values and columns: by ``row_topk`` where the
    ``row_topk`` fast path is on (the default), else by torch.topk itself."""
    if fast_paths.enabled("row_topk"):
        return row_topk(scores, k)
    return scores.topk(k, dim=1)


ROW_TOPK_BLOCK = 64  # columns per block of ``row_topk`` (32-512 measured: 64 was fastest)


def row_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest entries of each row of ``scores`` [N, V] and their columns, largest
    first: the values of ``torch.topk(scores, k, dim=1)``. Ties have no rule: where equal values
    straddle the k-th place, which of their columns come back is unspecified, here as in
    ``torch.topk`` (whose order of equal values is not documented either: on a row of equal
    values it returned columns 3, 4, 1, 0, 5, 2, 6 for k = 7, this function 704-710). So on an
    exact tie of two candidates' log-probabilities, a CPU and a GPU beam (or two block sizes)
    may keep different hypotheses; tests/test_search.py checks values, not tied columns.

    On a CPU, a max over blocks of ``ROW_TOPK_BLOCK`` columns and a top-k over the k best blocks
    replace topk's selection over all V entries of every row (1.9x faster at V = 8,000,
    2.7x at 37,000; one thread, benchmarks/log/2026-11-25.md): a row's k largest entries lie in the
    blocks whose maxima are the row's k largest block maxima, since every entry elsewhere is at
    most its own block's maximum, which is at most the k-th of them.
    """
    n, vocab = scores.shape
    size = ROW_TOPK_BLOCK
    blocks = vocab // size
    if scores.device.type != "cpu" or blocks <= k:
        return scores.topk(k, dim=1)
    head = scores[:, : blocks * size].unflatten(1, (blocks, size))  # [N, nb, size]
    best = head.amax(dim=2).topk(k, dim=1).indices  # [N, k] the blocks with the largest maxima
    cand = head.gather(1, best[:, :, None].expand(-1, -1, size)).flatten(1)  # [N, k*size]
    if blocks * size < vocab:  # the columns after the last whole block
        cand = torch.cat([cand, scores[:, blocks * size :]], dim=1)  # [N, k*size + tail]
    values, pos = cand.topk(k, dim=1)  # [N, k] positions in cand
    in_blocks = pos < k * size
    block = best.gather(1, (pos // size).clamp(max=k - 1))  # [N, k]
    columns = torch.where(in_blocks, block * size + pos % size, blocks * size + pos - k * size)
    return values, columns
