"""Multi30k from the shared mirror, end to end: download -> prepare -> spm-train -> encode ->
batches, through the stage CLIs. One pipeline run (about 10 s) is shared by the module."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from transformer_nmt.cli import main
from transformer_nmt.data.datamodule import TranslationDataModule
from transformer_nmt.data.encode import encode_files
from transformer_nmt.data.spm import lower_each_char, train_spm
from transformer_nmt.data.token_array import TokenArray, array_paths
from transformer_nmt.data.vocab import folds_case, load_vocab_info
from transformer_nmt.errors import DataError

REGISTRY = Path(__file__).resolve().parents[1] / "config" / "datasets.yaml"
SPLITS = {"train": 29_000, "valid": 1_014, "test_2016_flickr": 1_000, "test_2017_flickr": 1_000}


@pytest.fixture(scope="module")
def pipeline(shared_mirror, tmp_path_factory):
    root = tmp_path_factory.mktemp("m30k")
    raw, data, spm_dir, bin_dir = (root / d for d in ("raw", "data", "spm", "bin"))
    common = ["--registry", str(REGISTRY), "--dataset", "multi30k"]
    assert main(["download", *common, "--out-dir", str(raw), "--mirror", str(shared_mirror)]) == 0
    prep = ["prepare", *common, "--pair", "en-de", "--raw-dir", str(raw), "--out-dir", str(data)]
    assert main(prep) == 0
    assert main([*prep[:-1], str(root / "data_nodedupe"), "--clean", '{"dedupe": false}']) == 0
    assert (
        main(
            ["spm-train", "--inputs", str(data / "train.en"), str(data / "train.de")]
            + ["--vocab-size", "8000", "--sample-sentences", "2000000", "--seed", "1"]
            + ["--model-prefix", str(spm_dir / "spm")]
        )
        == 0
    )
    texts = sorted(str(p) for p in data.iterdir() if p.suffix in (".en", ".de"))
    enc = ["encode", "--spm-model", str(spm_dir / "spm.model"), "--inputs", *texts]
    assert main([*enc, "--out-dir", str(bin_dir), "--workers", "2"]) == 0
    return root


def _lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="\n") as handle:
        return [line.removesuffix("\n") for line in handle]


def test_line_counts_match_the_dataset(pipeline):
    report = json.loads((pipeline / "data" / "clean_report.json").read_text())
    for split, n in SPLITS.items():
        assert report["splits"][split]["read"] == n
        for lang in ("en", "de"):
            assert len(_lines(pipeline / "data_nodedupe" / f"{split}.{lang}")) == n
    train = report["splits"]["train"]
    # Multi30k train has no empty or over-long lines; only exact duplicate pairs are removed
    assert train["dropped"]["empty"] == train["dropped"]["too_long"] == 0
    assert train["dropped"]["length_ratio"] == 0
    assert train["kept"] == 29_000 - train["dropped"]["duplicate"]
    assert 0 < train["dropped"]["duplicate"] < 10
    assert len(_lines(pipeline / "data" / "train.de")) == train["kept"]
    for split in ("valid", "test_2016_flickr", "test_2017_flickr"):
        assert report["splits"][split]["kept"] == SPLITS[split]  # never filtered
        assert len(TokenArray(pipeline / "bin" / f"{split}.de")) == SPLITS[split]


def test_spm_model_has_fixed_ids_and_recorded_settings(pipeline):
    info = load_vocab_info(pipeline / "spm" / "spm.model")
    assert (info.size, info.pad_id, info.unk_id, info.bos_id, info.eos_id) == (8000, 0, 1, 2, 3)
    recorded = json.loads((pipeline / "spm" / "spm.json").read_text())
    assert recorded["sha256"] == info.sha256
    assert (recorded["pad_id"], recorded["unk_id"], recorded["bos_id"], recorded["eos_id"]) == (
        0,
        1,
        2,
        3,
    )
    assert recorded["sampled_lines"] == 2 * len(_lines(pipeline / "data" / "train.en"))


def test_every_id_round_trips_to_the_text(pipeline):
    """identity normalisation + byte fallback: decode(ids) == the prepared line, exactly."""
    sp = spm.SentencePieceProcessor(model_file=str(pipeline / "spm" / "spm.model"))
    for split in SPLITS:
        for lang in ("en", "de"):
            arr = TokenArray(pipeline / "bin" / f"{split}.{lang}")
            lines = _lines(pipeline / "data" / f"{split}.{lang}")
            assert arr.tokens.dtype == np.uint16
            assert len(arr) == len(lines)
            assert int(arr.tokens.min()) >= 4  # no pad/unk/bos/eos inside the arrays
            decoded = sp.decode([a.tolist() for a in arr])
            assert decoded == lines, f"{split}.{lang}"


def test_spm_model_is_byte_identical_given_the_seed_whatever_the_threads(pipeline, tmp_path):
    inputs = [pipeline / "data" / "train.en", pipeline / "data" / "train.de"]
    shas = [
        train_spm(
            inputs,
            tmp_path / name,
            vocab_size=1000,
            sample_sentences=5000,
            seed=seed,
            num_threads=threads,
        )["sha256"]
        for name, seed, threads in (("a", 7, 1), ("b", 7, 2), ("c", 8, 2))
    ]
    assert shas[0] == shas[1] != shas[2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{n}.{s}" for n in "abc" for s in ("json", "model", "vocab")
    ]


def test_a_lowercase_vocabulary_lowercases_every_text_it_encodes(pipeline, tmp_path):
    """``lowercase``: the model itself lowercases what it encodes (the Multi30k literature's
    lowercased text), is the model trained on lowercased text, and keeps its identity."""
    inputs = [pipeline / "data" / "train.en", pipeline / "data" / "train.de"]
    common = {"vocab_size": 1000, "sample_sentences": 5000, "seed": 7}
    settings = [train_spm(inputs, tmp_path / n, lowercase=True, **common) for n in ("a", "b")]
    assert settings[0]["lowercase"] is True
    assert settings[0]["sha256"] == settings[1]["sha256"]  # no temporary path inside the model
    lowered = []
    for path in inputs:
        lowered.append(tmp_path / f"lower{path.suffix}")
        lowered[-1].write_text(lower_each_char(path.read_text(encoding="utf-8")), "utf-8")
    on_lowered = train_spm(lowered, tmp_path / "c", **common)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "a.model"))
    sp_lowered = spm.SentencePieceProcessor(model_file=str(tmp_path / "c.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    assert pieces == [sp_lowered.id_to_piece(i) for i in range(sp_lowered.get_piece_size())]
    assert on_lowered["lowercase"] is False
    for lang in ("en", "de"):
        lines = _lines(pipeline / "data" / f"valid.{lang}")
        assert any(line != line.lower() for line in lines)
        assert sp.decode(sp.encode(lines)) == [lower_each_char(line) for line in lines]
        assert sp.encode(lines) == sp_lowered.encode([line.lower() for line in lines])
    assert folds_case(tmp_path / "a.model") and not folds_case(tmp_path / "c.model")
    assert not folds_case(pipeline / "spm" / "spm.model")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".spm-")]  # rules removed


def test_parallel_encoding_equals_serial(pipeline, tmp_path):
    model = pipeline / "spm" / "spm.model"
    encode_files(model, [pipeline / "data" / "valid.de"], tmp_path, workers=1)
    for out, ref in zip(
        array_paths(tmp_path / "valid.de"), array_paths(pipeline / "bin" / "valid.de"), strict=True
    ):
        assert out.read_bytes() == ref.read_bytes()


def test_encode_bad_utf8_names_line_and_leaves_nothing(pipeline, tmp_path):
    good = tmp_path / "in" / "a.en"
    bad = tmp_path / "in" / "b.en"
    good.parent.mkdir()
    good.write_text("fine\n")
    bad.write_bytes(b"ok\nstill ok\n\xc3\x28 broken\n")
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"in/b\.en: line 3: invalid UTF-8"):
        encode_files(pipeline / "spm" / "spm.model", [good, bad], out, workers=2)
    assert list(out.iterdir()) == []


def test_batches_bound_tokens_and_cover_the_epoch(pipeline):
    bin_dir = pipeline / "bin"
    n_train = len(TokenArray(bin_dir / "train.en"))
    dm = TranslationDataModule(bin_dir, "en", "de", max_tokens=2048, seed=1)
    seen = []
    for batch in dm.train_dataloader():
        assert batch["src"].numel() <= 2048 and batch["tgt_in"].numel() <= 2048
        seen += batch["index"].tolist()
    assert len(seen) == n_train and sorted(seen) == list(range(n_train))  # each exactly once
    assert dm.samplers["train"].num_dropped == 0
    valid = [i for b in dm.val_dataloader() for i in b["index"].tolist()]
    assert sorted(valid) == list(range(1014))


def test_two_ranks_see_disjoint_batches_covering_the_epoch(pipeline):
    shares = []
    for rank in (0, 1):
        dm = TranslationDataModule(pipeline / "bin", "en", "de", max_tokens=2048, seed=1)
        sampler = dm.batch_sampler("train", shuffle=True)
        sampler.rank, sampler.world_size = rank, 2
        sampler.set_epoch(3)
        shares.append([tuple(b) for b in sampler])
    n = sampler.num_batches
    assert len(shares[0]) == len(shares[1]) == -(-n // 2)
    repeated = set(shares[0]) & set(shares[1])
    assert len(repeated) == n % 2  # only the padding batch of an odd count repeats
    covered = sorted(i for share in shares for b in set(share) for i in b)
    n_train = len(TokenArray(pipeline / "bin" / "train.en"))
    assert sorted(set(covered)) == list(range(n_train))
    assert len(covered) == n_train + sum(len(b) for b in repeated)


@pytest.mark.parametrize("reader", [folds_case, load_vocab_info])
def test_vocabulary_readers_name_a_missing_or_unreadable_model(reader, tmp_path):
    """Both readers of a SentencePiece model fail with one line that names the file and says
    how to make it."""
    missing = tmp_path / "absent.model"
    not_found = re.escape(f"{missing}: SentencePiece model not found")
    with pytest.raises(DataError, match=not_found) as e:
        reader(missing)
    assert "spm_train stage" in str(e.value) and "\n" not in str(e.value)
    corrupt = tmp_path / "corrupt.model"
    corrupt.write_bytes(b"not a protobuf \xff\xfe")
    unreadable = re.escape(f"{corrupt}: not a readable SentencePiece model")
    with pytest.raises(DataError, match=unreadable) as e:
        reader(corrupt)
    assert "move it aside" in str(e.value) and "\n" not in str(e.value)
    assert corrupt.exists()  # nothing a user made is deleted
