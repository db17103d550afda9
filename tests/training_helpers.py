"""Tiny training runs: a reversal corpus, the train command's argv, its batch traces, and
the dev set's loss and BLEU of a checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from tests.conftest import checkout_pythonpath
from transformer_nmt.data.batch import training_batch
from transformer_nmt.data.token_array import TokenArray, TokenArrayWriter


def write_token_array(prefix: str | Path, sentences, vocab_size: int) -> TokenArray:
    """Write a small token array in one call; returns it opened."""
    with TokenArrayWriter(prefix, vocab_size) as writer:
        writer.write_many(sentences)
    return TokenArray(prefix)


VOCAB = 64
MODEL = {
    "preset": "tiny",
    "overrides": {"N": 1, "d_model": 32, "d_ff": 64, "h": 2, "d_k": 16, "d_v": 16},
}
BASE_TRAIN = {
    "max_tokens": 64,
    "tokens_per_update": 64,
    "warmup": 10,
    "accelerator": "cpu",
    "devices": 1,
    "checkpoint_every_steps": 5,
    "keep_checkpoints": 3,
    "val_every_steps": 10,
    "log_every_steps": 5,
    "seed": 3,
}


def reversal_corpus(root: Path) -> dict[str, Path]:
    """A SentencePiece model with the fixed special ids and a reversal task as token arrays."""
    import sentencepiece as spm

    rng = np.random.default_rng(0)
    text = root / "text.txt"
    words = ["".join(rng.choice(list("abcdefgh"), size=rng.integers(2, 6))) for _ in range(400)]
    text.write_text("\n".join(" ".join(words[i : i + 8]) for i in range(0, 400, 8)) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(root / "spm"),
        vocab_size=VOCAB,
        model_type="bpe",
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        minloglevel=2,
    )
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for split, n in (("train", 120), ("valid", 16)):
        src = [rng.integers(4, VOCAB, size=rng.integers(3, 9)).tolist() for _ in range(n)]
        write_token_array(bin_dir / f"{split}.en", src, VOCAB)
        write_token_array(bin_dir / f"{split}.de", [s[::-1] for s in src], VOCAB)
    return {"spm": root / "spm.model", "bin": bin_dir}


def train_argv(corpus: dict[str, Path], run_dir: Path, **train: object) -> list[str]:
    cfg = {**BASE_TRAIN, **train}
    return [
        "train",
        "--bin-dir",
        str(corpus["bin"]),
        "--spm-model",
        str(corpus["spm"]),
        "--src",
        "en",
        "--tgt",
        "de",
        "--run-dir",
        str(run_dir),
        "--model",
        json.dumps(MODEL),
        "--train",
        json.dumps(cfg),
    ]


def spawn_training(argv: list[str], log_file) -> subprocess.Popen:
    """``python -m transformer_nmt <argv>`` in a subprocess (this checkout's code), output to
    ``log_file``."""
    env = {**os.environ, "PYTHONPATH": checkout_pythonpath()}
    return subprocess.Popen(
        [sys.executable, "-m", "transformer_nmt", *argv],
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )


def read_trace(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _dev_bleu(checkpoint: Path, corpus: dict[str, Path], n: int, *, beam: bool) -> float:
    """sacreBLEU of ``checkpoint``'s weights on the first ``n`` dev sentences of ``corpus``,
    greedy or beam 4, α = 0.6 (§6.1), decoded to text by the SentencePiece model."""
    import sacrebleu
    import sentencepiece as spm

    from transformer_nmt.data.batch import source_batch
    from transformer_nmt.data.vocab import BOS_ID, EOS_ID, PAD_ID
    from transformer_nmt.runs.checkpoints import load_model_file
    from transformer_nmt.search import beam_search, greedy_search

    model, _ = load_model_file(checkpoint)
    sp = spm.SentencePieceProcessor(model_file=str(corpus["spm"]))
    src, tgt = TokenArray(corpus["bin"] / "valid.en"), TokenArray(corpus["bin"] / "valid.de")
    batch = source_batch([src[i] for i in range(n)])
    ids = {"bos_id": BOS_ID, "eos_id": EOS_ID, "pad_id": PAD_ID, "max_len_b": 50}
    if beam:
        out = [
            nbest[0].tokens for nbest in beam_search(model, batch, beam_size=4, alpha=0.6, **ids)
        ]
    else:
        out = greedy_search(model, batch, **ids)
    hyps = [sp.decode(list(map(int, tokens))) for tokens in out]
    refs = [sp.decode(tgt[i].astype(int).tolist()) for i in range(n)]
    return sacrebleu.corpus_bleu(hyps, [refs]).score


def _dev_loss(checkpoint: Path, corpus: dict[str, Path]) -> float:
    """§5.4 label-smoothed loss per target token of ``checkpoint``'s weights on the whole dev
    set of ``corpus``, in one batch."""
    from transformer_nmt.data.batch import flatten
    from transformer_nmt.data.vocab import PAD_ID
    from transformer_nmt.runs.checkpoints import load_model_file
    from transformer_nmt.training.objective import label_smoothed_cross_entropy

    model, meta = load_model_file(checkpoint)
    src, tgt = TokenArray(corpus["bin"] / "valid.en"), TokenArray(corpus["bin"] / "valid.de")
    every = range(len(src))
    batch = training_batch(
        *flatten([src[i] for i in every]), *flatten([tgt[i] for i in every]), every
    )
    batch = {k: torch.from_numpy(v) for k, v in batch.items()}
    with torch.no_grad():
        logits = model(batch["src"], batch["tgt_in"])
    eps = meta["model_config"]["eps_ls"]
    out = label_smoothed_cross_entropy(logits, batch["tgt_out"], eps=eps, pad_id=PAD_ID)
    return float(out.loss / out.ntokens)
