"""Joint SentencePiece BPE model of a language pair (§5.1: "shared source-target vocabulary").

Trained on a capped random sample of the source+target training lines: the sample is drawn by
line index with ``numpy.random.default_rng(seed)`` (two passes over the files, so memory holds
only the sample), hence deterministic given the seed. Special ids are fixed:
``pad=0, unk=1, bos=2, eos=3`` (``data/vocab.py``).

Normalisation: ``identity`` with ``remove_extra_whitespaces=False`` and ``byte_fallback=True``.
SentencePiece's default (NFKC, collapsing spaces) would change characters of the references
(e.g. "…" -> "..."), so detokenised output could never match them exactly. With these settings
``decode(encode(x)) == x`` for every line x, including characters never seen in training (they
are spelled as UTF-8 byte pieces instead of becoming UNK). The tests check this exactly.

``lowercase=True`` (the data setting ``lowercase``, a departure: the Multi30k literature trains
and scores lowercased text) adds one rule to that identity: every character maps to its
``str.lower()``. SentencePiece compiles the rule table (``case_fold_rules``) into the model, so
the model lowercases every text it encodes (training data, dev and test sources, a user's
input) and ``decode(encode(x)) == lower_each_char(x)``: ``str.lower()`` less its one context rule
(Greek final sigma). Such a model's output is scored case-insensitively (``vocab.folds_case``).

Outputs ``{prefix}.model``, ``{prefix}.vocab`` and ``{prefix}.json`` (the ids and settings),
each written atomically, the ``.model`` last. The model is trained in memory and stored
without the thread count or a temporary path, so the same inputs and seed give a byte-identical
model on any machine (its sha256 is the vocabulary's identity).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from transformer_nmt.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, load_vocab_info
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.io_utils import atomic_open, write_json

log = logging.getLogger(__name__)


def _count_lines(path: Path) -> int:
    if not path.is_file():
        raise DataError(f"{path}: SentencePiece training input not found")
    n = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            n += chunk.count(b"\n")
    return n


def sample_line_ids(counts: Sequence[int], sample_sentences: int, seed: int) -> np.ndarray:
    """Sorted global line ids (over the concatenated inputs) of a seeded sample without
    replacement; every line when ``sample_sentences`` >= the total."""
    total = int(sum(counts))
    if sample_sentences >= total:
        return np.arange(total, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(total, size=sample_sentences, replace=False)).astype(np.int64)


def _sampled_lines(paths: Sequence[Path], chosen: np.ndarray) -> Iterator[str]:
    """Stream the chosen lines (global ids, sorted) of the concatenated files."""
    chosen_list = chosen.tolist()
    k, base = 0, 0
    for path in paths:
        with open(path, encoding="utf-8", newline="\n") as handle:
            for i, line in enumerate(handle, base):
                if k == len(chosen_list):
                    return
                if chosen_list[k] == i:
                    k += 1
                    yield line.removesuffix("\n")
                base = i + 1


def _without_machine_details(proto: bytes) -> bytes:
    """The model without ``trainer_spec.num_threads`` and the path of the lowercase rule table
    (``normalizer_spec.normalization_rule_tsv``, a temporary file; the rules themselves are
    compiled into the model): neither changes the model, and neither may change the
    vocabulary's identity (its sha256)."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(proto)
    model.trainer_spec.ClearField("num_threads")
    model.normalizer_spec.ClearField("normalization_rule_tsv")
    return model.SerializeToString(deterministic=True)


def lower_each_char(text: str) -> str:
    """``text`` with each character lowercased on its own: ``str.lower()`` less its one context
    rule (Greek final sigma), which is what a ``lowercase`` model's normaliser does."""
    return "".join(ch.lower() for ch in text)


def case_fold_rules() -> str:
    """SentencePiece's normalisation rule table (TSV: source code point, tab, target code
    points, in hex) mapping each character whose ``str.lower()`` differs to that lowercase."""
    rows = []
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:  # surrogates are not characters
            continue
        lower = chr(code).lower()
        if lower != chr(code):
            rows.append(f"{code:04X}\t" + " ".join(f"{ord(c):04X}" for c in lower))
    return "\n".join(rows) + "\n"


def train_spm(
    inputs: Sequence[str | Path],
    model_prefix: str | Path,
    *,
    vocab_size: int,
    sample_sentences: int,
    seed: int,
    num_threads: int | None = None,
    character_coverage: float = 0.9999,
    lowercase: bool = False,
) -> dict[str, Any]:
    """Train the joint BPE model; returns the recorded settings (also in ``{prefix}.json``)."""
    import sentencepiece as spm

    paths = [Path(p) for p in inputs]
    if vocab_size <= 4:
        raise ConfigError(f"--vocab-size must exceed the 4 special ids, got {vocab_size}")
    if sample_sentences <= 0:
        raise ConfigError(f"--sample-sentences must be positive, got {sample_sentences}")
    counts = [_count_lines(p) for p in paths]
    chosen = sample_line_ids(counts, sample_sentences, seed)
    prefix = Path(model_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    threads = num_threads or len(os.sched_getaffinity(0))
    settings: dict[str, Any] = {
        "model_type": "bpe",
        "vocab_size": vocab_size,
        "pad_id": PAD_ID,
        "unk_id": UNK_ID,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "normalization_rule_name": "identity",
        "lowercase": lowercase,
        "remove_extra_whitespaces": False,
        "byte_fallback": True,
        "character_coverage": character_coverage,
        "seed": seed,
        "sample_sentences": sample_sentences,
        "sampled_lines": len(chosen),
        "input_lines": dict(zip(map(str, paths), counts, strict=True)),
    }
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()  # trained in memory: no temporary path ends up inside the model
    # the identity, or the identity plus lowercasing: a rule table that SentencePiece compiles
    # into the model (its precompiled_charsmap), so that the model carries it wherever it goes
    normaliser: dict[str, str] = {"normalization_rule_name": "identity"}
    with tempfile.TemporaryDirectory(prefix=".spm-", dir=prefix.parent) as tmp:
        if lowercase:
            table = Path(tmp) / "lowercase.tsv"
            table.write_text(case_fold_rules(), encoding="utf-8")
            normaliser = {"normalization_rule_tsv": str(table)}
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=_sampled_lines(paths, chosen),
                model_writer=model,
                model_type="bpe",
                vocab_size=vocab_size,
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                **normaliser,
                remove_extra_whitespaces=False,
                byte_fallback=True,
                character_coverage=character_coverage,
                input_sentence_size=0,  # already sampled above
                shuffle_input_sentence=False,
                num_threads=threads,
                minloglevel=1,
            )
        except RuntimeError as err:
            raise DataError(
                f"SentencePiece training on {[str(p) for p in paths]} failed "
                f"(--vocab-size {vocab_size}): {err}"
            ) from err
    proto = _without_machine_details(model.getvalue())
    processor = spm.SentencePieceProcessor(model_proto=proto)
    settings["sha256"] = hashlib.sha256(proto).hexdigest()
    model_path = prefix.with_suffix(".model")
    with atomic_open(prefix.with_suffix(".vocab")) as vocab:  # same layout as spm's .vocab
        for i in range(processor.get_piece_size()):
            vocab.write(f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n")
    write_json(prefix.with_suffix(".json"), settings)
    with atomic_open(model_path, "wb") as handle:  # the .model (the stage's output) last
        handle.write(proto)
    load_vocab_info(model_path)  # checks the fixed special ids
    log.info("%s.model: %d pieces from %d sampled lines", prefix, vocab_size, len(chosen))
    return settings
