"""CTranslate2 export (``export-ct2``) and decoding (``translate --engine ctranslate2``), and
the other CPU decoding speed flag, ``translate --quantize int8`` (torch engine).

CTranslate2 is an optional dependency (``pip install '.[ct2]'``): every test that needs it is
skipped with the reason when it is not installed; the install hint is tested without it.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_nmt.cli import main
from transformer_nmt.data.batch import flatten, training_batch
from transformer_nmt.data.spm import train_spm
from transformer_nmt.data.vocab import BOS_ID, EOS_ID, PAD_ID, load_vocab_info
from transformer_nmt.errors import CheckpointError, ConfigError, UserFacingError
from transformer_nmt.inference.ct2 import Ct2Translator
from transformer_nmt.inference.factory import open_translator
from transformer_nmt.inference.translator import Translator
from transformer_nmt.model.config import ModelConfig, apply_overrides
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.runs.checkpoints import save_model_file
from transformer_nmt.search import SearchSettings
from transformer_nmt.training.objective import label_smoothed_cross_entropy
from transformer_nmt.training.optimizer import build_optimizer, build_scheduler

# A toy language pair: German words translated word by word (same order) into English words.
LEXICON = {
    "ein": "a", "mann": "man", "eine": "a", "frau": "woman", "hund": "dog", "läuft": "runs",
    "spielt": "plays", "im": "in", "park": "park", "auf": "on", "der": "the",
    "straße": "street", "mit": "with", "einem": "one", "ball": "ball",
}  # fmt: skip
TINY = ModelConfig(N=2, d_model=64, d_ff=128, h=4, d_k=16, d_v=16, p_drop=0.0)


def _pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = sorted(LEXICON)
    out = []
    for _ in range(n):
        src = [rng.choice(words) for _ in range(rng.randint(1, 8))]
        out.append((" ".join(src), " ".join(LEXICON[w] for w in src)))
    return out


# Tiny models: one torch thread (conftest.one_torch_thread) for every test here.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def ct2():
    pytest.importorskip(
        "ctranslate2", reason="CTranslate2 is not installed (optional: pip install '.[ct2]')"
    )
    from transformer_nmt.inference import ct2

    return ct2


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ct2_spm")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(s for p in _pairs(300, 0) for s in p) + "\n", encoding="utf-8")
    train_spm([corpus], root / "spm", vocab_size=320, sample_sentences=600, seed=1, num_threads=1)
    return root / "spm.model"


def _save(path: Path, model: Transformer, spm_model: Path, step: int = 1) -> Path:
    save_model_file(
        path, model_config=model.cfg.to_dict(), state_dict=model.state_dict(),
        vocab=load_vocab_info(spm_model).to_dict(), step=step, source_checkpoints=[],
    )  # fmt: skip
    return path


@pytest.fixture(scope="module")
def trained_model(spm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Transformer trained for 150 updates on the toy pair (dev BLEU ~45, so its beams
    still hold real alternatives), as a model file."""
    import sentencepiece as spm

    threads = torch.get_num_threads()  # module fixtures run before the autouse one_thread
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ct2_trained")
    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    data = [(sp.encode(a), sp.encode(b)) for a, b in _pairs(2000, 0)]
    torch.manual_seed(0)
    model = Transformer(TINY, vocab_size=sp.get_piece_size(), pad_id=PAD_ID)
    optimizer = build_optimizer(model.parameters())
    scheduler = build_scheduler(optimizer, d_model=TINY.d_model, warmup=100, scale=0.15)
    rng = random.Random(2)
    model.train()
    for _ in range(150):
        index = rng.sample(range(len(data)), 64)
        src, tgt = flatten([data[i][0] for i in index]), flatten([data[i][1] for i in index])
        batch = {k: torch.from_numpy(v) for k, v in training_batch(*src, *tgt, index).items()}
        logits = model(batch["src"], batch["tgt_in"])
        out = label_smoothed_cross_entropy(logits, batch["tgt_out"], eps=0.1, pad_id=PAD_ID)
        optimizer.zero_grad()
        (out.loss / out.ntokens).backward()
        optimizer.step()
        scheduler.step()
    torch.set_num_threads(threads)
    model_file = _save(root / "model.pt", model, spm_model, step=150)
    return {"model": model_file, "spm": spm_model}


@pytest.fixture(scope="module")
def trained(ct2, trained_model: dict[str, Path]) -> dict[str, Path]:
    """``trained_model`` and its CTranslate2 export."""
    out = trained_model["model"].parent / "ct2"
    ct2.export_ct2(trained_model["model"], trained_model["spm"], out)
    return {**trained_model, "ct2": out}


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # the paper's model: post-LN, tied embeddings, sinusoids, bias-free attention
        ["norm_first=true"],
        ["attention_bias=true", "ln_eps=1e-5"],
        ["tie_embeddings=false"],
        ["positional=learned", "max_positions=64"],
        ["N=3", "h=2", "d_k=32", "d_v=32"],
    ],
)
def test_exported_model_scores_like_ours(ct2, spm_model, tmp_path, overrides) -> None:
    """Per-token log-probabilities of given targets agree to float32 precision: the weights,
    layer norms, positions and special tokens (``x EOS`` source, ``BOS y`` target) all match."""
    import ctranslate2
    import sentencepiece as spm

    torch.manual_seed(0)
    model = Transformer(apply_overrides(TINY, overrides), vocab_size=320, pad_id=PAD_ID)
    with torch.no_grad():  # non-trivial layer norms and biases, so that a mix-up shows
        for name, param in model.named_parameters():
            if "norm" in name or "bias" in name:
                param.add_(0.1 * torch.randn_like(param))
    model.eval()
    ct2.export_ct2(_save(tmp_path / "model.pt", model, spm_model), spm_model, tmp_path / "ct2")
    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    pairs = _pairs(6, seed=5)
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), intra_threads=1)
    results = translator.score_batch(
        [sp.encode(a, out_type=str) for a, _ in pairs],
        [sp.encode(b, out_type=str) for _, b in pairs],
    )
    for (src, tgt), result in zip(pairs, results, strict=True):
        y = sp.encode(tgt)
        with torch.no_grad():
            logits = model(torch.tensor([sp.encode(src) + [EOS_ID]]), torch.tensor([[BOS_ID, *y]]))
        ours = logits.log_softmax(-1)[0, torch.arange(len(y) + 1), torch.tensor([*y, EOS_ID])]
        np.testing.assert_allclose(result.log_probs, ours.numpy(), atol=1e-4)


def _translations(translator, lines: list[str]) -> list[str]:
    return translator.translate(lines)


def test_greedy_search_gives_identical_translations(trained) -> None:
    lines = [src for src, _ in _pairs(60, seed=1)] + ["", "der hund"]
    settings = SearchSettings(beam=1)
    ours = _translations(Translator(trained["model"], trained["spm"], settings), lines)
    theirs = _translations(
        open_translator("ctranslate2", trained["ct2"], trained["spm"], settings), lines
    )
    assert theirs == ours
    assert ours[-2] == ""  # empty lines stay empty, in input order


def test_parallel_batches_give_the_same_translations_in_order(trained) -> None:
    """inter_threads=2 runs two batches at once (every batch is submitted asynchronously);
    small batches make many of them. Greedy: ours, batch by batch, is the reference; beam 4:
    the same n-best lists and scores as one batch at a time, in input order."""
    lines = [src for src, _ in _pairs(80, seed=5)] + ["", "der hund"]

    def engines(settings):
        return [
            Ct2Translator(trained["ct2"], trained["spm"], settings, "cpu", threads=1,
                          inter_threads=n)
            for n in (1, 2)
        ]  # fmt: skip

    greedy = SearchSettings(beam=1, max_tokens=64)
    ours = Translator(trained["model"], trained["spm"], greedy).translate(lines)
    assert [engine.translate(lines) for engine in engines(greedy)] == [ours, ours]
    one, two = engines(SearchSettings(beam=4, alpha=0.6, nbest=2, max_tokens=64))
    sequential = one.translate_nbest(lines)
    assert two.translate_nbest(lines) == sequential
    assert sequential[-2] == [("", 0.0)]


def test_on_a_cpu_the_thread_budget_becomes_one_thread_workers(trained, monkeypatch) -> None:
    """Neither threads nor workers given: torch's thread count as that many one-thread workers
    (CTranslate2's fastest split on a CPU); either given: as given."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    settings = SearchSettings()
    default = Ct2Translator(trained["ct2"], trained["spm"], settings, "cpu")
    assert default.translator.num_translators == 3
    given = Ct2Translator(trained["ct2"], trained["spm"], settings, "cpu", threads=2)
    assert given.translator.num_translators == 1
    assert default.translator.compute_type == given.translator.compute_type == "float32"


def _model_log_prob(
    model: Transformer, src: list[int], tgt: list[int], renormalised: bool
) -> float:
    """log P(tgt EOS | src EOS) under ``model`` in float64 arithmetic on its float32 logits;
    ``renormalised``: with PAD and BOS taken out of every softmax, as CTranslate2 suppresses
    them (our search masks them after the softmax, keeping the model's normalisation)."""
    with torch.no_grad():
        logits = model(torch.tensor([[*src, EOS_ID]]), torch.tensor([[BOS_ID, *tgt]]))[0].double()
    if renormalised:
        logits[:, [PAD_ID, BOS_ID]] = float("-inf")
    targets = torch.tensor([*tgt, EOS_ID])
    return logits.log_softmax(-1)[torch.arange(len(targets)), targets].sum().item()


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_search_scores_each_hypothesis_as_the_model_does(trained, alpha) -> None:
    """What is exactly comparable between the engines: the score each reports for its own
    n-best hypotheses is the exported model's log-probability of that hypothesis under its
    objective, to float32 precision: ours log P(Y | X) / ((5 + |Y|) / 6)^α (GNMT, §6.1),
    CTranslate2's log P'(Y | X) / |Y|^α with PAD and BOS outside its softmax; |Y| counts EOS."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(trained["spm"]))
    lines = [src for src, _ in _pairs(30, seed=4)]
    settings = SearchSettings(beam=4, alpha=alpha, nbest=4)
    ours = Translator(trained["model"], trained["spm"], settings)
    theirs = open_translator("ctranslate2", trained["ct2"], trained["spm"], settings)
    engines = (
        (ours, lambda n: ((5 + n) / 6) ** alpha, False),
        (theirs, lambda n: n**alpha, True),
    )
    for engine, penalty, renormalised in engines:
        nbests = engine.search([engine.encode(line) for line in lines])
        for line, nbest in zip(lines, nbests, strict=True):
            assert len(nbest) == 4
            assert [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
            for hyp in nbest:
                log_prob = _model_log_prob(ours.model, sp.encode(line), hyp.tokens, renormalised)
                expected = log_prob / penalty(len(hyp.tokens) + 1)
                assert hyp.score == pytest.approx(expected, abs=1e-4), (type(engine), line)


def test_beam_search_picks_the_same_translation_for_most_sentences(trained) -> None:
    """Beam 4, α = 0.6. The searches differ by design (the length penalties above, and a
    sentence's search ends here once K hypotheses finished, as in fairseq, where CTranslate2
    keeps K live ones), so some sentences differ: 10 of these 200 on a 2-core EPYC with
    AVX512-BF16. Rounding only moves near-ties, so the bound leaves as many again."""
    import sacrebleu

    pairs = _pairs(200, seed=1)
    lines, refs = [s for s, _ in pairs], [t for _, t in pairs]
    settings = SearchSettings(beam=4, alpha=0.6)
    ours = _translations(Translator(trained["model"], trained["spm"], settings), lines)
    theirs = _translations(
        open_translator("ctranslate2", trained["ct2"], trained["spm"], settings), lines
    )
    differ = sum(a != b for a, b in zip(ours, theirs, strict=True))
    assert differ <= 20, f"{differ} of {len(lines)} translations differ"
    # and the model translates: far above copying the source (which shares "park", "ball")
    bleu, copied = (sacrebleu.corpus_bleu(h, [refs]).score for h in (ours, lines))
    assert bleu > copied + 20, (bleu, copied)


def test_cli_exports_and_translates_with_either_engine(trained, tmp_path, capsys) -> None:
    source = tmp_path / "src.txt"
    source.write_text("\n".join(s for s, _ in _pairs(10, seed=3)) + "\n", encoding="utf-8")
    out_dir = tmp_path / "ct2"
    common = ["--spm-model", str(trained["spm"]), "--input", str(source)]
    assert (
        main(["export-ct2", "--model", str(trained["model"]), "--out", str(out_dir), *common[:2]])
        == 0
    )
    assert (out_dir / "model.bin").is_file() and (out_dir / "transformer_nmt.json").is_file()
    for engine, model in (("torch", trained["model"]), ("ctranslate2", out_dir)):
        out = tmp_path / f"{engine}.txt"
        args = ["translate", "--engine", engine, "--model", str(model), "--beam", "1"]
        assert main([*args, *common, "--output", str(out)]) == 0
    assert (tmp_path / "torch.txt").read_text() == (tmp_path / "ctranslate2.txt").read_text()
    # an existing directory is replaced only with --force
    assert (
        main(["export-ct2", "--model", str(trained["model"]), "--out", str(out_dir), *common[:2]])
        == 2
    )
    assert "--force" in capsys.readouterr().err


def test_clear_errors(ct2, trained, spm_model, tmp_path, capsys) -> None:
    settings = SearchSettings()
    # d_k != d_model / h: CTranslate2 cannot run it; the error names the key
    model = Transformer(apply_overrides(TINY, ["d_k=8"]), vocab_size=320, pad_id=PAD_ID)
    with pytest.raises(ConfigError, match="'d_k'=8 .* d_model / h = 16"):
        ct2.export_ct2(_save(tmp_path / "dk.pt", model, spm_model), spm_model, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    # another SentencePiece model than the exported one
    other = tmp_path / "other"
    other.mkdir()
    corpus = other / "corpus.txt"
    corpus.write_text("\n".join(s for p in _pairs(300, 9) for s in p) + "\n", encoding="utf-8")
    train_spm([corpus], other / "spm", vocab_size=330, sample_sentences=600, seed=1, num_threads=1)
    with pytest.raises(CheckpointError, match="another vocabulary"):
        open_translator("ctranslate2", trained["ct2"], other / "spm.model", settings)
    # a model file given to the ctranslate2 engine, a directory to the torch engine
    with pytest.raises(CheckpointError, match="export-ct2"):
        open_translator("ctranslate2", trained["model"], trained["spm"], settings)
    with pytest.raises(CheckpointError, match="--engine ctranslate2"):
        open_translator("torch", trained["ct2"], trained["spm"], settings)
    # the CLI prints one line and exits with 2
    source = tmp_path / "src.txt"
    source.write_text("ein mann\n", encoding="utf-8")
    args = ["translate", "--engine", "ctranslate2", "--model", str(trained["ct2"])]
    args += ["--spm-model", str(other / "spm.model"), "--input", str(source)]
    assert main([*args, "--output", str(tmp_path / "out.txt")]) == 2
    assert "another vocabulary" in capsys.readouterr().err


def test_missing_ctranslate2_says_how_to_install(monkeypatch, tmp_path) -> None:
    from transformer_nmt.inference import ct2

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    with pytest.raises(UserFacingError, match=r"pip install 'transformer_nmt\[ct2\]'"):
        ct2.import_ctranslate2()
    with pytest.raises(UserFacingError, match="not installed"):
        open_translator("ctranslate2", tmp_path, tmp_path / "spm.model", SearchSettings())


def test_long_sources_are_cut_to_the_exported_positions(ct2, trained, tmp_path) -> None:
    """A source + output longer than the exported sinusoid table is truncated (and counted),
    never a CTranslate2 error about missing position encodings."""
    ct2.export_ct2(trained["model"], trained["spm"], tmp_path / "short", max_positions=24)
    settings = SearchSettings(beam=2, max_len_b=10)
    translator = open_translator("ctranslate2", tmp_path / "short", trained["spm"], settings)
    assert translator.max_src_tokens == 24 - 10 - 1
    long_line = " ".join(["der hund läuft im park"] * 8)
    assert len(translator.translate([long_line, "ein mann"])) == 2
    assert translator.truncated == 1


def test_int8_quantised_torch_decoding_mostly_agrees(trained_model) -> None:
    """``translate --quantize int8`` (torch engine, CPU): the trained toy model's beam-search
    translations stay mostly the same, and so does the corpus BLEU (the flag's BLEU change
    on a real model is in benchmarks/log/2026-11-25.md)."""
    import sacrebleu

    # 300 sentences: on 60 the corpus BLEU of this toy model moved by ±2.3 between int8 and
    # fp32 either way, with the same weights' rounding differences (noise, not a trend)
    pairs = _pairs(300, seed=1)
    lines, refs = [s for s, _ in pairs], [t for _, t in pairs]
    settings = SearchSettings(beam=4, alpha=0.6)
    fp32 = _translations(Translator(trained_model["model"], trained_model["spm"], settings), lines)
    quantized = Translator(trained_model["model"], trained_model["spm"], settings, quantize="int8")
    kinds = {type(m).__module__ for m in quantized.model.modules()}
    assert "torch.ao.nn.quantized.dynamic.modules.linear" in kinds
    assert not any(type(m) is torch.nn.Linear for m in quantized.model.modules())
    int8 = _translations(quantized, lines)
    same = sum(a == b for a, b in zip(fp32, int8, strict=True)) / len(lines)
    bleu_fp32 = sacrebleu.corpus_bleu(fp32, [refs]).score
    bleu_int8 = sacrebleu.corpus_bleu(int8, [refs]).score
    assert same >= 0.8, f"only {same:.0%} identical translations"
    assert bleu_int8 >= bleu_fp32 - 2.0, (bleu_fp32, bleu_int8)
    with pytest.raises(ConfigError, match="--quantize"):
        open_translator(
            "ctranslate2",
            trained_model["model"].parent,
            trained_model["spm"],
            settings,
            quantize="int8",
        )
    with pytest.raises(ConfigError, match="CPU"):
        Translator(
            trained_model["model"], trained_model["spm"], settings, device="cuda", quantize="int8"
        )
