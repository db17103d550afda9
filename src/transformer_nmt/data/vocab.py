"""Special token ids and the vocabulary identity of a SentencePiece model.

Every SentencePiece model this project trains fixes ``pad=0, unk=1, bos=2, eos=3`` (see
``data/spm.py``), so the model, the loss and the search can use these constants without
reading the model file. ``VocabInfo.sha256`` (of the ``.model`` file) is the vocabulary's
identity: checkpoints record it so that a model is never decoded with another vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.io_utils import sha256_file

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3


@dataclass(frozen=True)
class VocabInfo:
    """Size, special ids and identity (sha256 of the ``.model`` file) of a vocabulary."""

    size: int
    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VocabInfo:
        expected = {"size", "pad_id", "unk_id", "bos_id", "eos_id", "sha256"}
        unknown = sorted(set(d) - expected)
        missing = sorted(expected - set(d))
        if unknown or missing:
            raise ConfigError(f"VocabInfo: unknown keys {unknown}, missing keys {missing}")
        return cls(**d)


def _open_model(path: Path) -> Any:
    """The SentencePiece processor of ``path``; DataError if it is missing or unreadable."""
    import sentencepiece as spm

    # the pipeline trains it in its spm_train stage (``transformer_nmt spm-train``)
    train_it = "run the pipeline's spm_train stage (or transformer_nmt spm-train) to make it"
    if not path.is_file():
        raise DataError(f"{path}: SentencePiece model not found; {train_it}")
    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as err:
        raise DataError(
            f"{path}: not a readable SentencePiece model ({err}); move it aside and {train_it} "
            "again"
        ) from err


def folds_case(spm_model_path: str | Path) -> bool:
    """Whether the SentencePiece model lowercases what it encodes (trained with the data
    setting ``lowercase``, ``data/spm.py``): its output is then scored case-insensitively."""
    processor = _open_model(Path(spm_model_path))
    return bool(processor.normalize("A") == processor.normalize("a"))


def load_vocab_info(spm_model_path: str | Path) -> VocabInfo:
    """Size, special ids and sha256 of a SentencePiece model; DataError unless ids are fixed."""
    path = Path(spm_model_path)
    processor = _open_model(path)
    info = VocabInfo(
        size=int(processor.get_piece_size()),
        pad_id=int(processor.pad_id()),
        unk_id=int(processor.unk_id()),
        bos_id=int(processor.bos_id()),
        eos_id=int(processor.eos_id()),
        sha256=sha256_file(path),
    )
    fixed = {"pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
    wrong = {k: getattr(info, k) for k, v in fixed.items() if getattr(info, k) != v}
    if wrong:
        raise DataError(f"{path}: special ids {wrong} differ from the fixed ids {fixed}")
    return info
