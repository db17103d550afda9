"""The interface every translation engine offers, and the batching they share.

An engine (``translator.Translator``: our PyTorch model and ``search.beam_search``;
``ct2.Ct2Translator``: a CTranslate2 export) supplies three methods:

- ``encode(line)``: one source line as the engine's input tokens (ids or pieces);
- ``search(sources)``: beam search one batch of encoded sources, per sentence its n-best
  ``search.Hypothesis`` list, best first;
- ``decode(tokens)``: target ids back to text;

(an engine that runs several batches at once, CTranslate2 with ``inter_threads``, also overrides
``search_batches``), and ``TranslationEngine`` turns them into ``translate`` /
``translate_nbest`` over lines of text, with one batching rule (``token_batches``), input order
kept and empty lines answered without running the model; ``translate_per_alpha`` translates under
several length penalties α (one search per α, or one for all where the engine can). The engines
import this module; nothing here imports an engine.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from transformer_nmt.search import Hypothesis, SearchSettings


def token_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group sentence indices into batches of similar length with at most ``max_tokens`` tokens.

    A batch of n sentences whose longest has L tokens costs n * (L + 1) (the encoder input is
    ``x EOS``, padded to the longest). Sorting by length (longest first, stable) keeps padding
    small. A sentence longer than ``max_tokens`` gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        width = max(longest, lengths[i] + 1)
        if current and (len(current) + 1) * width > max_tokens:
            batches.append(current)
            current, width = [], lengths[i] + 1
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches


class TranslationEngine(abc.ABC):
    """Lines of text in, translations out, over an engine's ``encode`` / ``search`` /
    ``decode`` (subclasses set ``settings`` and define those three)."""

    settings: SearchSettings

    @abc.abstractmethod
    def encode(self, line: str) -> Any:
        """One source line as the engine's search input."""

    @abc.abstractmethod
    def decode(self, tokens: Sequence[int]) -> str:
        """Target token ids as text."""

    @abc.abstractmethod
    def search(self, sources: Sequence[Any]) -> list[list[Hypothesis]]:
        """The n-best hypotheses of each encoded source (§6.1 beam search)."""

    def search_batches(self, batches: Sequence[Sequence[Any]]) -> Iterator[list[list[Hypothesis]]]:
        """``search`` of each batch, in order (one at a time here)."""
        for sources in batches:
            yield self.search(sources)

    def translate(self, lines: Sequence[str]) -> list[str]:
        """Translate ``lines``: one translation per line (the best hypothesis), in order."""
        return [nbest[0][0] for nbest in self.translate_nbest(lines)]

    def translate_nbest(
        self, lines: Sequence[str], progress: Callable[[int], None] | None = None
    ) -> list[list[tuple[str, float]]]:
        """Translate ``lines``; returns per line its n-best (text, score), best first.

        ``progress(n)`` is called after each batch with the number of sentences it held.
        """
        results: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in lines]
        for i, nbest in self._searched(lines, self.search_batches, progress):
            results[i] = [(self.decode(h.tokens), float(h.score)) for h in nbest]
        return results

    def translate_per_alpha(
        self, lines: Sequence[str], alphas: Sequence[float]
    ) -> dict[float, list[str]]:
        """``translate`` under each length penalty α of ``alphas``, the other search settings
        unchanged: α -> one translation per line. Here one search per α; an engine that scores
        several α in one search overrides it."""
        base = self.settings
        translations: dict[float, list[str]] = {}
        try:
            for alpha in dict.fromkeys(float(a) for a in alphas):
                self.settings = replace(base, alpha=alpha)
                translations[alpha] = self.translate(lines)
        finally:
            self.settings = base
        return translations

    def _searched(
        self,
        lines: Sequence[str],
        search_batches: Callable[[list[list[Any]]], Iterator[list[Any]]],
        progress: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[int, Any]]:
        """(line index, its search result) for every non-empty line of ``lines``, batched by
        ``token_batches`` and searched by ``search_batches``; ``progress`` as in
        ``translate_nbest``."""
        encoded = [self.encode(line) if line.strip() else None for line in lines]
        todo = [i for i, ids in enumerate(encoded) if ids is not None]
        lengths = [len(encoded[i]) for i in todo]
        batches = [
            [todo[j] for j in batch] for batch in token_batches(lengths, self.settings.max_tokens)
        ]
        searched = search_batches([[encoded[i] for i in indices] for indices in batches])
        for indices, results in zip(batches, searched, strict=True):
            yield from zip(indices, results, strict=True)
            if progress is not None:
                progress(len(indices))
        if progress is not None and len(todo) < len(lines):
            progress(len(lines) - len(todo))
