"""cpu_memory.keep_freed_memory: on glibc, blocks of megabytes then come from the heap (reused
when freed) instead of fresh pages mapped per allocation; a user's own settings win."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from transformer_nmt import cpu_memory

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
