"""``average --last auto``: the number of averaged checkpoints chosen on dev BLEU."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from transformer_nmt.cli import main
from transformer_nmt.data.spm import train_spm
from transformer_nmt.data.vocab import PAD_ID, load_vocab_info
from transformer_nmt.evaluation.selection import candidate_ks
from transformer_nmt.inference.translator import Translator
from transformer_nmt.model.config import ModelConfig
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.runs.checkpoints import average_checkpoints, save_model_file
from transformer_nmt.search import SearchSettings

WORDS = ["ein", "mann", "eine", "frau", "hund", "läuft", "spielt", "im", "park", "auf", "der"]
CFG = ModelConfig(N=1, d_model=32, d_ff=64, h=2, d_k=16, d_v=16, p_drop=0.0)
SEARCH = SearchSettings(beam=2, max_len_b=6)


def test_candidates_are_bounded_by_the_checkpoints_kept() -> None:
    assert candidate_ks(25) == [1, 5, 10, 20]
    assert candidate_ks(20) == [1, 5, 10, 20]
    assert candidate_ks(7) == [1, 5, 7]
    assert candidate_ks(5) == [1, 5]
    assert candidate_ks(1) == [1]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Six Lightning-shaped checkpoints of a tiny model (different random weights), a
    SentencePiece model and dev sources."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("selection")
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(300)]
    (root / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    train_spm(
        [root / "train.txt"],
        root / "spm",
        vocab_size=300,
        sample_sentences=300,
        seed=1,
        num_threads=1,
    )
    vocab = load_vocab_info(root / "spm.model")
    ckpts = root / "checkpoints"
    ckpts.mkdir()
    for step in range(1, 7):
        torch.manual_seed(step)
        model = Transformer(CFG, vocab_size=vocab.size, pad_id=PAD_ID)
        payload = {
            "global_step": step,
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {"model_config": CFG.to_dict(), "vocab": vocab.to_dict()},
        }
        torch.save(payload, ckpts / f"step={step:08d}.ckpt")
    (root / "dev.en").write_text("\n".join(lines[:20]) + "\n", encoding="utf-8")
    return {"root": root, "spm": root / "spm.model", "ckpts": ckpts, "dev": root / "dev.en"}


def _translate_average_of_last(run: dict[str, Path], k: int, out: Path) -> list[str]:
    paths = sorted(run["ckpts"].glob("step=*.ckpt"))[-k:]
    vocab = load_vocab_info(run["spm"])
    save_model_file(
        out, model_config=CFG.to_dict(), state_dict=average_checkpoints(paths),
        vocab=vocab.to_dict(), step=6, source_checkpoints=[p.name for p in paths],
    )  # fmt: skip
    translator = Translator(out, run["spm"], SEARCH, "cpu")
    dev = run["dev"].read_text(encoding="utf-8").splitlines()
    return translator.translate(dev)


def test_auto_keeps_the_average_with_the_best_dev_bleu(run: dict[str, Path]) -> None:
    root = run["root"]
    # References that the average of the last 5 checkpoints reproduces exactly: K = 5 must win.
    reference = _translate_average_of_last(run, 5, root / "reference_model.pt")
    (root / "dev.de").write_text("\n".join(reference) + "\n", encoding="utf-8")
    out = root / "averaged.pt"
    argv = ["average", "--checkpoint-dir", str(run["ckpts"]), "--last", "auto", "--out", str(out)]
    argv += ["--spm-model", str(run["spm"]), "--dev-src", str(run["dev"])]
    argv += ["--dev-ref", str(root / "dev.de"), "--tgt-lang", "de", "--beam", "2"]
    argv += ["--max-len-b", "6"]
    assert main(argv) == 0
    table = json.loads((root / "average_selection.json").read_text())
    assert set(table["dev_bleu"]) == {"1", "5", "6"}
    assert table["best_k"] == 5 and table["dev_bleu"]["5"] == pytest.approx(100.0)
    assert max(table["dev_bleu"]["1"], table["dev_bleu"]["6"]) < 100.0
    written = torch.load(out, weights_only=True)
    assert written["source_checkpoints"] == [f"step={s:08d}.ckpt" for s in range(2, 7)]
    assert not list(root.glob(".average-*"))  # candidates are cleaned up


def test_auto_without_dev_data_is_a_clear_error(run: dict[str, Path], capsys) -> None:
    out = run["root"] / "nothing.pt"
    argv = ["average", "--checkpoint-dir", str(run["ckpts"]), "--last", "auto", "--out", str(out)]
    assert main(argv) == 2
    assert (
        "--last auto needs --spm-model, --dev-src, --dev-ref, --tgt-lang" in capsys.readouterr().err
    )
    assert not out.exists()
    assert (
        main(["average", "--checkpoint-dir", str(run["ckpts"]), "--last", "x", "--out", str(out)])
        == 2
    )
