"""Token-bounded batch sampler and the LightningDataModule, on synthetic token arrays."""

from __future__ import annotations

import logging
from collections import Counter
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch

from tests.training_helpers import write_token_array
from transformer_nmt.data.batch import flatten, source_batch, training_batch
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.data.sampler import TokenBatchSampler
from transformer_nmt.data.vocab import BOS_ID, EOS_ID, PAD_ID


def _lengths(n=1000, seed=0, hi=60):
    rng = np.random.default_rng(seed)
    return rng.integers(1, hi, size=n), rng.integers(1, hi, size=n)


def _padded_tokens(batch, src_len, tgt_len):
    b = np.asarray(batch)
    return len(b) * max((src_len[b] + 1).max(), (tgt_len[b] + 1).max())


def test_batches_respect_max_tokens_and_cover_each_example_once():
    src, tgt = _lengths()
    sampler = TokenBatchSampler(src, tgt, max_tokens=500, shuffle=True, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler) == sampler.num_batches
    assert all(_padded_tokens(b, src, tgt) <= 500 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    # greedy cut: adding the next length-sorted example would have broken the bound
    order = sampler.order
    for k in range(sampler.num_batches - 1):
        grown = order[sampler.bounds[k] : sampler.bounds[k + 1] + 1]
        assert _padded_tokens(grown, src, tgt) > 500


def test_batches_group_similar_lengths():
    src, tgt = _lengths(n=2000)
    sampler = TokenBatchSampler(src, tgt, max_tokens=1000, shuffle=True, seed=1)
    spread = [np.ptp(src[b]) for b in sampler]
    assert np.mean(spread) <= 2  # sorted by source length: a batch spans a narrow range
    padded = sum(_padded_tokens(b, src, tgt) for b in sampler)
    real = int((np.maximum(src, tgt) + 1).sum())
    assert real / padded > 0.6


def test_shuffle_changes_with_epoch_and_is_reproducible():
    src, tgt = _lengths()
    a = TokenBatchSampler(src, tgt, max_tokens=400, shuffle=True, seed=7)
    b = TokenBatchSampler(src, tgt, max_tokens=400, shuffle=True, seed=7)
    a.set_epoch(0)
    epoch0 = list(a)
    a.set_epoch(1)
    epoch1 = list(a)
    b.set_epoch(1)
    assert epoch1 == list(b)  # same seed and epoch: same order on every rank and rerun
    assert epoch0 != epoch1
    assert sorted(map(tuple, epoch0)) == sorted(map(tuple, epoch1))  # same batches, new order


def test_eval_order_is_deterministic_and_unshuffled():
    src, tgt = _lengths()
    s = TokenBatchSampler(src, tgt, max_tokens=400, shuffle=False)
    first = list(s)
    s.set_epoch(5)
    assert list(s) == first
    flat = [i for b in first for i in b]
    assert [(src[i], tgt[i]) for i in flat] == sorted((src[i], tgt[i]) for i in flat)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_get_disjoint_shares_covering_the_epoch(world_size):
    src, tgt = _lengths(n=997)
    samplers = [
        TokenBatchSampler(
            src, tgt, max_tokens=300, shuffle=True, seed=2, rank=r, world_size=world_size
        )
        for r in range(world_size)
    ]
    for s in samplers:
        s.set_epoch(4)
    shares = [[tuple(b) for b in s] for s in samplers]
    n = samplers[0].num_batches
    assert {len(share) for share in shares} == {-(-n // world_size)}  # equal step counts
    counts = Counter(b for share in shares for b in share)
    all_batches = {tuple(samplers[0].batch(k)) for k in range(n)}
    assert set(counts) == all_batches  # together they cover every batch
    pad = -(-n // world_size) * world_size - n
    assert sum(c - 1 for c in counts.values()) == pad < world_size  # only padding repeats
    for r in range(world_size):
        for q in range(r + 1, world_size):
            assert len(set(shares[r]) & set(shares[q])) <= pad


@pytest.mark.parametrize(("world_size", "accumulation"), [(1, 4), (2, 5)])
def test_epochs_hold_whole_updates_under_gradient_accumulation(world_size, accumulation):
    src, tgt = _lengths(n=997)
    samplers = [
        TokenBatchSampler(src, tgt, max_tokens=300, shuffle=True, seed=2, rank=r,
                          world_size=world_size, multiple_of=accumulation)
        for r in range(world_size)
    ]  # fmt: skip
    n = samplers[0].num_batches
    assert n % (world_size * accumulation) != 0  # else there would be nothing to pad
    shares = [[tuple(b) for b in s] for s in samplers]
    unit = world_size * accumulation
    assert {len(share) for share in shares} == {-(-n // unit) * accumulation}
    assert len(shares[0]) % accumulation == 0 and len(samplers[0]) == len(shares[0])
    counts = Counter(b for share in shares for b in share)
    assert len(counts) == n  # every batch of the epoch is still there
    assert sum(c - 1 for c in counts.values()) == -(-n // unit) * unit - n < unit
    with pytest.raises(ValueError, match="multiple_of"):
        TokenBatchSampler(src, tgt, max_tokens=300, shuffle=True, multiple_of=0)


def test_over_long_examples_are_dropped_with_a_counted_warning(caplog):
    src = np.array([3, 100, 5, 20, 4])
    tgt = np.array([3, 4, 5, 6, 40])
    with caplog.at_level(logging.WARNING):
        s = TokenBatchSampler(src, tgt, max_tokens=64, shuffle=False, max_positions=30)
    assert s.num_dropped == 2
    assert sorted(i for b in s for i in b) == [0, 2, 3]
    assert "dropped 2 of 5 examples longer than 30 tokens" in caplog.text


def pair_batch(src, tgt, indices):
    return training_batch(*flatten(src), *flatten(tgt), indices)


def test_training_batch_adds_bos_eos_and_pads():
    src = [np.array([10, 11]), np.array([12])]
    batch = pair_batch(src, [np.array([20]), np.array([21, 22, 23])], [4, 9])
    assert batch["src"].tolist() == [[10, 11, EOS_ID], [12, EOS_ID, PAD_ID]]
    assert batch["tgt_in"].tolist() == [[BOS_ID, 20, PAD_ID, PAD_ID], [BOS_ID, 21, 22, 23]]
    assert batch["tgt_out"].tolist() == [[20, EOS_ID, PAD_ID, PAD_ID], [21, 22, 23, EOS_ID]]
    assert batch["index"].tolist() == [4, 9]
    assert all(a.dtype == np.int64 for a in batch.values())
    # translation builds the encoder input exactly as training does
    assert source_batch(src).dtype == torch.long
    assert source_batch(src).tolist() == batch["src"].tolist()


@pytest.fixture
def bin_dir(tmp_path):
    rng = np.random.default_rng(5)
    for split, n in (("train", 300), ("valid", 40)):
        src = [rng.integers(4, 100, size=rng.integers(1, 20)) for _ in range(n)]
        tgt = [rng.integers(4, 100, size=rng.integers(1, 20)) for _ in range(n)]
        write_token_array(tmp_path / f"{split}.en", src, vocab_size=100)
        write_token_array(tmp_path / f"{split}.de", tgt, vocab_size=100)
    return tmp_path


def _epoch(loader):
    return [b["index"].tolist() for b in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_datamodule_batches_match_arrays(bin_dir, num_workers):
    dm = TranslationDataModule(bin_dir, "en", "de", max_tokens=128, num_workers=num_workers)
    dm.setup("fit")
    loader = dm.train_dataloader()
    ds = dm.dataset("train")
    seen = []
    for batch in loader:
        assert batch["src"].numel() <= 128 and batch["tgt_in"].numel() <= 128
        for row, i in enumerate(batch["index"].tolist()):
            src = batch["src"][row]
            assert src[src != PAD_ID].tolist() == ds.src[i].tolist() + [EOS_ID]
            out = batch["tgt_out"][row]
            assert out[out != PAD_ID].tolist() == ds.tgt[i].tolist() + [EOS_ID]
        seen += batch["index"].tolist()
    assert sorted(seen) == list(range(300))
    assert len(_epoch(dm.val_dataloader())) == len(dm.samplers["valid"])


def test_lightning_advances_the_epoch_shuffle(bin_dir):
    """A real Trainer calls set_epoch on our sampler: epochs see different batch orders."""

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.orders: dict[int, list[list[int]]] = {}

        def training_step(self, batch, _):
            self.orders.setdefault(self.current_epoch, []).append(batch["index"].tolist())
            return (self.w * batch["src"].float().mean()).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    dm = TranslationDataModule(bin_dir, "en", "de", max_tokens=256, seed=11)
    module = Recorder()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=dm)
    e0, e1 = module.orders[0], module.orders[1]
    assert sorted(i for b in e0 for i in b) == list(range(300))
    assert sorted(i for b in e1 for i in b) == list(range(300))
    assert e0 != e1 and sorted(e0) == sorted(e1)
    assert dm.samplers["train"].epoch == 1


def test_datamodule_takes_rank_share_from_its_trainer(bin_dir):
    shares = []
    for rank in (0, 1):
        dm = TranslationDataModule(bin_dir, "en", "de", max_tokens=128, seed=4)
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2)
        shares.append(_epoch(dm.train_dataloader()))
    whole = TranslationDataModule(bin_dir, "en", "de", max_tokens=128, seed=4)
    assert whole.rank_and_world_size() == (0, 1)
    n = len(whole.batch_sampler("train", shuffle=True))
    assert len(shares[0]) == len(shares[1]) == -(-n // 2)
    flat = [i for share in shares for b in share for i in b]
    padding = len(shares[0]) * 2 - n  # 0 or 1 repeated batch
    assert set(flat) == set(range(300))
    assert len(flat) - 300 == sum(len(b) for b in shares[1][-1:]) * padding


def test_training_batch_handles_empty_sentences():
    batch = pair_batch([np.array([], dtype=np.uint16)], [np.array([7])], [0])
    assert batch["src"].tolist() == [[EOS_ID]]
    assert batch["tgt_in"].tolist() == [[BOS_ID, 7]]


def test_cut_is_the_same_whatever_the_chunking():
    from transformer_nmt.data.sampler import _cut_batches

    widths = np.sort(np.random.default_rng(3).integers(2, 90, size=1000)).astype(np.int32)
    assert np.array_equal(_cut_batches(widths, 700, chunk=7), _cut_batches(widths, 700))


# --- few shapes: widths rounded up to pad_multiple -------------------------------------------


def test_padded_width_rounds_up_but_not_past_the_cap():
    from transformer_nmt.data.batch import padded_width

    assert [padded_width(w, 8) for w in (1, 8, 9, 16, 17)] == [8, 8, 16, 16, 24]
    assert padded_width(97, 8, cap=100) == 100  # 104 would pass the longest row the model takes
    assert padded_width(101, 8, cap=100) == 104  # (too long anyway: the sampler drops it)
    np.testing.assert_array_equal(padded_width(np.array([3, 12, 99]), 8, 100), [8, 16, 100])
    assert padded_width(13, 1) == 13


def test_padded_batches_hold_the_same_ids_and_only_pad_beyond():
    src = [np.array([5, 6, 7]), np.array([8])]
    tgt = [np.array([9, 10]), np.array([11, 12, 13, 14, 15, 16, 17, 18, 19])]
    plain = training_batch(*flatten(src), *flatten(tgt), [0, 1])
    padded = training_batch(*flatten(src), *flatten(tgt), [0, 1], multiple=8)
    assert padded["src"].shape == (2, 8) and padded["tgt_in"].shape == (2, 16)
    for key in ("src", "tgt_in", "tgt_out"):
        width = plain[key].shape[1]
        np.testing.assert_array_equal(padded[key][:, :width], plain[key])
        assert (padded[key][:, width:] == PAD_ID).all()


def test_padded_batches_keep_max_tokens_and_have_few_distinct_widths():
    src_len, tgt_len = _lengths(n=2000, hi=90)
    limit = 100
    sampler = TokenBatchSampler(
        src_len, tgt_len, max_tokens=700, max_positions=limit, shuffle=True, pad_multiple=8
    )
    plain = TokenBatchSampler(src_len, tgt_len, max_tokens=700, max_positions=limit, shuffle=True)
    seen = sorted(i for batch in sampler for i in batch)
    assert seen == list(range(2000))  # every example once, none dropped (all fit the limit)
    widths = set()
    for batch in sampler:
        b = np.asarray(batch)
        width = max((src_len[b] + 1).max(), (tgt_len[b] + 1).max())
        rounded = min(-(-width // 8) * 8, limit)
        assert len(b) * rounded <= 700  # the bound holds for what the model computes
        widths.add(rounded)
    assert len(widths) <= -(-limit // 8)  # one width per multiple of 8 (and the cap)
    plain_widths = {_padded_tokens(batch, src_len, tgt_len) // len(batch) for batch in plain}
    assert len(widths) < len(plain_widths) / 4


def test_padding_changes_neither_the_loss_nor_the_gradients():
    """Padding is masked (attention keys, the loss): a batch padded to multiples of 8 gives the
    unpadded batch's summed loss and gradients (float64)."""
    from transformer_nmt.model.config import apply_overrides, get_preset
    from transformer_nmt.model.transformer import Transformer
    from transformer_nmt.training.objective import label_smoothed_cross_entropy

    cfg = apply_overrides(get_preset("tiny"), {"N": 2, "d_model": 16, "d_ff": 32, "h": 2,
                                               "d_k": 8, "d_v": 8, "p_drop": 0.0})  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg, vocab_size=40).double()
    rng = np.random.default_rng(0)
    src = [rng.integers(4, 40, size=n) for n in (3, 11, 6)]
    tgt = [rng.integers(4, 40, size=n) for n in (5, 2, 13)]

    def loss_and_grads(multiple: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        batch = training_batch(*flatten(src), *flatten(tgt), [0, 1, 2], multiple=multiple)
        batch = {k: torch.from_numpy(v) for k, v in batch.items()}
        model.zero_grad()
        logits = model(batch["src"], batch["tgt_in"])
        loss = label_smoothed_cross_entropy(logits, batch["tgt_out"], eps=0.1).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss, grads = loss_and_grads(1)
    padded_loss, padded_grads = loss_and_grads(8)
    torch.testing.assert_close(padded_loss, loss, rtol=1e-12, atol=1e-12)
    for name, grad in grads.items():
        torch.testing.assert_close(padded_grads[name], grad, rtol=1e-10, atol=1e-12)


def test_the_datamodule_pads_as_its_sampler_counts(bin_dir):
    dm = TranslationDataModule(bin_dir, "en", "de", max_tokens=64, pad_multiple=8)
    for batch in dm.dataloader("train", shuffle=True):
        for key in ("src", "tgt_in", "tgt_out"):
            assert batch[key].shape[1] % 8 == 0 and batch[key].numel() <= 64
