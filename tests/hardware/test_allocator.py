"""The allocator setting workers and the profiler share (outcore.hardware.allocator): with it,
a freed block under 32 MiB stays in the process (no unmap, no page faults when the next step
takes it back); without it glibc returns the block to the OS at once. Blocks from 32 MiB up are
returned either way (kept, they fragmented the heap)."""

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from outcore.runtime.launch import run_local

ROOT = str(Path(__file__).resolve().parents[2])

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt thresholds are glibc's")

SCRIPT = r"""
import sys
from outcore.hardware.allocator import keep_heap
from tests.hardware.test_allocator import returned_share
kept = keep_heap() if sys.argv[1] == "keep" else None
print(kept, returned_share(), returned_share(64 * 2**20))
"""


def returned_share(n: int = 16 * 2**20) -> float:
    """Share of a freed, touched ``n``-byte malloc block that goes back to the OS at once."""
    import ctypes
    import os
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)  # touch every page
    held = rss()
    libc.free(p)
    return (held - rss()) / n


def _worker_share(ctx) -> float:
    return returned_share()


def _returned(mode: str) -> tuple[str, float, float]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                         timeout=60, check=True, cwd=ROOT).stdout.split()
    return out[0], float(out[1]), float(out[2])


def test_freed_blocks_stay_in_the_heap_only_when_kept():
    kept, returned, returned_large = _returned("keep")
    assert kept == "True"
    assert returned < 0.1          # the 16 MiB stay mapped in the process
    assert returned_large > 0.9    # 64 MiB go back: kept, such blocks fragment the heap
    _, returned_default, _ = _returned("default")
    assert returned_default > 0.9  # glibc's default unmaps a block that large at once


def test_local_workers_keep_freed_blocks():
    """Workers train as the profiler measured: the setting is applied when they join."""
    assert run_local(_worker_share, 1, (), timeout_s=60)[0] < 0.1
