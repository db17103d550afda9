"""Token arrays (streamed .npy writer, memory-mapped reader) and vocabulary constants."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tests.training_helpers import write_token_array
from transformer_nmt.data import vocab
from transformer_nmt.data.token_array import (
    TokenArray,
    TokenArrayWriter,
    array_paths,
    token_dtype,
)
from transformer_nmt.errors import ConfigError, DataError


def test_special_ids_are_fixed():
    assert (vocab.PAD_ID, vocab.UNK_ID, vocab.BOS_ID, vocab.EOS_ID) == (0, 1, 2, 3)


def test_vocab_info_round_trips_and_rejects_unknown_keys():
    info = vocab.VocabInfo(size=8000, pad_id=0, unk_id=1, bos_id=2, eos_id=3, sha256="ab")
    assert vocab.VocabInfo.from_dict(info.to_dict()) == info
    with pytest.raises(ConfigError, match="colour"):
        vocab.VocabInfo.from_dict({**info.to_dict(), "colour": 1})


def test_load_vocab_info_missing_file_names_path(tmp_path):
    with pytest.raises(DataError, match="nope.model"):
        vocab.load_vocab_info(tmp_path / "nope.model")


def test_token_dtype_threshold():
    assert token_dtype(8000) == np.uint16
    assert token_dtype(65536) == np.uint16  # ids 0..65535 fit
    assert token_dtype(65537) == np.uint32


def test_written_array_reads_back_exactly(tmp_path):
    rng = np.random.default_rng(0)
    sents = [rng.integers(0, 8000, size=rng.integers(0, 30)).tolist() for _ in range(257)]
    prefix = tmp_path / "train.en"
    with TokenArrayWriter(prefix, vocab_size=8000) as writer:
        for start in range(0, len(sents), 50):  # several chunks, as the encoder streams them
            writer.write_many(sents[start : start + 50])
    arr = TokenArray(prefix)
    assert len(arr) == 257
    assert [a.tolist() for a in arr] == sents
    assert arr.lengths.tolist() == [len(s) for s in sents]
    tokens = np.load(array_paths(prefix)[0])
    offsets = np.load(array_paths(prefix)[1])
    assert tokens.dtype == np.uint16 and offsets.dtype == np.int64
    assert offsets[0] == 0 and offsets[-1] == len(tokens) == sum(map(len, sents))
    assert arr[-1].tolist() == sents[-1]
    with pytest.raises(IndexError):
        arr[257]


def test_uint32_for_large_vocab_and_empty_array(tmp_path):
    arr = write_token_array(tmp_path / "a", [[70000, 1], []], vocab_size=70001)
    assert arr.tokens.dtype == np.uint32
    assert [a.tolist() for a in arr] == [[70000, 1], []]
    empty = write_token_array(tmp_path / "e", [], vocab_size=10)
    assert len(empty) == 0 and len(empty.tokens) == 0


def test_token_array_pickles_by_path(tmp_path):
    arr = write_token_array(tmp_path / "a", [[5, 6, 7], [8]], vocab_size=10)
    payload = pickle.dumps(arr)
    assert len(payload) < 500  # the memory map is not copied into the pickle
    again = pickle.loads(payload)
    assert [a.tolist() for a in again] == [[5, 6, 7], [8]]


def test_failed_write_leaves_no_files(tmp_path):
    prefix = tmp_path / "train.de"
    with pytest.raises(ValueError, match=r"\[0, 10\)"), TokenArrayWriter(prefix, 10) as writer:
        writer.write_many([[1, 2]])
        writer.write_many([[11]])  # id outside the vocabulary
    assert list(tmp_path.iterdir()) == []


def test_corrupt_offsets_are_a_data_error(tmp_path):
    prefix = tmp_path / "x"
    write_token_array(prefix, [[1, 2, 3]], vocab_size=10)
    np.save(array_paths(prefix)[1], np.array([0, 5], dtype=np.int64))
    with pytest.raises(DataError, match=r"x\.offsets\.npy"):
        TokenArray(prefix)
    array_paths(prefix)[0].unlink()
    with pytest.raises(DataError, match=r"x\.tokens\.npy: token array file not found"):
        TokenArray(prefix)


def test_gather_equals_per_sentence_reads(tmp_path):
    rng = np.random.default_rng(1)
    sents = [rng.integers(0, 500, size=rng.integers(0, 12)).tolist() for _ in range(100)]
    arr = write_token_array(tmp_path / "g", sents, vocab_size=500)
    idx = rng.integers(0, 100, size=40)
    flat, lengths = arr.gather(idx)
    assert lengths.tolist() == [len(sents[i]) for i in idx]
    assert flat.tolist() == [t for i in idx for t in sents[i]]
    empty_flat, empty_lengths = arr.gather([])
    assert len(empty_flat) == 0 and len(empty_lengths) == 0


def test_load_vocab_info_rejects_other_special_ids(tmp_path):
    import sentencepiece as spm

    text = tmp_path / "t.txt"
    text.write_text("".join(f"sentence number {i} with words\n" for i in range(200)))
    # SentencePiece's own defaults: unk=0, bos=1, eos=2, no pad
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(tmp_path / "m"), vocab_size=40, minloglevel=2
    )
    with pytest.raises(DataError, match=r"m\.model: special ids .*'pad_id': -1"):
        vocab.load_vocab_info(tmp_path / "m.model")
