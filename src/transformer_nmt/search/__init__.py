"""§6.1 search over a trained ``Transformer``: greedy decoding and batched beam search with the
GNMT length penalty, both on the decoder's key/value cache (``use_cache=False`` recomputes).

The search functions load on first use (``transformer_nmt._lazy``): a stage that only reads
``SearchSettings`` (``score``, ``report``, through ``cli.arguments``) starts without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformer_nmt._lazy import lazy_attributes

# torch-free, and loaded here so that the name is the function: a submodule loaded later would
# otherwise leave the package's ``length_penalty`` bound to the module of that name
from transformer_nmt.search.length_penalty import length_penalty
from transformer_nmt.search.settings import SearchSettings

if TYPE_CHECKING:
    from transformer_nmt.search.beam import Hypothesis, beam_search, beam_search_per_alpha
    from transformer_nmt.search.greedy import greedy_search

__all__ = [
    "Hypothesis",
    "SearchSettings",
    "beam_search",
    "beam_search_per_alpha",
    "greedy_search",
    "length_penalty",
]

__getattr__ = lazy_attributes(
    __name__,
    {
        "Hypothesis": "beam",
        "beam_search": "beam",
        "beam_search_per_alpha": "beam",
        "greedy_search": "greedy",
    },
)
