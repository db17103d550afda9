"""The model flag ``softmax_vocab: target`` (§3.4): the softmax over the pieces of the training
data's target side only, rows of the shared projection matrix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_nmt.cli import main
from transformer_nmt.data.token_array import TokenArray, write_token_array
from transformer_nmt.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, VocabInfo
from transformer_nmt.data.vocab import target_side_pieces as pieces_of
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.model.config import ModelConfig
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.runs.checkpoints import (
    average_checkpoints,
    list_checkpoints,
    load_checkpoint,
    load_model_file,
)
from transformer_nmt.search import beam_search, greedy_search
from transformer_nmt.training.objective import label_smoothed_cross_entropy, model_loss

V = 40
TINY = ModelConfig(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, p_drop=0.0)
TARGET = ModelConfig(**{**TINY.to_dict(), "softmax_vocab": "target"})


def _info(size: int = V) -> VocabInfo:
    return VocabInfo(size=size, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                     sha256="0" * 64)  # fmt: skip


def _restricted(keep_ids: list[int], *, tie: bool = True, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(**{**TARGET.to_dict(), "tie_embeddings": tie})
    model = Transformer(cfg, vocab_size=V).double()
    keep = torch.zeros(V, dtype=torch.bool)
    keep[[PAD_ID, UNK_ID, BOS_ID, EOS_ID, *keep_ids]] = True
    model.restrict_output(keep)
    return model


KEPT = [5, 7, 9, 11, 13, 20, 25, 31]


def _batch() -> dict[str, torch.Tensor]:
    # target piece 8 lies outside KEPT (a dev sentence's piece the training targets never had)
    tgt = [[5, 7, 9], [11, 13, 20, 25, 31], [5, 8, 5]]
    rows = max(map(len, tgt)) + 1
    tgt_in = torch.zeros(len(tgt), rows, dtype=torch.long)
    tgt_out = torch.zeros(len(tgt), rows, dtype=torch.long)
    for i, y in enumerate(tgt):
        tgt_in[i, : len(y) + 1] = torch.tensor([BOS_ID, *y])
        tgt_out[i, : len(y) + 1] = torch.tensor([*y, EOS_ID])
    src = torch.randint(4, V, (len(tgt), 6), generator=torch.Generator().manual_seed(3))
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}


def test_target_side_pieces_are_the_targets_and_the_special_pieces(tmp_path: Path) -> None:
    write_token_array(tmp_path / "train.de", [[5, 6, 6], [], [30, 5]], V)
    keep = pieces_of(TokenArray(tmp_path / "train.de"), _info())
    assert keep.dtype == np.bool_ and keep.shape == (V,)
    assert sorted(np.flatnonzero(keep).tolist()) == [PAD_ID, UNK_ID, BOS_ID, EOS_ID, 5, 6, 30]
    # a token array of another vocabulary: named, with what to do
    with pytest.raises(DataError, match=r"train\.de.*token id 30 outside the vocabulary of 20"):
        pieces_of(TokenArray(tmp_path / "train.de"), _info(20))


def test_the_softmax_over_the_target_side_is_the_shared_one_renormalised() -> None:
    """Decoding's logits are the shared projection's with -inf outside the subset: their
    log-softmax equals training's over the subset alone, for the whole sequence and step by
    step (both decode_step projections), tied and untied."""
    batch = _batch()
    for tie in (True, False):
        model = _restricted(KEPT, tie=tie).eval()
        keep = model.output_mask
        full, _ = model.decode(batch["tgt_in"], model.encode(batch["src"]))  # [B, T, V]
        assert bool(torch.isinf(full[..., ~keep]).all()) and bool(full[..., keep].isfinite().all())
        ours = model(batch["src"], batch["tgt_in"])  # training's logits [B, T, V_out]
        assert ours.shape[-1] == int(keep.sum()) == len(KEPT) + 4
        torch.testing.assert_close(full.log_softmax(-1)[..., keep], ours.log_softmax(-1))
        with torch.no_grad():
            for reuse in (False, True):
                enc = model.encode(batch["src"])
                state = model.init_state(enc)
                state.reuse_logits = reuse
                for t in range(batch["tgt_in"].shape[1]):
                    step, _ = model.decode_step(batch["tgt_in"][:, t], state)
                    torch.testing.assert_close(step, full[:, t])


def test_the_loss_runs_over_the_subset_and_a_piece_outside_counts_as_unk(monkeypatch) -> None:
    """``model_loss`` (projected fast path and logits path): §5.4's label-smoothed loss over
    the subset's pieces, against the targets' positions among them (8, outside, as unk's), with
    the gradients of that loss; the rows outside get no gradient from the projection."""
    from transformer_nmt.fast_paths import ENV

    batch = _batch()
    model = _restricted(KEPT)
    ids = [PAD_ID, UNK_ID, BOS_ID, EOS_ID, *KEPT]
    position = {piece: i for i, piece in enumerate(ids)}
    expected_targets = [
        [position[p] if p in position else position[UNK_ID] for p in row]
        for row in batch["tgt_out"].tolist()
    ]
    assert model.output_targets(batch["tgt_out"]).tolist() == expected_targets
    hidden, _ = model.decode(batch["tgt_in"], model.encode(batch["src"]), project_output=False)
    logits = hidden @ model.src_embed.weight[ids].T  # [B, T, V_out] by hand
    # §5.4's smoothing mass per piece as the shared softmax's: 0.1 / V on each of the subset's
    eps = 0.1 * len(ids) / V
    ref = label_smoothed_cross_entropy(logits, torch.tensor(expected_targets), eps=eps, pad_id=0)
    ref_grads = torch.autograd.grad(ref.loss, list(model.parameters()))
    for fast in ("on", "off"):
        monkeypatch.setenv(ENV, fast)
        out = model_loss(model, batch, eps=0.1, pad_id=PAD_ID)
        grads = torch.autograd.grad(out.loss, list(model.parameters()))
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-12, atol=0)
        assert int(out.ntokens) == int((batch["tgt_out"] != PAD_ID).sum())
        for ours, expected in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)
    # the embedding's rows outside the subset and never fed in: no gradient at all
    used = set(ids) | set(batch["src"].flatten().tolist()) | set(batch["tgt_in"].flatten().tolist())
    unused = [i for i in range(V) if i not in used]
    assert unused and float(grads[0][unused].abs().sum()) == 0.0


def test_restrict_output_is_checked() -> None:
    shared = Transformer(TINY, vocab_size=V)
    assert shared.output_mask is None and shared.output_ids is None
    with pytest.raises(ConfigError, match="softmax_vocab: target"):
        shared.restrict_output(torch.ones(V, dtype=torch.bool))
    model = Transformer(TARGET, vocab_size=V)
    assert model.output_ids is None  # every piece until the training data says otherwise
    with pytest.raises(ValueError, match="shape"):
        model.restrict_output(torch.ones(V - 1, dtype=torch.bool))
    for left_out in (PAD_ID, UNK_ID):
        keep = torch.ones(V, dtype=torch.bool)
        keep[left_out] = False
        with pytest.raises(ValueError, match="padding"):
            model.restrict_output(keep)
    with pytest.raises(ConfigError, match="softmax_vocab"):
        ModelConfig(softmax_vocab="source")


MODEL = {
    "preset": "tiny",
    "overrides": {
        "N": 1,
        "d_model": 32,
        "d_ff": 64,
        "h": 2,
        "d_k": 16,
        "d_v": 16,
        "p_drop": 0.0,
        "softmax_vocab": "target",
    },
}


def _corpus(root: Path) -> dict[str, Path]:
    """A copy task whose targets use a third of the vocabulary (``target_ids``)."""
    from tests.test_training import VOCAB, reversal_corpus

    root.mkdir()
    corpus = reversal_corpus(root)
    rng = np.random.default_rng(1)
    target_ids = sorted(rng.choice(np.arange(4, VOCAB), size=(VOCAB - 4) // 3, replace=False))
    for split, n in (("train", 120), ("valid", 16)):
        rows = [rng.choice(target_ids, size=rng.integers(3, 9)).tolist() for _ in range(n)]
        write_token_array(corpus["bin"] / f"{split}.en", rows, VOCAB)
        write_token_array(corpus["bin"] / f"{split}.de", rows, VOCAB)
    return {**corpus, "target_ids": target_ids, "vocab": VOCAB}


def test_training_sets_the_subset_keeps_it_through_resume_averaging_and_decoding(
    tmp_path: Path,
) -> None:
    corpus = _corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    train = {
        "max_steps": 6, "max_tokens": 64, "tokens_per_update": 64, "warmup": 10,
        "checkpoint_every_steps": 2, "keep_checkpoints": 3, "val_every_steps": 6,
        "log_every_steps": 2, "num_workers": 0, "accelerator": "cpu", "devices": 1,
    }  # fmt: skip

    def argv(steps: int) -> list[str]:
        return [
            "train", "--bin-dir", str(corpus["bin"]), "--spm-model", str(corpus["spm"]),
            "--src", "en", "--tgt", "de", "--run-dir", str(run),
            "--model", json.dumps(MODEL), "--train", json.dumps({**train, "max_steps": steps}),
        ]  # fmt: skip

    assert main(argv(4)) == 0
    assert main(argv(6)) == 0  # resumed at step 4: the same subset
    summary = json.loads((run / "train_summary.json").read_text())
    expected = sorted([PAD_ID, UNK_ID, BOS_ID, EOS_ID, *corpus["target_ids"]])
    assert summary["resumed_from"] == "step=00000004.ckpt"
    assert summary["softmax_pieces"] == len(expected) < corpus["vocab"]
    assert np.isfinite(summary["metrics"]["val/loss"])
    checkpoints = list_checkpoints(run / "checkpoints")
    for path in checkpoints:
        mask = load_checkpoint(path)["state_dict"]["model.output_mask"]
        assert torch.flatten(mask.nonzero()).tolist() == expected
    averaged = average_checkpoints(checkpoints)
    assert torch.flatten(averaged["output_mask"].nonzero()).tolist() == expected

    model, _ = load_model_file(checkpoints[-1])
    assert model.output_ids.tolist() == expected
    src = torch.tensor([[5, 9, 12, EOS_ID], [7, 7, EOS_ID, PAD_ID]])
    ids = {"bos_id": BOS_ID, "eos_id": EOS_ID, "pad_id": PAD_ID, "max_len_b": 10}
    outputs = list(greedy_search(model, src, **ids))
    outputs += [h[0].tokens for h in beam_search(model, src, beam_size=3, alpha=0.6, **ids)]
    produced = {int(t) for tokens in outputs for t in tokens}
    assert produced and produced <= set(expected)


def test_a_checkpoint_from_before_the_flag_is_the_same_experiment() -> None:
    """A model config recorded before ``softmax_vocab`` existed (no key) matches a config with
    the paper's value, so such a run resumes and averages; "target" is another experiment."""
    from transformer_nmt.runs.checkpoints import experiment_mismatch

    old = {k: v for k, v in TINY.to_dict().items() if k != "softmax_vocab"}
    meta = {"model_config": old, "vocab": {"sha256": "x"}}
    assert experiment_mismatch(meta, model_config=TINY.to_dict(), vocab_sha256="x") is None
    assert "softmax_vocab" in experiment_mismatch(
        meta, model_config=TARGET.to_dict(), vocab_sha256="x"
    )
