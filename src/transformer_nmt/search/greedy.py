"""Greedy decoding: the most probable next token at every step, for a batch of sentences."""

from __future__ import annotations

import torch

from transformer_nmt.model.transformer import Transformer
from transformer_nmt.search._stepper import Stepper, eval_mode, restrict_
from transformer_nmt.search.settings import SearchSettings


def greedy_search(
    model: Transformer,
    src: torch.Tensor,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_len_b: int = SearchSettings.max_len_b,
    use_cache: bool = True,
    min_len: int = 0,
) -> list[list[int]]:
    """Decode ``src`` [B, S] (padded with ``pad_id``) greedily; outputs in input order.

    Each output has at most ``len(source) + max_len_b`` tokens (source length without padding);
    an output that reaches it ends there. Outputs exclude BOS and EOS. PAD and BOS are never
    generated; ``min_len`` (default 0, benchmarks only) forbids EOS before that many tokens.
    Equal to ``beam_search(beam_size=1)``'s best hypothesis.
    """
    batch = src.shape[0]
    outputs: list[list[int]] = [[] for _ in range(batch)]
    if batch == 0:
        return outputs
    max_len = (src != pad_id).sum(dim=1) + max_len_b  # [B]
    with eval_mode(model):
        stepper = Stepper(model, model.encode(src), use_cache=use_cache, return_attention=False)
        active = torch.arange(batch, device=src.device)  # original index of each live row
        last = torch.full((batch,), bos_id, dtype=torch.long, device=src.device)
        generated: list[torch.Tensor] = []  # per step: [B] chosen tokens (pad once finished)
        step = 0
        while True:
            lprobs, _ = stepper.step(last)  # [n, V]
            restrict_(
                lprobs,
                step=step,
                max_len=max_len[active],
                min_len=min_len,
                bos_id=bos_id,
                eos_id=eos_id,
                pad_id=pad_id,
            )
            choice = lprobs.argmax(dim=-1)  # [n]
            column = torch.full((batch,), pad_id, dtype=torch.long, device=src.device)
            column[active] = choice
            generated.append(column)
            step += 1
            ended = choice == eos_id  # [n]
            if bool(ended.all()):
                break
            if bool(ended.any()):  # drop finished sentences from the batch
                keep = (~ended).nonzero()[:, 0]
                stepper.reorder(keep)
                active, choice = active[keep], choice[keep]
            last = choice
        table = torch.stack(generated, dim=1).tolist()  # [B, steps]
    for b, row in enumerate(table):
        tokens = row[: row.index(eos_id)] if eos_id in row else row
        outputs[b] = [tok for tok in tokens if tok != pad_id]
    return outputs
