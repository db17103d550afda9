"""The Python translation API's former home, kept for users' scripts.

``transformer_nmt.translation`` was the documented module of ``Translator`` before the inference
wing (docs/design.md, 2026-11-25). New code imports from ``transformer_nmt.inference`` (or
``from transformer_nmt import Translator``). Like the wing, this imports no Lightning and no
training code."""

from transformer_nmt.inference.engine import TranslationEngine, token_batches
from transformer_nmt.inference.factory import ENGINES, open_translator
from transformer_nmt.inference.output import (
    ATTENTION_FORMATS,
    SentenceAttention,
    format_attention,
    format_output,
    word_index,
)
from transformer_nmt.inference.translator import (
    QUANTIZE,
    Translator,
    find_spm_model,
    quantize_model,
)

__all__ = [
    "ATTENTION_FORMATS",
    "ENGINES",
    "QUANTIZE",
    "SentenceAttention",
    "TranslationEngine",
    "Translator",
    "find_spm_model",
    "format_attention",
    "format_output",
    "open_translator",
    "quantize_model",
    "token_batches",
    "word_index",
]

# Names this module imported from the search before the inference wing (``from
# transformer_nmt.translation import beam_search`` worked): still given, with a FutureWarning.
_FROM_SEARCH = ("Hypothesis", "SearchSettings", "beam_search")


def __getattr__(name: str):
    if name not in _FROM_SEARCH:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import warnings

    from transformer_nmt import search

    warnings.warn(
        f"transformer_nmt.translation.{name} is transformer_nmt.search.{name} (CHANGELOG.md); "
        "this alias will be removed",
        FutureWarning,
        stacklevel=2,
    )
    return getattr(search, name)
