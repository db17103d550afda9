"""``average --last auto``: the number of averaged checkpoints chosen on dev BLEU."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from transformer_nmt.cli import main
from transformer_nmt.data.spm import train_spm
from transformer_nmt.data.vocab import EOS_ID, PAD_ID, load_vocab_info
from transformer_nmt.evaluation.score import score_lines
from transformer_nmt.evaluation.selection import candidate_ks
from transformer_nmt.inference.engine import TranslationEngine
from transformer_nmt.inference.translator import Translator
from transformer_nmt.model.config import ModelConfig
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.runs.checkpoints import average_checkpoints, save_model_file
from transformer_nmt.search import Hypothesis, SearchSettings

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


# --- translate.alpha: auto: the length penalty chosen on the dev set (select-alpha) ----------


def _averaged_model(run: dict[str, Path]) -> Path:
    """The newest checkpoint as a model file, its last LayerNorm biased towards the EOS
    embedding: hypotheses end at varied lengths, so the length penalty changes translations
    (the random weights alone never end a sentence within max_len_b)."""
    model = run["root"] / "alpha_model.pt"
    if not model.exists():
        payload = torch.load(run["ckpts"] / "step=00000006.ckpt", weights_only=True)
        state = {k.removeprefix("model."): v for k, v in payload["state_dict"].items()}
        eos = state["src_embed.weight"][EOS_ID]
        state["decoder_layers.0.res_ffn.norm.bias"] = 0.2 * eos / eos.norm() * CFG.d_model**0.5
        vocab = load_vocab_info(run["spm"])
        save_model_file(
            model, model_config=CFG.to_dict(), state_dict=state, vocab=vocab.to_dict(), step=6,
            source_checkpoints=["step=00000006.ckpt"],
        )  # fmt: skip
    return model


class LengthByAlpha(TranslationEngine):
    """An engine whose translations grow with α: the first round(2α) + 3 words of the source."""

    def __init__(self) -> None:
        self.settings = SearchSettings()

    def encode(self, line: str) -> list[str]:
        return line.split()

    def decode(self, tokens) -> str:  # type: ignore[no-untyped-def]
        return " ".join(tokens)

    def search(self, sources):  # type: ignore[no-untyped-def]
        keep = round(2 * self.settings.alpha) + 3
        return [
            [Hypothesis(tokens=list(words[:keep]), score=0.0, log_prob=0.0)] for words in sources
        ]


def test_select_alpha_keeps_the_alpha_with_the_best_dev_bleu() -> None:
    from transformer_nmt.evaluation.selection import select_alpha

    sources = [" ".join(f"w{i}_{j}" for j in range(12)) for i in range(30)]
    engine = LengthByAlpha()
    references = [" ".join(line.split()[:7]) for line in sources]  # what α 2.0 translates
    selection = select_alpha(engine, sources, references, "de", candidates=(0.6, 1.0, 2.0, 3.0))
    assert selection.best_alpha == 2.0
    assert selection.dev_bleu[2.0] == pytest.approx(100.0)
    assert selection.dev_bleu[0.6] < selection.dev_bleu[1.0] < 100.0  # too short: brevity
    assert selection.dev_bleu[3.0] < 100.0  # too long: precision
    assert engine.settings.alpha == 0.6  # the engine's settings are given back
    # a tie goes to the α nearest the paper's 0.6: 1.1 and 1.2 both keep 5 words
    references = [" ".join(line.split()[:5]) for line in sources]
    selection = select_alpha(engine, sources, references, "de", candidates=(1.2, 1.1, 3.0))
    assert selection.best_alpha == 1.1 and selection.dev_bleu[1.2] == selection.dev_bleu[1.1]


def test_select_alpha_compares_case_insensitively_for_a_lowercasing_vocabulary() -> None:
    from transformer_nmt.evaluation.selection import select_alpha

    sources = [" ".join(f"w{i}_{j}" for j in range(12)) for i in range(30)]
    references = [" ".join(line.split()[:7]).upper() for line in sources]  # α 2.0, cased
    engine = LengthByAlpha()
    candidates = (0.6, 2.0, 3.0)
    lowercase = select_alpha(engine, sources, references, "de", candidates, lowercase=True)
    assert lowercase.best_alpha == 2.0 and lowercase.dev_bleu[2.0] == pytest.approx(100.0)
    cased = select_alpha(engine, sources, references, "de", candidates)
    # cased, the words of the lowercase output do not match: each α scores lower
    assert all(cased.dev_bleu[a] < lowercase.dev_bleu[a] for a in candidates)


def test_select_alpha_writes_the_dev_bleu_of_every_alpha(run: dict[str, Path]) -> None:
    """The CLI on a real model: one dev BLEU per α, each the score of that α's translations."""
    root, model = run["root"], _averaged_model(run)
    dev = run["dev"].read_text(encoding="utf-8").splitlines()
    translator = Translator(model, run["spm"], SEARCH, "cpu")
    (root / "alpha_dev.de").write_text("\n".join(dev) + "\n", encoding="utf-8")  # a copy task
    out = root / "alpha_selection.json"
    argv = ["select-alpha", "--model", str(model), "--spm-model", str(run["spm"])]
    argv += ["--dev-src", str(run["dev"]), "--dev-ref", str(root / "alpha_dev.de")]
    argv += ["--tgt-lang", "de", "--out", str(out), "--beam", "2", "--max-len-b", "6"]
    argv += ["--candidates", "3", "0", "0.6", "--device", "cpu"]
    assert main(argv) == 0
    table = json.loads(out.read_text(encoding="utf-8"))
    expected = {}
    for alpha in (0.0, 0.6, 3.0):
        translator.settings = SearchSettings(beam=2, max_len_b=6, alpha=alpha)
        expected[f"{alpha:g}"] = score_lines(translator.translate(dev), dev, "de").bleu["score"]
    assert table["dev_bleu"] == pytest.approx(expected)
    best = max(expected.values())
    assert table["best_alpha"] == min(
        (float(a) for a, b in expected.items() if b == best), key=lambda a: abs(a - 0.6)
    )
    assert table["dev_src"] == str(run["dev"])


@pytest.mark.parametrize("threads", ["one_torch_thread", "two_torch_threads"])
def test_one_search_for_every_alpha_translates_as_one_search_per_alpha(
    run: dict[str, Path], threads: str, request: pytest.FixtureRequest
) -> None:
    """Translator.translate_per_alpha (one beam search for all α) gives each α the lines of
    ``translate`` with that α: several batches (on 2 threads, two at once: parallel_batches),
    empty lines kept, and α that change the translations."""
    model = _averaged_model(run)
    dev = run["dev"].read_text(encoding="utf-8").splitlines()[:40]
    dev[3] = ""
    settings = SearchSettings(beam=2, max_len_b=6, max_tokens=64)
    alphas = (0.0, 0.6, 3.0)
    request.getfixturevalue(threads)
    translator = Translator(model, run["spm"], settings, "cpu")
    together = translator.translate_per_alpha(dev, alphas)
    alone = {}
    for alpha in alphas:
        translator.settings = replace(settings, alpha=alpha)
        alone[alpha] = translator.translate(dev)
    assert together == alone
    assert together[0.0][3] == ""
    assert len({tuple(lines) for lines in together.values()}) > 1


def test_translate_alpha_from_decodes_with_the_chosen_alpha(run: dict[str, Path]) -> None:
    root, model = run["root"], _averaged_model(run)
    dev = run["dev"].read_text(encoding="utf-8").splitlines()
    translator = Translator(model, run["spm"], SEARCH, "cpu")
    paper = translator.translate(dev)
    translator.settings = SearchSettings(beam=2, max_len_b=6, alpha=3.0)
    long = translator.translate(dev)
    assert long != paper  # this model's translations depend on α
    chosen = root / "chosen_alpha.json"
    chosen.write_text(json.dumps({"best_alpha": 3.0, "dev_bleu": {}}), encoding="utf-8")
    hyp = root / "alpha_dev.hyp"
    argv = ["translate", "--model", str(model), "--spm-model", str(run["spm"])]
    argv += ["--input", str(run["dev"]), "--output", str(hyp), "--beam", "2"]
    argv += ["--max-len-b", "6", "--alpha-from", str(chosen), "--device", "cpu"]
    assert main(argv) == 0
    assert hyp.read_text(encoding="utf-8").splitlines() == long


def test_alpha_from_a_missing_or_broken_file_is_a_clear_error(
    run: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root, model = run["root"], _averaged_model(run)
    hyp = root / "never.hyp"
    base = ["translate", "--model", str(model), "--spm-model", str(run["spm"])]
    base += ["--input", str(run["dev"]), "--output", str(hyp), "--device", "cpu"]
    missing = root / "no_such_selection.json"
    assert main([*base, "--alpha-from", str(missing)]) != 0
    err = capsys.readouterr().err
    assert f"{missing}: file not found (run the select-alpha stage first" in err
    broken = root / "broken_selection.json"
    broken.write_text('{"dev_bleu": {}}', encoding="utf-8")
    assert main([*base, "--alpha-from", str(broken)]) != 0
    assert f"{broken}: no valid 'best_alpha'" in capsys.readouterr().err
    assert not hyp.exists()
    with pytest.raises(SystemExit):  # argparse: --alpha and --alpha-from exclude each other
        main([*base, "--alpha", "1.0", "--alpha-from", str(broken)])
