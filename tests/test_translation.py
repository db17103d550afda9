"""Translation: token batching, input order, SentencePiece round trip, n-best, stdin, errors."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_nmt import fast_paths
from transformer_nmt.cli import main
from transformer_nmt.data.spm import train_spm
from transformer_nmt.data.vocab import PAD_ID, load_vocab_info
from transformer_nmt.errors import CheckpointError, ConfigError
from transformer_nmt.inference import output
from transformer_nmt.inference import translator as translation
from transformer_nmt.inference.engine import token_batches
from transformer_nmt.inference.output import format_output
from transformer_nmt.inference.translator import Translator
from transformer_nmt.io_utils import read_lines
from transformer_nmt.model.config import ModelConfig
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.progress import Progress
from transformer_nmt.runs.checkpoints import save_model_file
from transformer_nmt.search import Hypothesis, SearchSettings

WORDS = ["ein", "mann", "eine", "frau", "hund", "läuft", "spielt", "im", "park", "auf", "der"]
WORDS += ["straße", "mit", "einem", "ball"]


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


# Tiny models: one torch thread (conftest.one_torch_thread) for every test here.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A SentencePiece model on a toy corpus and a random tiny model file that uses it."""
    root = tmp_path_factory.mktemp("translation")
    corpus = root / "train.txt"
    corpus.write_text("\n".join(_sentences(400, seed=0)) + "\n", encoding="utf-8")
    train_spm([corpus], root / "spm", vocab_size=300, sample_sentences=400, seed=1, num_threads=1)
    vocab = load_vocab_info(root / "spm.model")
    torch.manual_seed(0)
    cfg = ModelConfig(N=1, d_model=32, d_ff=64, h=2, d_k=16, d_v=16, p_drop=0.0)
    model = Transformer(cfg, vocab_size=vocab.size, pad_id=PAD_ID)
    save_model_file(
        root / "model.pt", model_config=cfg.to_dict(), state_dict=model.state_dict(),
        vocab=vocab.to_dict(), step=10, source_checkpoints=["step=00000010.ckpt"],
    )  # fmt: skip
    other = root / "other"
    other.mkdir()
    train_spm([corpus], other / "spm", vocab_size=320, sample_sentences=400, seed=1, num_threads=1)
    return {"spm": root / "spm.model", "model": root / "model.pt", "other_spm": other / "spm.model"}


def test_token_batches_cover_every_sentence_once_within_max_tokens() -> None:
    rng = random.Random(3)
    lengths = [rng.randint(1, 40) for _ in range(300)]
    batches = token_batches(lengths, max_tokens=200)
    assert sorted(i for b in batches for i in b) == list(range(300))
    for batch in batches:
        assert len(batch) * (max(lengths[i] for i in batch) + 1) <= 200
    # sorted by length: batches hold similar lengths (longest first)
    firsts = [lengths[b[0]] for b in batches]
    assert firsts == sorted(firsts, reverse=True)
    # a sentence longer than max_tokens still gets a batch of its own
    assert token_batches([500, 3], max_tokens=100) == [[0], [1]]
    assert token_batches([], max_tokens=100) == []


def test_search_settings_reject_bad_values() -> None:
    with pytest.raises(ConfigError, match="--nbest must be between 1 and --beam=4"):
        SearchSettings(nbest=5)
    with pytest.raises(ConfigError, match="--beam must be >= 1"):
        SearchSettings(beam=0)


def test_batching_restores_input_order_and_round_trips_text(
    assets: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a search that copies its source, the output must equal the input, line for line."""
    seen_batches: list[torch.Tensor] = []

    def copy_search(model, src, *, bos_id, eos_id, pad_id, **kwargs):  # noqa: ANN001
        seen_batches.append(src)
        assert kwargs["beam_size"] == 4 and kwargs["alpha"] == 0.6 and kwargs["max_len_b"] == 50
        out = []
        for row in src.tolist():
            tokens = [t for t in row if t not in (pad_id, eos_id)]
            assert row[len(tokens)] == eos_id  # the encoder input is "x EOS", then padding
            out.append([Hypothesis(tokens=tokens, score=-1.0, log_prob=-1.0)])
        return out

    monkeypatch.setattr(translation, "beam_search", copy_search)
    lines = _sentences(120, seed=5)
    lines[7] = ""  # an empty line is passed through without the model
    lines[8] = "Unbekannte Wörter: Äpfel & Birnen!"  # byte fallback keeps unseen characters
    # device cpu: the CPU's parallel batches (a GPU decodes one batch at a time)
    translator = Translator(assets["model"], assets["spm"], SearchSettings(max_tokens=64), "cpu")
    done: list[int] = []
    results = translator.translate_nbest(lines, progress=done.append)
    assert [r[0][0] for r in results] == lines
    assert sum(done) == len(lines)
    assert len(seen_batches) > 5
    for src in seen_batches:
        assert src.numel() <= 64 or src.shape[0] == 1
    assert sum(src.shape[0] for src in seen_batches) == len(lines) - 1


@pytest.mark.parametrize("switch", ["on", "off"])
def test_batches_run_two_at_a_time_on_one_thread_each_with_two_threads(
    assets: dict[str, Path], monkeypatch: pytest.MonkeyPatch, two_torch_threads, switch: str
) -> None:
    """Fast path ``parallel_batches``: with 2 torch threads on a CPU, batches are searched by two
    workers on one thread each (off: one at a time, on both threads, in the caller's thread);
    either way every line comes back in order, and the thread count is restored."""
    monkeypatch.setenv(fast_paths.ENV, switch)
    seen: list[tuple[int, int]] = []  # (thread, torch threads) per batch

    def copy_search(model, src, *, bos_id, eos_id, pad_id, **kwargs):  # noqa: ANN001
        seen.append((threading.get_ident(), torch.get_num_threads()))
        rows = [[t for t in row if t not in (pad_id, eos_id)] for row in src.tolist()]
        return [[Hypothesis(tokens=r, score=-1.0, log_prob=-1.0)] for r in rows]

    monkeypatch.setattr(translation, "beam_search", copy_search)
    lines = _sentences(120, seed=6)
    # device cpu: the CPU's parallel batches (a GPU decodes one batch at a time)
    translator = Translator(assets["model"], assets["spm"], SearchSettings(max_tokens=64), "cpu")
    done: list[int] = []
    assert [r[0][0] for r in translator.translate_nbest(lines, progress=done.append)] == lines
    assert sum(done) == len(lines) and len(seen) > 5
    assert torch.get_num_threads() == 2
    caller = threading.get_ident()
    if switch == "on":
        assert {n for _, n in seen} == {1} and caller not in {t for t, _ in seen}
    else:
        assert seen == [(caller, 2)] * len(seen)


def test_real_model_parallel_batches_equal_one_batch_at_a_time(
    assets: dict[str, Path], monkeypatch: pytest.MonkeyPatch, two_torch_threads
) -> None:
    lines = _sentences(24, seed=10)
    settings = SearchSettings(max_tokens=48, beam=3, max_len_b=8)  # short: a random model
    outputs = []
    for switch in ("on", "off"):
        monkeypatch.setenv(fast_paths.ENV, switch)
        outputs.append(
            Translator(assets["model"], assets["spm"], settings, "cpu").translate_nbest(lines)
        )
    (parallel, one_at_a_time) = outputs
    assert [r[0][0] for r in parallel] == [r[0][0] for r in one_at_a_time]
    for a, b in zip(parallel, one_at_a_time, strict=True):
        assert a[0][1] == pytest.approx(b[0][1], abs=1e-4)


def test_real_model_batched_equals_one_by_one(assets: dict[str, Path]) -> None:
    lines = _sentences(8, seed=9)
    short = {"beam": 3, "max_len_b": 8}  # a random model never ends: keep its outputs short
    batched = Translator(assets["model"], assets["spm"], SearchSettings(max_tokens=4096, **short))
    single = Translator(assets["model"], assets["spm"], SearchSettings(max_tokens=1, **short))
    out_batched = batched.translate_nbest(lines)
    out_single = single.translate_nbest(lines)
    assert [r[0][0] for r in out_batched] == [r[0][0] for r in out_single]
    for a, b in zip(out_batched, out_single, strict=True):
        assert a[0][1] == pytest.approx(b[0][1], abs=1e-4)


def test_nbest_output_format(assets: dict[str, Path]) -> None:
    lines = ["ein mann läuft", "eine frau"]
    settings = SearchSettings(beam=4, nbest=3, max_len_b=8)
    translator = Translator(assets["model"], assets["spm"], settings)
    results = translator.translate_nbest(lines)
    assert translator.translate(lines) == [hyps[0][0] for hyps in results]
    out = list(format_output(results, 3))
    assert len(out) == 6
    for k, line in enumerate(out):
        index, _text, score = line.split(" ||| ")
        assert int(index) == k // 3
        assert float(score) <= 0.0
    for hyps in results:
        scores = [s for _, s in hyps]
        assert scores == sorted(scores, reverse=True)


def test_cli_file_to_file_and_vocab_mismatch(assets: dict[str, Path], tmp_path: Path) -> None:
    src = tmp_path / "test.en"
    src.write_text("ein mann läuft\n\nim park\n", encoding="utf-8")
    hyp = tmp_path / "out" / "test.hyp"
    common = ["translate", "--model", str(assets["model"]), "--input", str(src)]
    args = [*common, "--spm-model", str(assets["spm"]), "--output", str(hyp), "--beam", "2"]
    assert main(args) == 0
    out = hyp.read_text(encoding="utf-8").split("\n")
    assert len(out) == 4 and out[3] == "" and out[1] == ""  # 3 lines, the empty one kept

    bad = tmp_path / "bad.hyp"
    assert main([*common, "--spm-model", str(assets["other_spm"]), "--output", str(bad)]) == 2
    assert not bad.exists()
    with pytest.raises(CheckpointError, match="trained with another vocabulary"):
        Translator(assets["model"], assets["other_spm"], SearchSettings())


def test_cli_translates_stdin_to_stdout(assets: dict[str, Path]) -> None:
    cmd = [sys.executable, "-m", "transformer_nmt", "translate", "--model", str(assets["model"]),
           "--spm-model", str(assets["spm"]), "--beam", "2", "--max-len-b", "5"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        cmd, input="ein hund\nspielt im park\n", capture_output=True, text=True, timeout=120,
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2
    expected = Translator(assets["model"], assets["spm"], SearchSettings(beam=2, max_len_b=5))
    assert result.stdout.splitlines() == expected.translate(["ein hund", "spielt im park"])


def test_progress_logs_without_a_terminal(caplog: pytest.LogCaptureFixture) -> None:
    class NotATty:
        def isatty(self) -> bool:
            return False

        def write(self, text: str) -> int:
            raise AssertionError("no progress bar may be drawn into a log file")

    progress = Progress(100, "translate test", stream=NotATty())  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="transformer_nmt.progress"):
        for _ in range(20):
            progress(5)
        progress.close()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 10
    assert messages[-1].startswith("translate test: 100/100 sentences (100%)")


def test_learned_positions_truncate_long_sources(assets: dict[str, Path], tmp_path: Path) -> None:
    vocab = load_vocab_info(assets["spm"])
    cfg = ModelConfig(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, p_drop=0.0,
                      positional="learned", max_positions=20)  # fmt: skip
    path = tmp_path / "learned.pt"
    model = Transformer(cfg, vocab_size=vocab.size, pad_id=PAD_ID)
    save_model_file(path, model_config=cfg.to_dict(), state_dict=model.state_dict(),
                    vocab=vocab.to_dict(), step=1, source_checkpoints=[])  # fmt: skip
    translator = Translator(path, assets["spm"], SearchSettings(max_len_b=5, beam=2))
    assert translator.max_src_tokens == 13
    long_line = " ".join(WORDS * 3)
    (out,) = translator.translate([long_line])
    assert translator.truncated == 1
    assert isinstance(out, str)
    assert np.all(translator.encode("ein mann") < vocab.size)


def _copy_search(model, src, *, bos_id, eos_id, pad_id, **kwargs):  # noqa: ANN001
    """A search whose hypothesis is its source: the output must equal the input."""
    rows = [[t for t in row if t not in (pad_id, eos_id)] for row in src.tolist()]
    return [[Hypothesis(tokens=r, score=-1.0, log_prob=-1.0)] * kwargs["nbest"] for r in rows]


def _stdin_from(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handle = open(path, encoding="utf-8")  # noqa: SIM115 (closed by the test's teardown)
    monkeypatch.setattr(sys, "stdin", handle)
    monkeypatch.setattr(sys.stdin, "close", handle.close, raising=False)


def test_cli_stdin_keeps_line_alignment_with_unicode_separators(
    assets: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Lines end at "\\n" only: U+2028, form feed, NEL and a lone CR stay inside their line."""
    lines = ["ein mann\u2028läuft", "im\x0cpark", "eine frau\x85spielt", "der hund\rläuft",
             "", "mit einem ball", "auf der straße"]  # fmt: skip
    stdin = tmp_path / "stdin.txt"
    stdin.write_bytes("\n".join(lines[:-1]).encode() + b"\r\n" + lines[-1].encode())
    monkeypatch.setattr(translation, "beam_search", _copy_search)
    _stdin_from(stdin, monkeypatch)
    common = ["translate", "--model", str(assets["model"]), "--spm-model", str(assets["spm"])]
    assert main([*common, "--stdin-batch", "3"]) == 0
    assert capsys.readouterr().out.split("\n") == [*lines, ""]

    _stdin_from(stdin, monkeypatch)  # n-best lines count sentences across stdin batches
    assert main([*common, "--stdin-batch", "2", "--nbest", "2"]) == 0
    out = capsys.readouterr().out.split("\n")[:-1]
    assert [line.split(" ||| ")[:2] for line in out] == [
        [str(i), text] for i, text in enumerate(lines) for _ in range(2 if text else 1)
    ]  # an empty line has one (empty) hypothesis


def test_cli_stdin_invalid_utf8_names_the_line(
    assets: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    stdin = tmp_path / "stdin.txt"
    stdin.write_bytes(b"ein mann\nim park \xff\xfe\n")
    _stdin_from(stdin, monkeypatch)
    args = ["translate", "--model", str(assets["model"]), "--spm-model", str(assets["spm"])]
    assert main([*args, "--beam", "1", "--max-len-b", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: <stdin>:2: invalid UTF-8") and "Traceback" not in err


def test_cli_stdin_is_translated_as_it_arrives(assets: dict[str, Path]) -> None:
    """A producer that writes one line and waits gets its translation before closing stdin."""
    import threading

    cmd = [sys.executable, "-m", "transformer_nmt", "translate", "--model", str(assets["model"]),
           "--spm-model", str(assets["spm"]), "--beam", "2", "--max-len-b", "5"]  # fmt: skip
    expected = Translator(assets["model"], assets["spm"], SearchSettings(beam=2, max_len_b=5))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None

    def answer(line: str) -> str:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()))
        reader.start()
        reader.join(timeout=120)
        assert got, f"no translation of {line!r} while stdin stayed open"
        return got[0].rstrip("\n")

    try:
        for line in ["ein hund", "spielt im park"]:
            assert answer(line) == expected.translate([line])[0]
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        assert proc.stdout.read() == ""
    finally:
        proc.kill()
        proc.wait()


def _results_layout(assets: dict[str, Path], root: Path) -> Path:
    """A pipeline's results/ tree: two pairs' SentencePiece models, one finished run."""
    import shutil

    for pair, spm in (("en-de", assets["spm"]), ("en-fr", assets["other_spm"])):
        (root / "spm" / "multi30k" / pair).mkdir(parents=True)
        shutil.copy(spm, root / "spm" / "multi30k" / pair / "spm.model")
    run_dir = root / "runs" / "tiny"
    run_dir.mkdir(parents=True)
    shutil.copy(assets["model"], run_dir / "averaged.pt")
    summary = {"vocab": load_vocab_info(assets["spm"]).to_dict(), "final_step": 10}
    (run_dir / "train_summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return run_dir


def test_python_api_from_run_translates_to_strings(assets: dict[str, Path], tmp_path: Path) -> None:
    from transformer_nmt import Translator as PublicTranslator

    assert PublicTranslator is Translator
    run_dir = _results_layout(assets, tmp_path / "results")
    t = Translator.from_run(run_dir)
    assert t.settings == SearchSettings() and (t.settings.beam, t.settings.alpha) == (4, 0.6)
    assert translation.find_spm_model(run_dir) == tmp_path / "results/spm/multi30k/en-de/spm.model"
    out = t.translate(["ein mann läuft", "", "im park"])
    reference = Translator(assets["model"], assets["spm"], SearchSettings())
    assert out == reference.translate(["ein mann läuft", "", "im park"])
    assert all(isinstance(text, str) for text in out) and out[1] == ""


def test_python_api_from_run_errors_name_the_file(assets: dict[str, Path], tmp_path: Path) -> None:
    run_dir = _results_layout(assets, tmp_path / "results")
    (tmp_path / "results/spm/multi30k/en-de/spm.model").unlink()
    with pytest.raises(CheckpointError, match="train_summary.json: no SentencePiece model"):
        Translator.from_run(run_dir)
    (run_dir / "train_summary.json").unlink()  # the one model left is tried, and rejected
    with pytest.raises(CheckpointError, match="trained with another vocabulary"):
        Translator.from_run(run_dir)
    (run_dir / "averaged.pt").unlink()
    with pytest.raises(CheckpointError, match="averaged.pt: not found"):
        Translator.from_run(run_dir, spm_model=assets["spm"])


def test_word_index_and_hard_alignment_on_a_hand_made_matrix() -> None:
    assert output.word_index(["▁ein", "▁Ma", "nn", "▁läuft"]) == [0, 1, 1, 2]
    assert output.word_index(["ab", "c", "▁d"]) == [0, 0, 1]  # first piece: word 0
    # source "ein Mann läuft" = ▁ein ▁Ma nn ▁läuft </s>; target "a man runs" = ▁a ▁m an ▁runs
    weights = np.full((2, 5, 5), 0.05, dtype=np.float32)  # [h, T, S]
    for t, s in [(0, 0), (1, 2), (2, 1), (3, 3), (4, 4)]:  # the EOS row attends to </s>
        weights[:, t, s] = 0.8
    weights[1, 3, 3], weights[1, 3, 4] = 0.0, 0.85  # ▁runs: most on </s>, which is left out
    record = output.SentenceAttention(
        source="ein Mann läuft", translation="a man runs",
        src_tokens=["▁ein", "▁Ma", "nn", "▁läuft", "</s>"],
        tgt_tokens=["▁a", "▁m", "an", "▁runs", "</s>"], weights=weights,
    )  # fmt: skip
    np.testing.assert_allclose(record.averaged, weights.mean(axis=0))
    # ▁m -> nn and an -> ▁Ma: both subwords of "Mann" (word 1) to "man" (word 1)
    assert record.alignment() == [(0, 0), (1, 1), (2, 2)]
    assert record.pharaoh() == "0-0 1-1 2-2"
    data = json.loads(record.to_json())
    assert data["alignment"] == "0-0 1-1 2-2" and data["tgt_tokens"][-1] == "</s>"
    assert np.asarray(data["attention"]).shape == (5, 5)
    assert list(output.format_attention([record], "alignment")) == ["a man runs ||| 0-0 1-1 2-2"]
    empty = output.SentenceAttention("", "", [], [], np.zeros((2, 0, 0), np.float32))
    assert empty.pharaoh() == "" and json.loads(empty.to_json())["attention"] == []


def test_translate_with_attention_equals_search_attention(assets: dict[str, Path]) -> None:
    from transformer_nmt.data.batch import source_batch
    from transformer_nmt.search import beam_search

    lines = ["ein mann läuft im park", "", "eine frau spielt mit einem ball", "hund"]
    settings = SearchSettings(beam=3, max_len_b=6)
    translator = Translator(assets["model"], assets["spm"], settings)
    records = translator.translate_with_attention(lines)
    assert [r.translation for r in records] == translator.translate(lines)
    assert records[1].src_tokens == [] and records[1].pharaoh() == ""
    for line, record in zip(lines, records, strict=True):
        if not line:
            continue
        ids = translator.encode(line)
        assert record.src_tokens == [translator.sp.id_to_piece(int(i)) for i in ids] + ["</s>"]
        h, rows, cols = record.weights.shape
        assert (h, rows, cols) == (2, len(record.tgt_tokens), len(record.src_tokens))
        np.testing.assert_allclose(record.weights.sum(-1), 1.0, atol=1e-5)
        # teacher forcing on the hypothesis = the attention the search saw step by step
        (hyp,) = beam_search(
            translator.model, source_batch([ids]).to(translator.device), bos_id=2, eos_id=3,
            pad_id=PAD_ID, beam_size=3,
            alpha=settings.alpha, max_len_b=6, return_attention=True,
        )[0]  # fmt: skip
        assert record.tgt_tokens[:-1] == [translator.sp.id_to_piece(t) for t in hyp.tokens]
        np.testing.assert_allclose(record.averaged, hyp.attention.numpy(), atol=1e-5)


def test_cli_print_attention_and_alignment(assets: dict[str, Path], tmp_path: Path) -> None:
    src = tmp_path / "test.de"
    src.write_text("ein mann läuft\n\nim park\n", encoding="utf-8")
    common = ["translate", "--model", str(assets["model"]), "--spm-model", str(assets["spm"]),
              "--input", str(src), "--beam", "2", "--max-len-b", "5"]  # fmt: skip
    plain, attn, align = tmp_path / "plain.hyp", tmp_path / "attn.jsonl", tmp_path / "align.txt"
    assert main([*common, "--output", str(plain)]) == 0
    assert main([*common, "--output", str(attn), "--print-attention"]) == 0
    assert main([*common, "--output", str(align), "--print-alignment"]) == 0
    translations = plain.read_text(encoding="utf-8").splitlines()
    records = [json.loads(x) for x in attn.read_text(encoding="utf-8").splitlines()]
    aligned = align.read_text(encoding="utf-8").splitlines()
    assert len(records) == len(aligned) == 3  # one line per input line, the empty one kept
    assert [r["translation"] for r in records] == translations
    assert [r["source"] for r in records] == ["ein mann läuft", "", "im park"]
    for record, line in zip(records, aligned, strict=True):
        text, pairs = line.split(" ||| ")
        assert text == record["translation"] and pairs == record["alignment"]
        matrix = np.asarray(record["attention"])
        if record["source"]:
            assert matrix.shape == (len(record["tgt_tokens"]), len(record["src_tokens"]))
            np.testing.assert_allclose(matrix.sum(-1), 1.0, atol=1e-3)
        for pair in pairs.split():
            i, j = map(int, pair.split("-"))
            assert 0 <= i < len(record["source"].split())
            assert 0 <= j < len(record["translation"].split())
    bad = tmp_path / "bad.txt"
    assert main([*common, "--output", str(bad), "--print-attention", "--nbest", "2"]) == 2
    assert not bad.exists()


def test_cli_early_stop_reaches_the_search(
    assets: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    search = translation.beam_search

    def recording(*args, **kwargs):
        seen.append(kwargs["early_stop"])
        return search(*args, **kwargs)

    monkeypatch.setattr(translation, "beam_search", recording)
    src = tmp_path / "src.txt"
    src.write_text("ein hund\nspielt im park\n", encoding="utf-8")
    args = ["translate", "--model", str(assets["model"]), "--spm-model", str(assets["spm"]),
            "--input", str(src), "--beam", "2", "--max-len-b", "5"]  # fmt: skip
    for rule in ("best", "exact"):
        seen.clear()
        out = tmp_path / f"{rule}.hyp"
        assert main([*args, "--early-stop", rule, "--output", str(out)]) == 0
        assert seen and set(seen) == {rule}
        expected = Translator(
            assets["model"], assets["spm"], SearchSettings(beam=2, max_len_b=5, early_stop=rule)
        )
        assert read_lines(out) == expected.translate(["ein hund", "spielt im park"])
