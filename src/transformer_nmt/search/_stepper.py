"""One decoder step at a time over a batch of hypotheses, with or without the key/value cache.

Shared by greedy and beam search. ``use_cache=True`` feeds only the newest token and reuses each
layer's cached keys/values (``Transformer.decode_step``); ``use_cache=False`` re-runs the whole
decoder on the prefix every step (``Transformer.decode``): same numbers, quadratic cost; kept for
the equivalence test and the benchmark.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from transformer_nmt.model.transformer import EncoderOutput, Transformer


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run search without dropout and without autograd, restoring the model's mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


class Stepper:
    def __init__(
        self,
        model: Transformer,
        enc: EncoderOutput,
        *,
        use_cache: bool,
        return_attention: bool,
        rows_per_source: int = 1,
    ) -> None:
        """``enc``: one row per source sentence, each decoded as ``rows_per_source``
        consecutive rows (beam search's K hypotheses; ``DecoderState.rows_per_source``)."""
        self.model = model
        self.use_cache = use_cache
        self.return_attention = return_attention
        self.state = model.init_state(enc, rows_per_source) if use_cache else None
        if not use_cache and rows_per_source > 1:  # the whole decoder re-runs on every row
            rows = torch.arange(enc.memory.shape[0], device=enc.memory.device)
            enc = enc.index_select(rows.repeat_interleave(rows_per_source))
        self.enc = enc
        if self.state is not None:
            self.state.reuse_logits = True  # consumed (log-softmax, top-k) before the next step
        self.prefix: torch.Tensor | None = None  # [N, t] tokens fed so far (no-cache mode)

    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``tokens`` [N]; return next-token log-probabilities [N, V] (float32 or wider)
        and the last layer's cross-attention [N, S] (None unless ``return_attention``)."""
        if self.state is not None:
            logits, attn = self.model.decode_step(tokens, self.state, self.return_attention)
        else:
            new = tokens[:, None]  # [N, 1]
            self.prefix = new if self.prefix is None else torch.cat([self.prefix, new], dim=1)
            all_logits, all_attn = self.model.decode(
                self.prefix, self.enc, self.return_attention, last_only=True
            )
            logits = all_logits[:, -1]  # [N, 1, V] -> [N, V]
            attn = None if all_attn is None else all_attn[:, -1]  # [N, t, S] -> [N, S]
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        if logits.is_contiguous():
            # in place: the step's [N, V] logits are not needed afterwards, and a new tensor of
            # that size costs page faults on a CPU (1.6x the time of the in-place kernel)
            return torch.log_softmax(logits, dim=-1, out=logits), attn
        return F.log_softmax(logits, dim=-1), attn

    def reorder(self, index: torch.Tensor, same_source: bool = False) -> None:
        """Keep hypotheses ``index`` [N'] (beam reordering and dropping finished sentences);
        ``same_source``: each row moves within its sentence's rows; otherwise whole sentences
        are kept (DecoderState.reorder)."""
        if self.state is not None:
            self.state.reorder(index, same_source)
        else:
            if not same_source:
                self.enc = self.enc.index_select(index)
            if self.prefix is not None:
                self.prefix = self.prefix.index_select(0, index)


def restrict_(
    lprobs: torch.Tensor,
    *,
    step: int,
    max_len: torch.Tensor,
    min_len: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
) -> torch.Tensor:
    """Apply the search's hard constraints in place to ``lprobs`` [N, V] before choosing token
    number ``step + 1`` (``step`` tokens generated so far):

    - PAD and BOS are never generated (they are not output symbols);
    - before ``min_len`` tokens EOS is not allowed (benchmarks force fixed-length outputs);
    - a row whose hypothesis already has ``max_len`` [N] tokens may only emit EOS.
    The log-probabilities keep the model's normalisation (no renormalisation after masking).
    """
    at_max = max_len <= step  # [N]; the maximum length overrides ``min_len``
    eos = lprobs[at_max, eos_id].clone()
    lprobs[:, pad_id] = float("-inf")
    if bos_id != eos_id:
        lprobs[:, bos_id] = float("-inf")
    if step < min_len:
        lprobs[:, eos_id] = float("-inf")
    if bool(at_max.any()):
        lprobs[at_max] = float("-inf")
        lprobs[at_max, eos_id] = eos
    return lprobs
