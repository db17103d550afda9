"""§3 The encoder-decoder Transformer (an ``nn.Module``; no loss, no training logic).

Reads top to bottom like the paper:
  §3.4 embeddings (one shared matrix, scaled by sqrt(d_model)) + §3.5 positions, dropout (§5.4)
  §3.1 encoder: N x [self-attention, FFN]; decoder: N x [masked self-attention,
       encoder-decoder attention, FFN]; every sublayer residual + LayerNorm
  §3.4 pre-softmax linear projection with the embedding matrix.

Masks: no position attends to padding (source and target key padding masks) and no decoder
position attends to the future (causal mask). For search (§6.1) the decoder also runs
incrementally, one position per step, from a per-layer key/value cache (``init_state`` /
``decode_step``); ``DecoderState.reorder`` selects rows for beam search.

Initialisation (the paper does not specify it): Xavier-uniform weights and zero biases for every
linear layer, as tensor2tensor and fairseq do; token embeddings N(0, d_model^-0.5), so that
after the sqrt(d_model) scale they have unit variance; LayerNorm gain 1, bias 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from transformer_nmt.errors import ConfigError
from transformer_nmt.model.attention import CAUSAL
from transformer_nmt.model.config import ModelConfig
from transformer_nmt.model.dropout import Dropout
from transformer_nmt.model.layers import DecoderLayer, EncoderLayer, LayerCache
from transformer_nmt.model.positional import LearnedPositions, SinusoidalPositions


def key_padding_mask(token_mask: torch.Tensor) -> torch.Tensor | None:
    """``token_mask`` [B, L] (True = real token) -> attention mask [B, 1, 1, L] over keys, or
    None when the batch has no padding (attention then needs no mask: faster kernels).

    A row without any token (an empty sentence) may attend everywhere instead, so that softmax
    never sees an all-masked row (which gives NaN); its output is meaningless but finite.
    Under torch.compile the mask is always built: the check for padding reads a value back
    from the tensor, which would split the compiled graph in two at each call.
    """
    if not torch.compiler.is_compiling() and bool(token_mask.all()):
        return None
    mask = token_mask | ~token_mask.any(dim=-1, keepdim=True)  # [B, L]
    return mask[:, None, None, :]  # [B, 1, 1, L]


@dataclass
class EncoderOutput:
    """``memory`` [B, S, d_model] and ``src_mask`` [B, S] (True = real token, False = padding)."""

    memory: torch.Tensor
    src_mask: torch.Tensor

    def index_select(self, index: torch.Tensor) -> EncoderOutput:
        memory = self.memory.index_select(0, index)
        return EncoderOutput(memory, self.src_mask.index_select(0, index))

    def attn_mask(self) -> torch.Tensor | None:
        """Key padding mask for attention over the source, [B, 1, 1, S] (True = may attend);
        None without padding."""
        return key_padding_mask(self.src_mask)


@dataclass
class DecoderState:
    """Incremental-decoding state: one ``LayerCache`` per decoder layer, the source mask and the
    number of target positions decoded so far (``step``, the position of the next token)."""

    layers: list[LayerCache]
    cross_attn_mask: torch.Tensor | None  # [B_src, 1, 1, S]; None: no source padding
    step: int = 0
    # Target rows per source sentence (beam search: its K hypotheses, rows b*K .. b*K + K-1).
    # The cross-attention keys/values (and the mask) are held once per source, [B_src, ...],
    # and a sentence's K rows attend to them as K queries of one sequence: K single-query
    # attentions over K equal copies become one K-query attention, and neither the copies nor
    # their projection (K times the w_kv GEMM) are made.
    rows_per_source: int = 1
    # ``decode_step`` may write its logits into one buffer reused every step (a search that
    # consumes them before the next step; saves a new [B, V] tensor per step)
    reuse_logits: bool = False
    _logits: torch.Tensor | None = field(default=None, repr=False)

    def reorder(self, index: torch.Tensor, same_source: bool = False) -> None:
        """Keep rows ``index`` (long [B']) of every cached tensor, in that order.

        ``same_source``: each new row comes from a row of the same source sentence (a beam
        reordered within its sentence), so the source-side tensors, equal on those rows, stay.
        Otherwise, with ``rows_per_source`` K > 1, ``index`` keeps whole sentences: K
        consecutive entries b*K .. b*K + K-1 per kept sentence b.
        """
        sources = None
        if not same_source:
            k = self.rows_per_source
            sources = index if k == 1 else index[::k].div(k, rounding_mode="floor")  # [B'/K]
        for layer in self.layers:
            layer.reorder(index, sources)
        if self.cross_attn_mask is not None and sources is not None:
            self.cross_attn_mask = self.cross_attn_mask.index_select(0, sources)

    @property
    def batch_size(self) -> int:
        """Target rows (hypotheses)."""
        return self.layers[0].cross_k.shape[0] * self.rows_per_source


class Transformer(nn.Module):
    """The §3 model. ``forward(src [B,S], tgt_in [B,T]) -> logits [B,T,V]``."""

    def __init__(
        self,
        cfg: ModelConfig,
        vocab_size: int,
        pad_id: int = 0,
        tgt_vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        if vocab_size <= 0:
            raise ConfigError(f"vocab_size must be positive, got {vocab_size}")
        if tgt_vocab_size is None:
            tgt_vocab_size = vocab_size
        if cfg.tie_embeddings and tgt_vocab_size != vocab_size:
            raise ConfigError(
                f"tie_embeddings=true needs one shared vocabulary, got vocab_size={vocab_size} "
                f"and tgt_vocab_size={tgt_vocab_size}; set tie_embeddings=false"
            )
        self.cfg = cfg
        self.pad_id = pad_id
        self.vocab_size = vocab_size
        self.tgt_vocab_size = tgt_vocab_size
        d_model = cfg.d_model

        # §3.4 embeddings. Tied: ``src_embed`` is also the target embedding and the pre-softmax
        # projection. Untied (flag): separate target embedding and output projection.
        self.src_embed = nn.Embedding(vocab_size, d_model)
        self.tgt_embed = None if cfg.tie_embeddings else nn.Embedding(tgt_vocab_size, d_model)
        self.out_proj = (
            None if cfg.tie_embeddings else nn.Linear(d_model, tgt_vocab_size, bias=False)
        )
        self.embed_scale = math.sqrt(d_model)

        # §3.5 positions (separate learned tables for source and target in row E).
        if cfg.positional == "learned":
            self.src_pos: nn.Module = LearnedPositions(d_model, cfg.max_positions)
            self.tgt_pos: nn.Module = LearnedPositions(d_model, cfg.max_positions)
        else:
            shared = SinusoidalPositions(d_model, min(cfg.max_positions, 1024))
            self.src_pos, self.tgt_pos = shared, shared
        self.dropout = Dropout(cfg.p_drop)  # §5.4 on embedding + position sums

        # §3.1 the two stacks of N identical layers.
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.N))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.N))
        # pre-LN (flag) ends each stack with a LayerNorm; post-LN outputs are already normalised.
        self.encoder_norm = nn.LayerNorm(d_model, eps=cfg.ln_eps) if cfg.norm_first else None
        self.decoder_norm = nn.LayerNorm(d_model, eps=cfg.ln_eps) if cfg.norm_first else None

        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialisation documented in the module docstring."""
        d_model = self.cfg.d_model
        for module in self.modules():
            if isinstance(module, nn.Linear):
                # stacked W^Q, W^K, W^V (attention.stacked_linear): each block its own matrix
                sizes = getattr(module, "block_sizes", [module.out_features])
                for block in module.weight.split(sizes, dim=0):
                    nn.init.xavier_uniform_(block)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.normal_(self.src_embed.weight, mean=0.0, std=d_model**-0.5)
        if self.tgt_embed is not None:
            nn.init.normal_(self.tgt_embed.weight, mean=0.0, std=d_model**-0.5)
        if self.out_proj is not None:
            nn.init.normal_(self.out_proj.weight, mean=0.0, std=d_model**-0.5)

    # --- embeddings and output projection (§3.4, §3.5) ------------------------------------------

    def _target_embedding(self) -> nn.Embedding:
        return self.src_embed if self.tgt_embed is None else self.tgt_embed

    def embed_source(self, src: torch.Tensor) -> torch.Tensor:
        x = self.src_embed(src) * self.embed_scale  # [B, S, d_model]
        pe = self.src_pos(src.shape[1], device=x.device, dtype=x.dtype)  # [S, d_model]
        return self.dropout(x + pe)

    def embed_target(self, tgt: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = self._target_embedding()(tgt) * self.embed_scale  # [B, T, d_model]
        pe = self.tgt_pos(tgt.shape[1], offset, device=x.device, dtype=x.dtype)  # [T, d_model]
        return self.dropout(x + pe)

    @property
    def projection_weight(self) -> torch.Tensor:
        """W of the §3.4 pre-softmax linear transformation, logits = x W^T, [V_tgt, d_model]:
        the shared embedding matrix, or ``out_proj``'s (untied, no bias)."""
        return self.src_embed.weight if self.out_proj is None else self.out_proj.weight

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """§3.4 pre-softmax linear transformation: [B, T, d_model] -> logits [B, T, V_tgt]."""
        if self.out_proj is not None:  # its module (int8 decoding swaps it for a quantized one)
            return self.out_proj(x)
        return F.linear(x, self.src_embed.weight)

    # --- encoder -----------------------------------------------------------------------------

    def encode(self, src: torch.Tensor) -> EncoderOutput:
        """``src`` [B, S] long (padded with ``pad_id``) -> ``EncoderOutput``."""
        src_mask = src != self.pad_id  # [B, S]
        attn_mask = key_padding_mask(src_mask)  # [B, 1, 1, S]
        x = self.embed_source(src)
        for layer in self.encoder_layers:
            x = layer(x, attn_mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return EncoderOutput(memory=x, src_mask=src_mask)

    # --- decoder: all positions at once (training, scoring) -----------------------------------

    def decode(
        self,
        tgt_in: torch.Tensor,
        enc: EncoderOutput,
        return_attention: bool = False,
        last_only: bool = False,
        attention_layer: int = -1,
        average_heads: bool = True,
        project_output: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``tgt_in`` [B, T] (BOS y_1 ... , padded) -> (logits [B, T, V_tgt], attention or None).

        The attention is decoder layer ``attention_layer``'s (default the last; negative counts
        from the end) encoder-decoder attention, averaged over heads [B, T, S] or per head
        [B, h, T, S] when not ``average_heads``; returned only when ``return_attention``. Row t
        is the attention while predicting the token after ``tgt_in[:, t]`` (teacher forcing: fed
        BOS + a hypothesis, the rows belong to its tokens and EOS). ``last_only`` projects only
        the last position to the vocabulary (logits [B, 1, V_tgt]; search without the cache).
        ``project_output=False`` returns the decoder output before the §3.4 projection,
        [B, T, d_model] (the chunked loss projects it piecewise with ``project``).
        """
        # Position i attends to keys j <= i (§3.2.3). With right padding those are all real
        # tokens for a real position i; padding positions' outputs are never used.
        self_mask = CAUSAL
        cross_mask = enc.attn_mask()
        x = self.embed_target(tgt_in)
        weights = None
        n_layers = len(self.decoder_layers)
        if not -n_layers <= attention_layer < n_layers:
            raise ConfigError(
                f"attention_layer {attention_layer} out of range for {n_layers} decoder layers"
            )
        chosen = attention_layer % n_layers
        for i, layer in enumerate(self.decoder_layers):
            cross_k, cross_v = layer.cross_attn.project_kv(enc.memory)
            x, layer_weights = layer(
                x,
                cross_k,
                cross_v,
                self_mask,
                cross_mask,
                need_weights=return_attention and i == chosen,
                average_heads=average_heads,
            )
            if i == chosen:
                weights = layer_weights
        if last_only:
            x = x[:, -1:]  # [B, 1, d_model]
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return (self.project(x) if project_output else x), weights

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """``src`` [B, S], ``tgt_in`` [B, T] (both padded with ``pad_id``) -> logits [B, T, V]."""
        return self.decode(tgt_in, self.encode(src))[0]

    # --- decoder: one position per step from a cache (search, §6.1) ---------------------------

    def init_state(self, enc: EncoderOutput, rows_per_source: int = 1) -> DecoderState:
        """Compute every layer's cross-attention keys/values from the encoder output once.
        ``rows_per_source``: target rows decoded per source sentence of ``enc`` (beam search's
        K; ``DecoderState.rows_per_source``): ``decode_step`` then takes
        ``B_src * rows_per_source`` tokens."""
        if rows_per_source < 1:
            raise ValueError(f"rows_per_source must be >= 1, got {rows_per_source}")
        layers = []
        for layer in self.decoder_layers:
            cross_k, cross_v = layer.cross_attn.project_kv(enc.memory)  # [B_src, h, S, d_k|d_v]
            layers.append(LayerCache(cross_k=cross_k, cross_v=cross_v))
        return DecoderState(
            layers=layers, cross_attn_mask=enc.attn_mask(), rows_per_source=rows_per_source
        )

    def decode_step(
        self, tokens: torch.Tensor, state: DecoderState, return_attention: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed the token at position ``state.step`` (``tokens`` [B] long) and advance the state.

        Returns logits for the next position [B, V_tgt] and, when ``return_attention``, the last
        layer's cross-attention averaged over heads [B, S]. Equal to the matching row of
        ``decode`` on the whole prefix (the cache holds every earlier position's keys/values).
        """
        x = self.embed_target(tokens[:, None], offset=state.step)  # [B, 1, d_model]
        weights = None
        last = len(self.decoder_layers) - 1
        for i, (layer, cache) in enumerate(zip(self.decoder_layers, state.layers, strict=True)):
            x, weights = layer(
                x,
                cache.cross_k,
                cache.cross_v,
                None,  # one query that may see every cached (past) position
                state.cross_attn_mask,
                cache=cache,
                need_weights=return_attention and i == last,
                rows_per_source=state.rows_per_source,
            )
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        state.step += 1
        if (
            state.reuse_logits
            and self.out_proj is None
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled(x.device.type)
        ):
            logits = self._project_into(x[:, 0], state)  # [B, d_model] -> [B, V]
        else:
            logits = self.project(x)[:, 0]  # [B, 1, V] -> [B, V]
        return logits, None if weights is None else weights[:, 0]  # [B, S]

    def _project_into(self, x: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """§3.4 tied projection of ``x`` [B, d_model] into ``state``'s logits buffer [B, V]
        (its first B rows: a batch that shrinks reuses it)."""
        weight, rows = self.src_embed.weight, x.shape[0]
        if state._logits is None or state._logits.shape[0] < rows:  # one state: one dtype, device
            state._logits = x.new_empty(rows, weight.shape[0])
        return torch.mm(x, weight.t(), out=state._logits[:rows])


def count_parameters(model: nn.Module, exclude_embeddings: bool = False) -> int:
    """Number of distinct parameters (a tied matrix counts once).

    ``exclude_embeddings`` leaves out token embeddings, the untied output projection and learned
    positions.
    """
    seen: set[int] = set()
    skip: set[int] = set()
    if exclude_embeddings and isinstance(model, Transformer):
        for module in (model.src_embed, model.tgt_embed, model.out_proj):
            if module is not None:
                skip.add(id(module.weight))
        for module in (model.src_pos, model.tgt_pos):
            if isinstance(module, LearnedPositions):
                skip.add(id(module.weight))
    total = 0
    for param in model.parameters():
        if id(param) in seen or id(param) in skip:
            continue
        seen.add(id(param))
        total += param.numel()
    return total


class _Uninitialised(Transformer):
    def reset_parameters(self) -> None:
        """Shapes only: the §3.4 normal init on the meta device costs seconds of imports."""


def shape_model(
    cfg: ModelConfig, vocab_size: int, tgt_vocab_size: int | None = None
) -> Transformer:
    """``cfg``'s Transformer on PyTorch's meta device: every parameter's shape and the §3.4
    tying, no memory and no initialisation (for counting and planning, never for running)."""
    with torch.device("meta"):
        return _Uninitialised(cfg, vocab_size=vocab_size, tgt_vocab_size=tgt_vocab_size)


def count_parameters_of(
    cfg: ModelConfig,
    vocab_size: int,
    tgt_vocab_size: int | None = None,
    exclude_embeddings: bool = False,
) -> int:
    """``count_parameters`` of ``cfg``'s model, built by ``shape_model`` (no memory)."""
    return count_parameters(shape_model(cfg, vocab_size, tgt_vocab_size), exclude_embeddings)
