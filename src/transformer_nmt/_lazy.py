"""Package attributes loaded on first use (PEP 562): a package whose names pull in PyTorch
(``Transformer``, ``beam_search``, ``Translator``) still imports in milliseconds, so the DAG's
text-only stages (``score``, ``report``) start without torch's ~1.3 s import."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``homes`` maps each lazy name to the module
    (relative to ``package``) that defines it; the first read imports that module and binds
    the name in the package, so later reads do not come back here."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
