"""Freed memory kept for reuse by the process (Linux, glibc): training and decoding on a CPU.

glibc's malloc serves a request above M_MMAP_THRESHOLD (128 KiB at first; it adapts upwards only
as such blocks are freed) with fresh pages from the kernel, and returns the top of its heap to
the kernel beyond M_TRIM_THRESHOLD. A training step allocates and frees tensors of megabytes
hundreds of times, so without more, every step faults in pages it has just given back, and the
kernel zero-fills each one. Here the mmap threshold goes to glibc's 64-bit ceiling (32 MiB), the
heap is never trimmed, and it grows 256 MiB at a time (M_TOP_PAD): freed tensors' memory is
reused in place. The demo's training (fp32, 200 steps) took 41.3 s against 46.1 s, `tiny` in
bf16 76 s against 80 s, for 2.5 % more peak RSS; beam-4 decoding of test_2016 with the demo's
model ran 1.035x (1 thread) and 1.10x (2 threads) in float, 1.005x and 1.04x in int8
(benchmarks/log/2026-11-25.md, night). Only the three together pay: the top pad alone was
slower, the thresholds alone changed nothing. A user's own MALLOC_* settings or a preloaded
allocator (jemalloc, tcmalloc) are left alone. A CPU fast path (``fast_paths``: ``allocator``).

What a heap that is never trimmed costs is memory stranded between the blocks that stay: after
400 updates of the demo (bf16, batches of many widths) glibc's heap held 750 MB in use and 639 MB
free in 3,505 holes, and malloc_trim(0) took the process from 1,478 to 1,227 MB resident. So a
training run also hands the heap's free pages back to the kernel every ``RELEASE_EVERY_STEPS``
updates (``release_freed_memory``, glibc's ``malloc_trim``), which leaves the blocks in use in
place; the next step refaults only what it touches. The demo's whole training (2,400 updates,
bf16, MLflow on) peaked at 1,427 MB releasing every 200 updates and 1,417 MB every 50, against
1,513 MB without (benchmarks/log/2026-11-28.md, "The demo's stranded heap"); no slower in those
runs, while 450-update runs releasing every 50 trained 0.95x as fast (3 interleaved pairs), so the
interval is the longer one.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

from transformer_nmt import fast_paths

# mallopt(3) parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: glibc refuses more
TRIM_THRESHOLD = 2**30  # in practice never: a training process's heap only grows to its peak
TOP_PAD = 256 * 2**20  # the heap grows in steps of this much more than asked
# A training run returns the heap's free pages every this many updates (see the module's doc)
RELEASE_EVERY_STEPS = 200

USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


@functools.lru_cache(maxsize=1)
def _c_library() -> ctypes.CDLL:
    return ctypes.CDLL(None)  # the C library the process runs on


def _not_ours() -> str | None:
    """Why this process's allocator is left as it is (a phrase for the log); None where it is
    glibc's and the allocator fast path is on."""
    if not fast_paths.enabled("allocator"):
        return "glibc malloc as it is (the allocator fast path is off: cpu_fast_paths)"
    if not sys.platform.startswith("linux"):
        return "the system allocator as it is (not Linux)"
    if "malloc" in os.environ.get("LD_PRELOAD", ""):
        return "the preloaded allocator (LD_PRELOAD)"
    return None


def keep_freed_memory() -> str:
    """Raise glibc's mmap threshold, trim threshold and top pad for this process; returns what
    was done (a phrase for the log). Call it before the large allocations start."""
    refusal = _not_ours()
    if refusal is not None:
        return refusal
    if any(name in os.environ for name in USER_SETTINGS):
        return "glibc malloc as set in the environment (MALLOC_*)"
    mallopt = getattr(_c_library(), "mallopt", None)
    if mallopt is None:
        return "the C library's allocator as it is (no mallopt)"
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    settings = (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)
    )  # fmt: skip
    if all(mallopt(param, value) for param, value in settings):
        return f"glibc malloc reuses freed blocks up to {MMAP_THRESHOLD >> 20} MiB (mallopt)"
    return "the C library's allocator, mallopt having refused a setting"


def release_freed_memory() -> bool:
    """Hand the free pages inside glibc's heaps back to the kernel (``malloc_trim(0)``): the
    blocks in use stay where they are, freed holes stop counting in the process's memory until
    they are used again. False where nothing was released or the allocator is not ours to touch
    (``_not_ours``: a user's ``MALLOC_*`` settings are glibc's and are trimmed too)."""
    if _not_ours() is not None:
        return False
    trim = getattr(_c_library(), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return bool(trim(0))
