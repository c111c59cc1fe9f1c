"""The host allocator setting outcore's workers train under, for every process that times work.

glibc's ``malloc`` hands blocks above a threshold (128 KiB, then adapted) back to the OS when
they are freed and takes them back with page faults on the next allocation. A training step
frees and reallocates the same large activation buffers every iteration, so by default it pays
those faults every step: resnet18's layer3-4 forward and backward at batch 8 take 43-46 ms on
one thread by default and 21-23 ms with freed blocks kept in the heap (on a 2-core VM).
Workers keep them (:func:`keep_heap`, called when a worker joins its process group), and so must
every process that *measures* costs for them (the profiler, the device and runtime probes):
otherwise the plan is made with times up to 2x those the workers will see.

The ``outcore plan`` and ``outcore simulate`` commands keep them too: the search makes and frees
arrays the size of the graph thousands of times (a 50k-node NAS graph's search with the layout
open: 1.12 s against 1.21 s in a fresh process, with half the page faults,
``benchmarks/search_speed.py``). ``outcore.plan`` called from a user's own program leaves that
program's allocator as it is (``outcore.api.keep_freed_memory()`` first to have the same).

Blocks of 32 MiB and more (glibc's own ceiling for its adaptive threshold, :data:`_MMAP_FROM`)
are still mapped and unmapped: kept in the heap, such blocks fragmented it. Sixteen 64 MiB layers
on 4 pipeline ranks (``benchmarks/rank_memory.py``) peaked at 1.2-2.9 GiB a rank, varying run to
run and growing further when the memory tracker ran (its small allocations between the large
blocks), against 1.08 GiB with them mapped, tracked or not; that model's step took 1.27 s against
2.0 s (the page faults of its 64 MiB gradients). A promise about memory is worth that: activations
under 32 MiB, most of a step's churn, stay in the heap.

The setting stays for the rest of the process: glibc cannot be put back to its adaptive
threshold once one is set (setting 128 KiB back made the same layers 2x *slower* than the
default, 100 ms), and a process that profiles a model usually goes on to train it. Elsewhere
than glibc (macOS, musl) nothing changes and :func:`keep_heap` returns False.

Python's own heap has a like cost: its garbage collector's full collections scan every object,
and the search and the training steps make many short-lived ones among a large, long-lived
graph, model and torch. :func:`frozen_objects` leaves the objects that exist when such work
starts out of the scans while it runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
from collections.abc import Iterator

__all__ = ["frozen_objects", "keep_heap"]

# mallopt parameters (glibc malloc.h) and the values outcore sets: never trim the heap's top;
# blocks from 32 MiB up mapped on their own (64-bit glibc's DEFAULT_MMAP_THRESHOLD_MAX)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP = 2**31 - 1
_MMAP_FROM = 32 * 2**20


def _mallopt():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def keep_heap() -> bool:
    """Keep freed blocks under 32 MiB in this process's heap (no unmap and page-fault churn
    between steps), for the rest of the process. Returns whether the allocator accepted it."""
    fn = _mallopt()
    if fn is None:
        return False
    return bool(fn(_M_MMAP_THRESHOLD, _MMAP_FROM)) and bool(fn(_M_TRIM_THRESHOLD, _KEEP))


@contextlib.contextmanager
def frozen_objects(*, collect: bool = False) -> Iterator[None]:
    """Within the block, the objects that exist when it starts are left out of the garbage
    collector's scans (``gc.freeze``), and put back at its end; nothing changes when objects
    are frozen already (the caller's own freeze, or a block inside another). ``collect``:
    collect first, so that no garbage of before the block is kept while it runs.

    The search makes many short-lived objects, and one full collection over everything took
    40 ms of the 1 s search of a 50k-node graph; a training step too (the transformer's 2-stage
    pipeline: 4.78 ms a step with the worker's objects frozen, 5.05 ms without)."""
    if gc.get_freeze_count():
        yield
        return
    if collect:
        gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
