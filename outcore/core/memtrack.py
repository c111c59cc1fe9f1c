"""Measure a rank's peak tensor memory.

CUDA: the caching allocator's peak (``torch.cuda.max_memory_allocated``). CPU has no allocator
statistics, so a ``TorchDispatchMode`` watches every tensor an operator returns, counts each new
storage once (its ``nbytes``) until it is freed (a weakref finalizer), and keeps the peak of the
live total. Tensors alive before tracking starts (parameters, buffers) are counted as a
baseline. What it sees: every tensor made by a PyTorch operator on this thread and in autograd's
backward (activations, gradients, optimizer state, communication buffers). What it does not:
memory outside tensors (the Python heap, allocator slack), so it is a lower bound of the process
RSS, and exactly the quantity the memory model predicts.
"""

from __future__ import annotations

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

    def __enter__(self) -> "MemoryTracker":
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
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
        self.mode.__exit__(*exc)
        _ACTIVE.remove(self.counter)
        self.peak_bytes = int(self.counter.peak)
        for fin in list(self.counter.seen.values()):
            if fin is not None:
                fin.detach()
        self.counter.seen.clear()
