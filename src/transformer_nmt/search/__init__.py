"""§6.1 search over a trained ``Transformer``: greedy decoding and batched beam search with the
GNMT length penalty, both on the decoder's key/value cache (``use_cache=False`` recomputes)."""

from transformer_nmt.search.beam import Hypothesis, beam_search, beam_search_per_alpha
from transformer_nmt.search.greedy import greedy_search
from transformer_nmt.search.length_penalty import length_penalty
from transformer_nmt.search.settings import SearchSettings

__all__ = [
    "Hypothesis",
    "SearchSettings",
    "beam_search",
    "beam_search_per_alpha",
    "greedy_search",
    "length_penalty",
]
