"""The data stages' one way to use the cores a rule gives them (``threads:``): an ordered map
over a stream of jobs, in worker processes, with bounded memory.

The parent reads the input and writes the output in order; workers do the per-line work. At
most ``2 * workers`` jobs are in flight (``Pool.imap`` would read the whole input ahead into
its task queue), so memory does not grow with the corpus. With one worker the same functions
run in the calling process: one code path, and the outputs do not depend on ``workers``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

OrderedMap = Callable[[Callable[[Any], Any], Iterable[Any]], Iterator[Any]]


@contextlib.contextmanager
def ordered_map(
    workers: int, initializer: Callable[..., None] | None = None, initargs: tuple = ()
) -> Iterator[OrderedMap]:
    """Yields ``run(fn, jobs)``: ``fn(job)`` for every job, in the jobs' order. ``fn`` and
    ``initializer`` must be module-level functions (worker processes are spawned, not forked:
    the parent may hold threads). An exception in a job is raised from ``run`` in the parent,
    and leaving the block stops the workers."""
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield map
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=initializer, initargs=initargs) as pool:

        def run(fn: Callable[[Any], Any], jobs: Iterable[Any]) -> Iterator[Any]:
            pending: deque = deque()
            for job in jobs:
                pending.append(pool.apply_async(fn, (job,)))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().get()
            while pending:
                yield pending.popleft().get()

        yield run
