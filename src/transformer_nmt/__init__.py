"""transformer_nmt: a reproducible pipeline for "Attention Is All You Need" (Vaswani et al.).

The Python API in three lines::

    from transformer_nmt import Translator
    translator = Translator.from_run("results/runs/multi30k_en_de_tiny")
    translator.translate(["A man rides a bike."])  # -> one German str per sentence

``Translator`` imports lazily (it pulls in PyTorch), so ``import transformer_nmt`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformer_nmt._lazy import lazy_attributes

__version__ = "0.2.0"
__all__ = ["Translator", "__version__"]

if TYPE_CHECKING:
    from transformer_nmt.inference.translator import Translator

__getattr__ = lazy_attributes(__name__, {"Translator": "inference.translator"})
