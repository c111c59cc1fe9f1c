"""The host allocator setting outcore's workers train under, for every process that times work.

glibc's ``malloc`` hands blocks above a threshold (128 KiB, then adapted) back to the OS when
they are freed and takes them back with page faults on the next allocation. A training step
frees and reallocates the same large activation buffers every iteration, so by default it pays
those faults every step: resnet18's layer3-4 forward and backward at batch 8 took 43-46 ms on
one thread by default and 21-23 ms with freed blocks kept in the heap (this machine, 2026-11-26).
Workers keep them (:func:`keep_heap`, called when a worker joins its process group), and so must
every process that *measures* costs for them (the profiler, the device and runtime probes):
otherwise the plan is made with times up to 2x those the workers will see.

The setting stays for the rest of the process: glibc cannot be put back to its adaptive
threshold once one is set (setting 128 KiB back made the same layers 2x *slower* than the
default, 100 ms), and a process that profiles a model usually goes on to train it. Elsewhere
than glibc (macOS, musl) nothing changes and :func:`keep_heap` returns False.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["keep_heap"]

# mallopt parameters (glibc malloc.h) and the values outcore sets: the largest an int holds
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP = 2**31 - 1


def _mallopt():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def keep_heap() -> bool:
    """Keep freed blocks of any size in this process's heap (no unmap and page-fault churn
    between steps), for the rest of the process. Returns whether the allocator accepted it."""
    fn = _mallopt()
    if fn is None:
        return False
    return bool(fn(_M_MMAP_THRESHOLD, _KEEP)) and bool(fn(_M_TRIM_THRESHOLD, _KEEP))
