"""Measure a rank's peak tensor memory, without changing it.

CUDA: the caching allocator's peak (``torch.cuda.max_memory_allocated``). CPU has no allocator
statistics, so the tracker asks PyTorch's profiler for the CPU allocator's own record of every
allocation and free during the step (``profile_memory``: the allocator reports them, nothing
holds a tensor), and adds the bytes alive when tracking starts (parameters, buffers, optimizer
state: the baseline). What it sees: every allocation on this thread, and in autograd's backward,
which runs on it (activations, gradients, optimizer state, communication buffers). What it does
not: memory outside tensors (the Python heap, allocator slack), so it is a lower bound of the
process RSS, and exactly the quantity the memory model predicts.

The tracker this replaces watched operator outputs from a ``TorchDispatchMode``; any such mode,
even one that does nothing, stops autograd from summing two gradients of one tensor in place
(the sum comes out as a third tensor), so that tracker measured a program that used more
memory than the one it watched. It remains the fallback while another profiler runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class _Counter:
    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.lock = threading.Lock()
        self.seen: dict[int, Any] = {}

    def add(self, storage: torch.UntypedStorage) -> None:
        key = storage.data_ptr()
        if key == 0 or key in self.seen:
            return
        nbytes = storage.nbytes()
        with self.lock:
            self.live += nbytes
            if self.live > self.peak:
                self.peak = self.live
        try:
            self.seen[key] = weakref.finalize(storage, self._free, key, nbytes)
        except TypeError:  # storage not weak-referenceable: count it, never free it
            self.seen[key] = None

    def _free(self, key: int, nbytes: int) -> None:
        with self.lock:
            self.live -= nbytes
        self.seen.pop(key, None)


_ACTIVE: list[_Counter] = []  # the counters of the trackers running now


def storage_resized(storage: torch.UntypedStorage, old_ptr: int) -> None:
    """Tell running trackers that ``storage`` was resized in place (its allocation at
    ``old_ptr`` is gone, a new one may be in its place): sharded parameters free and regain
    their whole storage this way (``outcore.parallel.sharding``), which no operator reports."""
    for counter in _ACTIVE:
        fin = counter.seen.get(old_ptr)
        if fin is not None:
            fin()
        if storage.nbytes():
            counter.add(storage)


class _Mode(TorchDispatchMode):
    def __init__(self, counter: _Counter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                try:
                    self.counter.add(t.untyped_storage())
                except (RuntimeError, NotImplementedError):
                    pass
        return out


class MemoryTracker:
    """Context manager measuring peak tensor bytes of the code inside (see module docstring).

    Args:
        device: the device whose memory is measured.
        baseline: tensors alive before tracking (parameters, buffers, optimizer state).
    """

    def __init__(self, device: torch.device, baseline: Iterable[torch.Tensor] = ()):
        self.device = device
        self.baseline = list(baseline)
        self.peak_bytes = 0
        self.profiler: Any = None
        self.counter: _Counter | None = None

    def __enter__(self) -> "MemoryTracker":
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        if torch.autograd.profiler._is_profiler_enabled:  # the user profiles: watch operators
            return self._enter_counter()
        seen: dict[int, int] = {}
        for t in self.baseline:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel():
                st = t.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
        self.base_bytes = sum(seen.values())
        _warn_once_quietly()
        self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                               profile_memory=True)
        with _quiet():
            self.profiler.__enter__()
        return self

    def _enter_counter(self) -> "MemoryTracker":
        self.counter = _Counter()
        for t in self.baseline:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel():
                self.counter.add(t.untyped_storage())
        self.mode = _Mode(self.counter)
        self.mode.__enter__()
        _ACTIVE.append(self.counter)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
            return
        if self.counter is not None:
            self._exit_counter(*exc)
            return
        with _quiet():
            self.profiler.__exit__(*exc)
        self.peak_bytes = self.base_bytes + allocated_peak(self.profiler)
        self.profiler = None

    def _exit_counter(self, *exc: Any) -> None:
        counter = self.counter
        assert counter is not None
        self.mode.__exit__(*exc)
        _ACTIVE.remove(counter)
        self.peak_bytes = int(counter.peak)
        for fin in list(counter.seen.values()):
            if fin is not None:
                fin.detach()
        counter.seen.clear()
        self.counter = None


_WARNED = False


def _warn_once_quietly() -> None:
    """Free memory allocated before a profile once, silenced: the allocator warns the first
    time it sees such a free (once a process), which every worker's first step would print."""
    global _WARNED
    if _WARNED:
        return
    _WARNED = True
    t = torch.empty(1)
    with _quiet():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    profile_memory=True):
            del t


@contextlib.contextmanager
def _quiet():
    """Silence the process's standard error inside: the profiler's library writes lines of
    its own at every start and stop (no setting turns them off), which would fill a worker's
    log, one pair per step."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stream: nothing to silence
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def allocated_peak(profiler: Any) -> int:
    """The most CPU bytes allocated at once since ``profiler`` (run with ``profile_memory``)
    started, less those freed: its allocator records in time order. A free of memory allocated
    before it started is not recorded (the allocator knows only its own allocations)."""
    records = [(e.start_ns(), e.nbytes()) for e in profiler.profiler.kineto_results.events()
               if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    records.sort(key=lambda r: r[0])
    live = peak = 0
    for _, nbytes in records:
        live += nbytes
        if live > peak:
            peak = live
    return int(peak)
