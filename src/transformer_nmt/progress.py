"""Progress of long work where people look: a tqdm bar on a terminal, log lines in log files.

Snakemake sends each job's stderr to a log file, where a tqdm bar is an unreadable stream of
carriage returns: without a terminal, a log line every ~10% of the total (or every
``report_every`` units when the total is unknown) says how far the work is and how fast.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import TextIO

log = logging.getLogger(__name__)


class Progress:
    """``progress(n)`` after each piece of work of ``n`` units; ``close()`` at the end.

    ``scale`` divides the counts for display (1e6 with ``unit="MB"`` for bytes). ``stream``:
    where a bar would go (default: stderr at the time of the call).
    """

    def __init__(
        self,
        total: int | None,
        desc: str,
        *,
        unit: str = "sentences",
        scale: float = 1.0,
        report_every: int | None = None,
        stream: TextIO | None = None,
    ) -> None:
        from tqdm import tqdm

        self.total, self.desc, self.unit, self.scale = total, desc, unit, scale
        self.report_every = report_every
        self.done = 0
        self.started = time.monotonic()
        self.next_report = 0.1  # fraction of the total (or count) at which a line is due
        if total is None:
            self.next_report = float(report_every or 0) or math.inf
        stream = stream if stream is not None else sys.stderr
        self.bar = (
            tqdm(total=total, desc=desc, unit=unit, file=stream, leave=False)
            if _isatty(stream)
            else None
        )

    def __call__(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        if self.total:
            if self.done / self.total >= self.next_report:
                self._report()
                self.next_report = (math.floor(self.done / self.total * 10) + 1) / 10
        elif self.done >= self.next_report:
            self._report()
            self.next_report = (self.done // self.report_every + 1) * self.report_every

    def _report(self) -> None:
        rate = self.done / self.scale / max(time.monotonic() - self.started, 1e-9)
        done = self._format(self.done)
        if self.total:
            log.info(
                "%s: %s/%s %s (%.0f%%), %.1f %s/s",
                self.desc, done, self._format(self.total), self.unit,
                100 * self.done / self.total, rate, self.unit,
            )  # fmt: skip
        else:
            log.info("%s: %s %s, %.1f %s/s", self.desc, done, self.unit, rate, self.unit)

    def _format(self, count: int) -> str:
        return str(count) if self.scale == 1.0 else f"{count / self.scale:.1f}"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
