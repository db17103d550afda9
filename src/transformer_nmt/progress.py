"""Progress of long work where people look: a tqdm bar on a terminal, log lines in log files.

Snakemake sends each job's stderr to a log file, where a tqdm bar is an unreadable stream of
carriage returns: without a terminal, a log line every ~10% of the total (or every
``report_every`` units when the total is unknown), and at least every ``every_s`` seconds when
that is set, says how far the work is, how fast, and (known total) the time left.
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
    where a bar would go (default: stderr at the time of the call). ``initial``: units already
    done before this run (a resumed download): counted in the position, not in the speed.
    ``every_s``: also a line when this many seconds passed since the last one (slow downloads).
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
        initial: int = 0,
        every_s: float | None = None,
    ) -> None:
        from tqdm import tqdm

        self.total, self.desc, self.unit, self.scale = total, desc, unit, scale
        self.report_every, self.every_s = report_every, every_s
        self.done = self.initial = initial
        self.started = self.last_report = time.monotonic()
        # fraction of the total (or count) at which a line is due
        self.next_report = (math.floor(initial / total * 10) + 1) / 10 if total else 0.1
        if total is None:
            self.next_report = float(report_every or 0) or math.inf
        stream = stream if stream is not None else sys.stderr
        self.bar = (
            tqdm(total=total, desc=desc, unit=unit, file=stream, leave=False, initial=initial)
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
            elif self.every_s is not None and time.monotonic() - self.last_report >= self.every_s:
                self._report()
        elif self.done >= self.next_report:
            self._report()
            self.next_report = (self.done // self.report_every + 1) * self.report_every
        elif self.every_s is not None and time.monotonic() - self.last_report >= self.every_s:
            self._report()

    def _report(self) -> None:
        self.last_report = now = time.monotonic()
        per_s = (self.done - self.initial) / max(now - self.started, 1e-9)
        rate = per_s / self.scale
        done = self._format(self.done)
        if self.total:
            left = self.total - self.done
            eta = _duration(left / per_s) if per_s > 0 else "unknown"
            log.info(
                "%s: %s/%s %s (%.0f%%), %.1f %s/s, ETA %s",
                self.desc, done, self._format(self.total), self.unit,
                100 * self.done / self.total, rate, self.unit, eta,
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


def _duration(seconds: float) -> str:
    """``H:MM:SS`` (hours unbounded)."""
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
