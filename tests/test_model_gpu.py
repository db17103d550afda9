"""The model and search on a CUDA device agree with the CPU (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from transformer_nmt.model import Transformer, apply_overrides, get_preset
from transformer_nmt.search import beam_search, greedy_search

PAD, BOS, EOS = 0, 2, 3
IDS = {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD}


def model_and_batch():
    torch.manual_seed(0)
    cfg = apply_overrides(get_preset("tiny"), ["N=2", "d_model=64", "d_ff=128", "h=4", "d_k=16"])
    model = Transformer(cfg, vocab_size=50, pad_id=PAD).double().eval()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 50, (4, 9), generator=g)
    src[1, 5:], src[3, 2:] = PAD, PAD
    tgt = torch.randint(4, 50, (4, 7), generator=g)
    tgt[:, 0] = BOS
    return model, src, tgt


@pytest.mark.gpu
def test_cuda_forward_and_search_match_cpu():
    model, src, tgt = model_and_batch()
    cpu_logits = model(src, tgt)
    cpu_beam = beam_search(model, src, max_len_b=6, nbest=2, **IDS)
    cpu_greedy = greedy_search(model, src, max_len_b=6, **IDS)
    model.cuda()
    src, tgt = src.cuda(), tgt.cuda()
    torch.testing.assert_close(model(src, tgt).cpu(), cpu_logits, rtol=0, atol=1e-9)
    gpu_beam = beam_search(model, src, max_len_b=6, nbest=2, **IDS)
    assert [[h.tokens for h in hyps] for hyps in gpu_beam] == [
        [h.tokens for h in hyps] for hyps in cpu_beam
    ]
    assert greedy_search(model, src, max_len_b=6, **IDS) == cpu_greedy


@pytest.mark.gpu
def test_cuda_bf16_autocast_cache_matches_full_decoder():
    model, src, tgt = model_and_batch()
    model = model.float().cuda()
    src, tgt = src.cuda(), tgt.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
        enc = model.encode(src)
        full, _ = model.decode(tgt, enc)
        state = model.init_state(enc)
        steps = [model.decode_step(tgt[:, t], state)[0] for t in range(tgt.shape[1])]
    stepped = torch.stack(steps, dim=1).float()
    assert torch.isfinite(stepped).all()
    torch.testing.assert_close(stepped, full.float(), rtol=0.05, atol=0.15)
