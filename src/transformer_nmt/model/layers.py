"""§3.1 Encoder and decoder layers, §3.3 the position-wise feed-forward network."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from transformer_nmt.model.attention import AttentionMask, MultiHeadAttention
from transformer_nmt.model.config import ModelConfig
from transformer_nmt.model.dropout import Dropout


def _attention(cfg: ModelConfig, *, self_attention: bool) -> MultiHeadAttention:
    return MultiHeadAttention(
        cfg.d_model,
        cfg.h,
        cfg.d_k,
        cfg.d_v,
        cfg.p_drop_attn,
        bias=cfg.attention_bias,
        self_attention=self_attention,
    )


class FeedForward(nn.Module):
    """§3.3 FFN(x) = max(0, x W1 + b1) W2 + b2, inner width d_ff."""

    def __init__(self, d_model: int, d_ff: int, p_drop_relu: float = 0.0) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(p_drop_relu)  # flag; the paper has no dropout here

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(torch.relu(self.w_1(x))))


class Residual(nn.Module):
    """§3.1/§5.4 residual connection around a sublayer.

    post-LN (paper): LayerNorm(x + Dropout(Sublayer(x)))
    pre-LN (flag):   x + Dropout(Sublayer(LayerNorm(x)))
    """

    def __init__(self, d_model: int, p_drop: float, norm_first: bool, ln_eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=ln_eps)
        self.dropout = Dropout(p_drop)
        self.norm_first = norm_first

    def forward(
        self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """§3.1: self-attention, then FFN, each wrapped in a residual connection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = _attention(cfg, self_attention=True)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.p_drop_relu)
        self.res_attn = Residual(cfg.d_model, cfg.p_drop, cfg.norm_first, cfg.ln_eps)
        self.res_ffn = Residual(cfg.d_model, cfg.p_drop, cfg.norm_first, cfg.ln_eps)

    def forward(self, x: torch.Tensor, src_attn_mask: AttentionMask) -> torch.Tensor:
        x = self.res_attn(x, lambda y: self.self_attn(y, y, src_attn_mask)[0])
        return self.res_ffn(x, self.ffn)


class LayerCache:
    """One decoder layer's incremental-decoding state (§6.1 search).

    ``cross_k``/``cross_v``: encoder keys/values for cross-attention, computed once
    [B, h, S, d_k] / [B, h, S, d_v]. ``self_k``/``self_v``: keys/values of every target position
    decoded so far [B, h, t, d_k] / [B, h, t, d_v]: views of preallocated time-major buffers
    [capacity, B, h, d] whose capacity doubles when full, so that a step writes its position in
    place instead of copying the whole history (``torch.cat``) every step. Time-major because
    beam search reorders the rows every step: the first t positions of a time-major buffer are
    one contiguous block, so the reorder gathers exactly t positions into a second buffer of the
    same size (no allocation, no copy of the unused capacity: 0.7 against 4.3 ms for gathering
    the batch-major buffer into a new tensor at a decoding shape on a CPU,
    benchmarks/log/2026-11-25.md).
    """

    MIN_CAPACITY = 16  # positions; doubled as needed

    def __init__(self, cross_k: torch.Tensor, cross_v: torch.Tensor) -> None:
        self.cross_k, self.cross_v = cross_k, cross_v
        self.length = 0  # target positions cached
        self._k: torch.Tensor | None = None  # [capacity, B, h, d_k]
        self._v: torch.Tensor | None = None  # [capacity, B, h, d_v]
        self._spare: tuple[torch.Tensor, torch.Tensor] | None = None  # the reorder's targets

    @property
    def capacity(self) -> int:
        return 0 if self._k is None else self._k.shape[0]

    @property
    def self_k(self) -> torch.Tensor | None:
        # [t, B, h, d_k] -> [B, h, t, d_k] (a view: SDPA reads the strides)
        return None if self._k is None else self._k[: self.length].permute(1, 2, 0, 3)

    @property
    def self_v(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[: self.length].permute(1, 2, 0, 3)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cache new positions' ``k`` [B, h, T, d_k], ``v`` [B, h, T, d_v]; returns the keys and
        values of every position so far, [B, h, t + T, d_k|d_v]."""
        start, end = self.length, self.length + k.shape[2]
        if self._k is None or end > self._k.shape[0]:
            capacity = max(self.MIN_CAPACITY, 2 * end)
            self._k = self._grow(self._k, k, capacity)
            self._v = self._grow(self._v, v, capacity)
            self._spare = None
        self._k[start:end] = k.permute(2, 0, 1, 3)  # [B, h, T, d] -> [T, B, h, d]
        self._v[start:end] = v.permute(2, 0, 1, 3)
        self.length = end
        return self.self_k, self.self_v

    def _grow(self, old: torch.Tensor | None, new: torch.Tensor, capacity: int) -> torch.Tensor:
        b, h, _, d = new.shape
        buffer = new.new_empty(capacity, b, h, d)
        if old is not None:
            buffer[: self.length] = old[: self.length]
        return buffer

    def reorder(self, index: torch.Tensor, sources: torch.Tensor | None = None) -> None:
        """Select target rows ``index`` along the batch dimension (beam reordering, batch
        shrinking) and, when ``sources`` is given, the source rows of the cross-attention keys
        and values; None: every row moved within its own sentence's rows, whose cross-attention
        keys/values stay as they are (DecoderState.reorder)."""
        if sources is not None:
            self.cross_k = self.cross_k.index_select(0, sources)
            self.cross_v = self.cross_v.index_select(0, sources)
        if self._k is None or self._v is None:
            return
        if torch.is_grad_enabled() and (self._k.requires_grad or self._v.requires_grad):
            # differentiable decoding (tests, attributions): autograd cannot write into ``out=``
            self._k, self._v = self._k.index_select(1, index), self._v.index_select(1, index)
            self._spare = None
            return
        rows = index.shape[0]
        if self._spare is None or self._spare[0].shape[1] != rows:
            # the batch changed size (first reorder, or finished sentences left): new buffers
            self._spare = (
                self._k.new_empty(self.capacity, rows, *self._k.shape[2:]),
                self._v.new_empty(self.capacity, rows, *self._v.shape[2:]),
            )
        spare_k, spare_v = self._spare
        t = self.length
        torch.index_select(self._k[:t], 1, index, out=spare_k[:t])  # [t, B', h, d_k]
        torch.index_select(self._v[:t], 1, index, out=spare_v[:t])
        if spare_k.shape[1] == self._k.shape[1]:
            self._spare = (self._k, self._v)  # the old buffers are the next reorder's targets
        else:
            self._spare = None
        self._k, self._v = spare_k, spare_v


class DecoderLayer(nn.Module):
    """§3.1: masked self-attention, encoder-decoder attention, FFN; each with a residual."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = _attention(cfg, self_attention=True)
        self.cross_attn = _attention(cfg, self_attention=False)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.p_drop_relu)
        self.res_self = Residual(cfg.d_model, cfg.p_drop, cfg.norm_first, cfg.ln_eps)
        self.res_cross = Residual(cfg.d_model, cfg.p_drop, cfg.norm_first, cfg.ln_eps)
        self.res_ffn = Residual(cfg.d_model, cfg.p_drop, cfg.norm_first, cfg.ln_eps)

    def forward(
        self,
        x: torch.Tensor,
        cross_k: torch.Tensor,
        cross_v: torch.Tensor,
        self_attn_mask: AttentionMask,
        cross_attn_mask: AttentionMask,
        cache: LayerCache | None = None,
        need_weights: bool = False,
        average_heads: bool = True,
        rows_per_source: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x`` [B, T, d_model] -> ([B, T, d_model], cross-attention weights or None): averaged
        over heads [B, T, S], or per head [B, h, T, S] when not ``average_heads``.

        With ``cache`` the new positions' keys/values are appended to the layer's cache and the
        queries attend to every cached position (no mask needed: the past is all there is).
        ``rows_per_source`` K > 1 (incremental decoding, T = 1): ``cross_k``/``cross_v`` hold
        one row per source sentence, [B/K, h, S, d], for K consecutive rows of ``x``
        (``DecoderState.rows_per_source``).
        """

        def self_attention(y: torch.Tensor) -> torch.Tensor:
            q, k, v = self.self_attn.project_qkv(y)  # [B, h, T, d_k|d_k|d_v], one GEMM
            if cache is not None:
                k, v = cache.append(k, v)  # [B, h, t + T, d_k|d_v]
            return self.self_attn.attend(y, k, v, self_attn_mask, q=q)[0]

        weights: list[torch.Tensor | None] = [None]

        def cross_attention(y: torch.Tensor) -> torch.Tensor:
            if rows_per_source == 1:
                out, weights[0] = self.cross_attn.attend(
                    y, cross_k, cross_v, cross_attn_mask, need_weights, average_heads
                )
                return out
            # a sentence's K rows as K queries of one sequence: [B, 1, d] -> [B/K, K, d]
            rows = y.shape[0]
            grouped = y.view(rows // rows_per_source, rows_per_source, -1)
            out, w = self.cross_attn.attend(
                grouped, cross_k, cross_v, cross_attn_mask, need_weights, average_heads
            )
            if w is not None:  # [B/K, K, S] -> [B, 1, S]; per head [B/K, h, K, S] -> [B, h, 1, S]
                w = w.view(rows, 1, -1) if average_heads else w.transpose(1, 2).flatten(0, 1)
                weights[0] = w if average_heads else w[:, :, None]
            return out.view(rows, 1, -1)  # [B/K, K, d] -> [B, 1, d]

        x = self.res_self(x, self_attention)
        x = self.res_cross(x, cross_attention)
        x = self.res_ffn(x, self.ffn)
        return x, weights[0]
