"""What the benchmarks share without importing the checkout: the process set up as the stages
set theirs, and the machine a figure was measured on. Imports nothing from the checkout at
import time and touches no ``sys.path``: ``bench_ab.py`` runs the timing scripts against
another source tree through ``PYTHONPATH``."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def allocator_as_in_the_stages() -> str:
    """The process's allocator set as the train and translate stages set theirs
    (``cpu_memory.keep_freed_memory``), so a benchmark of their code measures what they run;
    a source tree from before that module (``bench_ab.py``'s side A) keeps the default."""
    try:
        from transformer_nmt.cpu_memory import keep_freed_memory
    except ImportError:
        return "the default allocator (a source tree without cpu_memory)"
    return keep_freed_memory()


def machine() -> dict[str, Any]:
    """The CPU model, its flags that decide our CPU paths, the cores this process may use and
    the checkout's commit: what a benchmark's JSON records beside its figures."""
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text(encoding="utf-8") if cpuinfo.is_file() else ""
    model = re.search(r"model name\s*:\s*(.*)", text)
    flags = re.search(r"flags\s*:\s*(.*)", text)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpu": model.group(1) if model else platform.processor(),
        "flags": sorted(set(flags.group(1).split() if flags else ()) & {
            "avx2", "avx512f", "avx512_bf16", "amx_bf16"}),
        "cores": len(os.sched_getaffinity(0)),
        "commit": commit,
    }  # fmt: skip
