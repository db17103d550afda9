"""What the benchmarks that time the stages' code set up as the stages do. Imports nothing from
the checkout at import time and touches no ``sys.path``: ``bench_ab.py`` runs the timing scripts
against another source tree through ``PYTHONPATH``."""

from __future__ import annotations


def allocator_as_in_the_stages() -> str:
    """The process's allocator set as the train and translate stages set theirs
    (``cpu_memory.keep_freed_memory``), so a benchmark of their code measures what they run;
    a source tree from before that module (``bench_ab.py``'s side A) keeps the default."""
    try:
        from transformer_nmt.cpu_memory import keep_freed_memory
    except ImportError:
        return "the default allocator (a source tree without cpu_memory)"
    return keep_freed_memory()
