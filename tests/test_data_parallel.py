"""data/parallel.py: the ordered map the data stages share (prepare, encode)."""

from __future__ import annotations

from itertools import count

import pytest

from transformer_nmt.data.parallel import ordered_map


@pytest.mark.parametrize("workers", [1, 2])
def test_results_come_in_the_jobs_order_and_jobs_are_read_lazily(workers):
    read = count()

    def jobs():
        for i in range(50):
            next(read)
            yield -i

    with ordered_map(workers) as run:
        results = run(abs, jobs())
        assert next(results) == 0
        # the first result waits for at most 2 * workers jobs in flight, not the whole input
        assert next(read) <= 2 * max(workers, 1) + 1
        assert list(results) == list(range(1, 50))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_job_raises_in_the_caller(workers):
    with ordered_map(workers) as run, pytest.raises(ValueError, match="invalid literal"):
        list(run(int, ["1", "2", "three", "4"]))
