"""Attention maps: per-head encoder-decoder attention figures (PNG) and their numbers (CSV)."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_nmt.cli import main
from transformer_nmt.data.spm import train_spm
from transformer_nmt.data.vocab import PAD_ID, load_vocab_info
from transformer_nmt.inference.translator import Translator
from transformer_nmt.model.config import ModelConfig
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.runs.checkpoints import save_model_file
from transformer_nmt.search import SearchSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORDS = ["ein", "mann", "eine", "frau", "hund", "läuft", "spielt", "im", "park", "mit", "ball"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A toy SentencePiece model, a random 2-layer, 3-head model and a 4-line test set."""
    root = tmp_path_factory.mktemp("attention_maps")
    rng = random.Random(0)
    corpus = root / "train.txt"
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(300)]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    train_spm([corpus], root / "spm", vocab_size=300, sample_sentences=300, seed=1, num_threads=1)
    vocab = load_vocab_info(root / "spm.model")
    torch.manual_seed(0)
    cfg = ModelConfig(N=2, d_model=24, d_ff=32, h=3, d_k=8, d_v=8, p_drop=0.0)
    model = Transformer(cfg, vocab_size=vocab.size, pad_id=PAD_ID)
    save_model_file(
        root / "model.pt", model_config=cfg.to_dict(), state_dict=model.state_dict(),
        vocab=vocab.to_dict(), step=1, source_checkpoints=["step=00000001.ckpt"],
    )  # fmt: skip
    test = root / "test.de"
    test.write_text("ein mann läuft im park\n\neine frau spielt\nhund\n", encoding="utf-8")
    return {"spm": root / "spm.model", "model": root / "model.pt", "test": test}


def _args(assets: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["attention-maps", "--model", str(assets["model"]), "--spm-model",
            str(assets["spm"]), "--input", str(assets["test"]), "--out-dir", str(out),
            "--beam", "2", "--max-len-b", "4", *extra]  # fmt: skip


def test_figures_and_csv_hold_every_head_and_their_mean(assets, tmp_path) -> None:
    from matplotlib.image import imread

    out = tmp_path / "figures"
    assert main(_args(assets, out, "--lines", "1", "3", "--layer", "0")) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "attention_1.csv", "attention_1.png", "attention_3.csv", "attention_3.png",
    ]  # fmt: skip
    image = imread(out / "attention_1.png")
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200
    settings = SearchSettings(beam=2, max_len_b=4)
    translator = Translator(assets["model"], assets["spm"], settings)
    (expected,) = translator.translate_with_attention(["ein mann läuft im park"], layer=0)
    with open(out / "attention_1.csv", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    n_tgt, n_src = len(expected.tgt_tokens), len(expected.src_tokens)
    assert len(rows) == 4 * n_tgt * n_src  # 3 heads + the mean
    grid = {}
    for row in rows:
        grid.setdefault(row["panel"], np.zeros((n_tgt, n_src)))
        t, s = int(row["target_position"]), int(row["source_position"])
        grid[row["panel"]][t, s] = float(row["weight"])
        assert row["target_token"] == expected.tgt_tokens[t]
        assert row["source_token"] == expected.src_tokens[s]
    assert sorted(grid) == ["head_1", "head_2", "head_3", "mean"]
    for head in range(3):
        np.testing.assert_allclose(grid[f"head_{head + 1}"], expected.weights[head], atol=1e-6)
    np.testing.assert_allclose(grid["mean"], expected.averaged, atol=1e-6)
    np.testing.assert_allclose(grid["mean"].sum(axis=1), 1.0, atol=1e-5)
    # layer 0 is not the last layer's attention
    (last,) = translator.translate_with_attention(["ein mann läuft im park"])
    assert not np.allclose(last.weights, expected.weights)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--lines", "7"), "test.de: has 4 lines, no line 7"),
        (("--lines", "2"), "test.de:2: empty line"),
        (("--lines", "1", "--layer", "2"), "--layer 2: the model has 2 decoder layers"),
        (("--lines", "1", "1"), "--lines: each line once"),
    ],
)
def test_bad_requests_name_the_file_or_flag_and_write_nothing(
    assets, tmp_path, capsys, extra, message
) -> None:
    out = tmp_path / "figures"
    assert main(_args(assets, out, *extra)) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() or list(out.iterdir()) == []


def test_figures_are_logged_as_mlflow_artifacts(
    assets, tmp_path, monkeypatch, migrated_store: str
) -> None:
    from mlflow.tracking import MlflowClient

    uri = migrated_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    out = tmp_path / "figures"
    tracking = ["--mlflow-experiment", "toy_en-de", "--mlflow-run", "exp"]
    assert main(_args(assets, out, "--lines", "1", *tracking)) == 0
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("toy_en-de").experiment_id])
    names = sorted(a.path for a in client.list_artifacts(run.info.run_id, "figures"))
    assert names == ["figures/attention_1.csv", "figures/attention_1.png"]
    assert run.data.params["attention_maps.lines"] == "[1]"
