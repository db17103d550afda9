"""cpu_memory.keep_freed_memory: on glibc, blocks of megabytes then come from the heap (reused
when freed) instead of fresh pages mapped per allocation; a user's own settings win.
release_freed_memory hands the free pages back, and a training run does so every few updates."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from transformer_nmt import cpu_memory, fast_paths

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

# A fresh process allocates 4 MiB with malloc and says whether the block lies in the heap, below
# the program break (else glibc mapped fresh pages for it, above the break).
PROBE = textwrap.dedent(
    """
    import ctypes, sys
    from transformer_nmt import cpu_memory
    if sys.argv[1] == "keep":
        print(cpu_memory.keep_freed_memory(), file=sys.stderr)
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.sbrk.restype, libc.sbrk.argtypes = ctypes.c_void_p, (ctypes.c_long,)
    block = libc.malloc(4 << 20)
    print(block < libc.sbrk(0))
    """
)


def probe(mode: str, env: dict[str, str] | None = None) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=env
    )
    return out.stdout.strip() == "True"


@glibc
def test_megabyte_blocks_come_from_the_heap_after_it_and_from_fresh_mappings_before():
    assert probe("as-is") is False
    assert probe("keep") is True


@glibc
def test_a_users_malloc_settings_are_left_alone(monkeypatch):
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "131072"}
    assert probe("keep", env) is False
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert "environment" in cpu_memory.keep_freed_memory()


# A fresh process with the train stage's allocator settings touches 64 MiB of 1 MiB blocks,
# frees them (the heap keeps them: it is never trimmed), then hands the free pages back;
# it prints its resident KiB after the frees and after the release.
RELEASE_PROBE = textwrap.dedent(
    """
    import ctypes
    from transformer_nmt import cpu_memory
    def resident_kib():
        with open("/proc/self/status") as status:
            return next(int(l.split()[1]) for l in status if l.startswith("VmRSS"))
    cpu_memory.keep_freed_memory()
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    blocks = [libc.malloc(1 << 20) for _ in range(64)]
    for block in blocks:
        ctypes.memset(block, 1, 1 << 20)
    for block in blocks:
        libc.free(block)
    kept = resident_kib()
    released = cpu_memory.release_freed_memory()
    print(kept, resident_kib(), released)
    """
)


@glibc
def test_freed_blocks_stay_resident_until_their_pages_are_handed_back():
    # glibc's own allocator with the fast path on, whatever the caller's environment says
    left_out = ("LD_PRELOAD", fast_paths.ENV)
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("MALLOC_") and name not in left_out
    }
    out = subprocess.run(
        [sys.executable, "-c", RELEASE_PROBE], capture_output=True, text=True, check=True, env=env
    )
    kept, after, released = out.stdout.split()
    # 64 MiB were touched and freed; at least three quarters of them leave the process
    assert released == "True"
    assert int(kept) - int(after) >= 48 * 1024


def test_pages_are_released_every_n_updates_once_per_update(monkeypatch):
    from types import SimpleNamespace

    from transformer_nmt.training.callbacks import memory

    calls = []

    def release() -> bool:
        calls.append(trainer.global_step)
        return True

    monkeypatch.setattr(memory, "release_freed_memory", release)
    callback = memory.ReleaseFreedMemory(every=3)
    trainer = SimpleNamespace(global_step=0)
    callback.on_train_start(trainer, None)
    for step in range(1, 10):  # two micro-batches per update: the step moves on every second
        for _ in range(2):
            callback.on_train_batch_end(trainer, None, None, None, 0)
        trainer.global_step = step
    callback.on_train_batch_end(trainer, None, None, None, 0)
    assert calls == [3, 6, 9]
    assert callback.releases == 3
    with pytest.raises(ValueError, match="every"):
        memory.ReleaseFreedMemory(every=0)
