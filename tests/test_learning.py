"""Learning works end to end on CPU: model + label-smoothed loss + Adam + paper schedule learn to
reverse random token sequences, and greedy and beam search read the answers back."""

from __future__ import annotations

import torch

from transformer_nmt.model import Transformer, apply_overrides, get_preset
from transformer_nmt.search import beam_search, greedy_search
from transformer_nmt.training.objective import label_smoothed_cross_entropy
from transformer_nmt.training.optimizer import build_optimizer, build_scheduler

PAD, BOS, EOS = 0, 2, 3
SYMBOLS = 10  # ids 4 .. 13
IDS = {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD}


def reverse_task(g: torch.Generator, n: int, lo: int = 3, hi: int = 8):
    """Random sequences x of lengths lo..hi; src = x EOS, target = reversed(x) (tgt_in = BOS y,
    tgt_out = y EOS), all padded with PAD. Also returns the references as lists."""
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    width = max(lengths) + 1
    src = torch.full((n, width), PAD)
    tgt_in = torch.full((n, width), PAD)
    tgt_out = torch.full((n, width), PAD)
    refs = []
    for b, length in enumerate(lengths):
        x = torch.randint(4, 4 + SYMBOLS, (length,), generator=g)
        y = x.flip(0)
        src[b, : length + 1] = torch.cat([x, torch.tensor([EOS])])
        tgt_in[b, : length + 1] = torch.cat([torch.tensor([BOS]), y])
        tgt_out[b, : length + 1] = torch.cat([y, torch.tensor([EOS])])
        refs.append(y.tolist())
    return src, tgt_in, tgt_out, refs


def test_small_transformer_learns_to_reverse_sequences(one_torch_thread):
    torch.manual_seed(0)
    cfg = apply_overrides(
        get_preset("tiny"),
        ["N=2", "d_model=64", "d_ff=128", "h=4", "d_k=16", "d_v=16", "p_drop=0.0"],
    )
    model = Transformer(cfg, vocab_size=4 + SYMBOLS, pad_id=PAD)
    optimizer = build_optimizer(model.parameters())
    # The paper's schedule shape with a short warmup; scaled down for this tiny model.
    scheduler = build_scheduler(optimizer, d_model=cfg.d_model, warmup=100, scale=0.15)
    g_train = torch.Generator().manual_seed(1)
    src_test, _, _, refs = reverse_task(torch.Generator().manual_seed(2), 200)

    model.train()
    for _ in range(400):
        src, tgt_in, tgt_out, _ = reverse_task(g_train, 64)
        out = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, eps=cfg.eps_ls, pad_id=PAD)
        optimizer.zero_grad()
        (out.loss / out.ntokens).backward()
        optimizer.step()
        scheduler.step()

    greedy = greedy_search(model, src_test, max_len_b=5, **IDS)
    greedy_acc = sum(h == r for h, r in zip(greedy, refs, strict=True)) / len(refs)
    beam = beam_search(model, src_test, beam_size=4, max_len_b=5, **IDS)
    beam_acc = sum(h[0].tokens == r for h, r in zip(beam, refs, strict=True)) / len(refs)
    assert greedy_acc >= 0.95, f"greedy exact match {greedy_acc:.3f}"
    assert beam_acc >= 0.95, f"beam-4 exact match {beam_acc:.3f}"
    # perplexity of the references is near the label-smoothing floor, far below chance (V = 14)
    model.eval()
    src, tgt_in, tgt_out, _ = reverse_task(torch.Generator().manual_seed(2), 200)
    with torch.no_grad():
        held_out = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, pad_id=PAD)
    assert (held_out.nll / held_out.ntokens).exp().item() < 1.5
