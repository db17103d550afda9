"""§3.2 Multi-head scaled dot-product attention.

Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                               (§3.2.1, eq. 1)
MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                                (§3.2.2)

The h heads' projections are stored as one matrix each: W^Q, W^K: d_model -> h*d_k,
W^V: d_model -> h*d_v, W^O: h*d_v -> d_model (d_k, d_v independent of d_model/h, Table 3 A/B).
Matrices that read the same input are stacked into one linear layer so that one GEMM computes
them (speed only; the same numbers): self-attention's [W^Q; W^K; W^V] (``w_qkv``, d_model ->
2*h*d_k + h*d_v) and cross-attention's [W^K; W^V] (``w_kv``) beside its ``w_q``. Each block is
initialised as its own matrix (``stacked_linear``).
The projections have no bias terms, as in the paper's equations and tensor2tensor; ``bias=True``
(the ``attention_bias`` model flag) adds them to all four. The product itself goes through
``torch.nn.functional.scaled_dot_product_attention`` so that GPUs use fused (flash /
memory-efficient) kernels; on a CPU in 16 bits it is computed as written (``_explicit_product``).

Masks are boolean and broadcastable to ``[B, h, L_q, L_k]`` with True = "may attend" (the SDPA
convention), None (attend everywhere), or ``CAUSAL``: position i attends to j <= i, passed to SDPA
as ``is_causal`` so that it can pick its fused kernels instead of reading a mask tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer_nmt import fast_paths

# The decoder's self-attention mask during training (§3.2.3): with right padding a real query
# only ever reaches real keys j <= i, so no padding mask is needed on top.
CAUSAL = "causal"
AttentionMask = torch.Tensor | str | None  # a boolean mask, CAUSAL, or None


def _explicit_product(q: torch.Tensor) -> bool:
    """Whether eq. 1 runs as written (``attention_probs``, then a product with V) instead of
    through SDPA: on a CPU in bf16/fp16. There SDPA's fused (flash) kernel took 2.3-8x the time
    of its plain math kernel for a forward and backward at the lengths of sentences, and the
    explicit product with its softmax in float32 took half the math kernel's (tiny's shape
    [146, 4, 28, 64] with a padding mask: flash -, math 9.8, explicit 4.8 ms; causal: 26.3,
    10.7, 5.3 ms; 2-core Xeon with AMX, benchmarks/log/2026-11-25.md). In fp32, and on GPUs,
    SDPA's own kernel choice is the faster one. The same numbers either way, up to rounding. A CPU
    fast path (``fast_paths``: ``explicit_attention``)."""
    return (
        q.device.type == "cpu"
        and q.dtype in (torch.bfloat16, torch.float16)
        and fast_paths.enabled("explicit_attention")
    )


def attention_probs(q: torch.Tensor, k: torch.Tensor, attn_mask: AttentionMask) -> torch.Tensor:
    """Eq. 1's weights softmax(Q K^T / sqrt(d_k)) of ``q`` [B, h, L_q, d_k] over ``k``
    [B, h, L_k, d_k] under ``attn_mask``: [B, h, L_q, L_k] in q's dtype (the softmax itself in
    float32 at least)."""
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5  # [B, h, L_q, L_k]
    if isinstance(attn_mask, str):  # CAUSAL: position i sees j <= i
        attn_mask = torch.ones_like(scores[0, 0], dtype=torch.bool).tril()
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    softmax_dtype = torch.promote_types(scores.dtype, torch.float32)
    return scores.softmax(dim=-1, dtype=softmax_dtype).to(scores.dtype)


def stacked_linear(d_in: int, sizes: tuple[int, ...], bias: bool) -> nn.Linear:
    """A plain ``nn.Linear`` whose output rows stack matrices of ``sizes`` rows each. Its
    ``block_sizes`` attribute tells ``Transformer.reset_parameters`` to initialise each block as
    its own matrix (Xavier's fan-out is that matrix's). A plain Linear so that tools that swap
    linear layers (int8 dynamic quantisation) treat it as one."""
    linear = nn.Linear(d_in, sum(sizes), bias=bias)
    linear.block_sizes = sizes
    return linear


class MultiHeadAttention(nn.Module):
    """``self_attention=True``: queries, keys and values all come from one input (encoder and
    decoder self-attention; W^Q, W^K, W^V stacked in ``w_qkv``); False: encoder-decoder
    attention (W^K, W^V stacked in ``w_kv``, applied once to the encoder output)."""

    def __init__(
        self,
        d_model: int,
        h: int,
        d_k: int,
        d_v: int,
        p_drop_attn: float = 0.0,
        bias: bool = False,
        self_attention: bool = True,
    ) -> None:
        super().__init__()
        self.h, self.d_k, self.d_v = h, d_k, d_v
        self.p_drop_attn = p_drop_attn
        self.self_attention = self_attention
        # rows of the stacked projections: [W^Q; W^K; W^V] or [W^K; W^V]
        self.qkv_sizes = (h * d_k, h * d_k, h * d_v)
        self.kv_sizes = (h * d_k, h * d_v)
        if self_attention:
            self.w_qkv = stacked_linear(d_model, self.qkv_sizes, bias=bias)
        else:
            self.w_q = nn.Linear(d_model, h * d_k, bias=bias)
            self.w_kv = stacked_linear(d_model, self.kv_sizes, bias=bias)
        self.w_o = nn.Linear(h * d_v, d_model, bias=bias)

    def _split(self, x: torch.Tensor, d: int) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.h, d).transpose(1, 2)  # [B, L, h*d] -> [B, h, L, d]

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention: queries, keys and values of ``x`` [B, L, d_model] with one GEMM:
        ([B, h, L, d_k], [B, h, L, d_k], [B, h, L, d_v])."""
        q, k, v = self.w_qkv(x).split(self.qkv_sizes, dim=-1)  # [B, L, h*d_k|h*d_k|h*d_v]
        return self._split(q, self.d_k), self._split(k, self.d_k), self._split(v, self.d_v)

    def project_q(self, x_q: torch.Tensor) -> torch.Tensor:
        """Queries of ``x_q`` [B, L_q, d_model]: [B, h, L_q, d_k]."""
        if self.self_attention:
            return self.project_qkv(x_q)[0]  # (a self-attention's queries come with its K, V)
        return self._split(self.w_q(x_q), self.d_k)

    def project_kv(self, x_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``x_kv`` [B, L_k, d_model]: ([B, h, L_k, d_k], [B, h, L_k, d_v])."""
        if self.self_attention:
            return self.project_qkv(x_kv)[1:]
        k, v = self.w_kv(x_kv).split(self.kv_sizes, dim=-1)  # [B, L_k, h*d_k|h*d_v]
        return self._split(k, self.d_k), self._split(v, self.d_v)

    def attend(
        self,
        x_q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: AttentionMask = None,
        need_weights: bool = False,
        average_heads: bool = True,
        *,
        q: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from queries ``x_q`` [B, L_q, d_model] to projected keys/values.

        ``q`` [B, h, L_q, d_k]: the queries when already projected (``project_qkv``).
        Returns the output [B, L_q, d_model] and, when ``need_weights``, the attention weights
        softmax(Q K^T / sqrt(d_k)) (computed explicitly: SDPA does not return them), averaged
        over heads [B, L_q, L_k], or per head [B, h, L_q, L_k] when not ``average_heads``.
        """
        if q is None:
            q = self.project_q(x_q)  # [B, h, L_q, d_k]
        p = self.p_drop_attn if self.training else 0.0
        if _explicit_product(q):
            probs = attention_probs(q, k, attn_mask)  # [B, h, L_q, L_k]
            out = F.dropout(probs, p, self.training) @ v  # [B, h, L_q, d_v]
        else:
            causal = isinstance(attn_mask, str)  # CAUSAL: SDPA's fused causal kernels
            probs = None
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None if causal else attn_mask, dropout_p=p, is_causal=causal
            )
        b, _, length, _ = out.shape
        out = out.transpose(1, 2).reshape(b, length, self.h * self.d_v)  # [B, L_q, h*d_v]
        weights = None
        if need_weights:  # SDPA does not return them
            weights = probs if probs is not None else attention_probs(q, k, attn_mask)
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
        if self.self_attention and x_kv is x_q:
            q, k, v = self.project_qkv(x_q)  # one GEMM
            return self.attend(x_q, k, v, attn_mask, need_weights, average_heads, q=q)
        k, v = self.project_kv(x_kv)
        return self.attend(x_q, k, v, attn_mask, need_weights, average_heads)
