"""§3.2 Multi-head scaled dot-product attention.

Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                               (§3.2.1, eq. 1)
MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                                (§3.2.2)

The h heads' projections are stored as one matrix each: W^Q, W^K: d_model -> h*d_k,
W^V: d_model -> h*d_v, W^O: h*d_v -> d_model (d_k, d_v independent of d_model/h, Table 3 A/B).
The projections have no bias terms, as in the paper's equations and tensor2tensor; ``bias=True``
(the ``attention_bias`` model flag) adds them to all four. The product itself goes through
``torch.nn.functional.scaled_dot_product_attention`` so that GPUs use fused (flash /
memory-efficient) kernels.

Masks are boolean and broadcastable to ``[B, h, L_q, L_k]`` with True = "may attend" (the SDPA
convention), None (attend everywhere), or ``CAUSAL``: position i attends to j <= i, passed to SDPA
as ``is_causal`` so that it can pick its fused kernels instead of reading a mask tensor.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# The decoder's self-attention mask during training (§3.2.3): with right padding a real query
# only ever reaches real keys j <= i, so no padding mask is needed on top.
CAUSAL = "causal"
AttentionMask = torch.Tensor | str | None  # a boolean mask, CAUSAL, or None


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        d_model: int,
        h: int,
        d_k: int,
        d_v: int,
        p_drop_attn: float = 0.0,
        bias: bool = False,
    ) -> None:
        super().__init__()
        self.h, self.d_k, self.d_v = h, d_k, d_v
        self.p_drop_attn = p_drop_attn
        self.w_q = nn.Linear(d_model, h * d_k, bias=bias)
        self.w_k = nn.Linear(d_model, h * d_k, bias=bias)
        self.w_v = nn.Linear(d_model, h * d_v, bias=bias)
        self.w_o = nn.Linear(h * d_v, d_model, bias=bias)

    def _split(self, x: torch.Tensor, d: int) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.h, d).transpose(1, 2)  # [B, L, h*d] -> [B, h, L, d]

    def project_kv(self, x_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``x_kv`` [B, L_k, d_model]: ([B, h, L_k, d_k], [B, h, L_k, d_v])."""
        return self._split(self.w_k(x_kv), self.d_k), self._split(self.w_v(x_kv), self.d_v)

    def attend(
        self,
        x_q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: AttentionMask = None,
        need_weights: bool = False,
        average_heads: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from queries ``x_q`` [B, L_q, d_model] to projected keys/values.

        Returns the output [B, L_q, d_model] and, when ``need_weights``, the attention weights
        softmax(Q K^T / sqrt(d_k)) (computed explicitly: SDPA does not return them), averaged
        over heads [B, L_q, L_k], or per head [B, h, L_q, L_k] when not ``average_heads``.
        """
        q = self._split(self.w_q(x_q), self.d_k)  # [B, h, L_q, d_k]
        p = self.p_drop_attn if self.training else 0.0
        causal = isinstance(attn_mask, str)  # CAUSAL
        if causal:
            attn_mask = None
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=causal
        )
        b, _, length, _ = out.shape
        out = out.transpose(1, 2).reshape(b, length, self.h * self.d_v)  # [B, L_q, h*d_v]
        weights = None
        if need_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # [B, h, L_q, L_k]
            if causal:
                attn_mask = torch.ones_like(scores[0, 0], dtype=torch.bool).tril()
            if attn_mask is not None:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            weights = scores.softmax(dim=-1)  # [B, h, L_q, L_k]
            if average_heads:
                weights = weights.mean(dim=1)  # [B, L_q, L_k]
        return self.w_o(out), weights

    def forward(
        self,
        x_q: torch.Tensor,
        x_kv: torch.Tensor,
        attn_mask: AttentionMask = None,
        need_weights: bool = False,
        average_heads: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        k, v = self.project_kv(x_kv)
        return self.attend(x_q, k, v, attn_mask, need_weights, average_heads)
