"""Collectives that run inside a piece's forward or backward (a parallelism's: sharded
parameters gathered and gradients reduce-scattered, tensor-parallel all-reduces and
all-gathers), timed on the traced step for the communication profile.

The executor times its own messages and all-reduces as actions; these run within an action, so
whoever runs one records it here (:meth:`CollectiveLog.timed`), and the executor adds them to
the step's events on the ``comm`` stream. Off (the untraced steps), recording costs one
attribute read.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from outcore.trace import Event

__all__ = ["CollectiveLog", "record", "recording"]


class CollectiveLog:
    """The collectives of the traced step: ``(kind, bytes, start, end)`` on this process's
    clock; ``kind`` as the communication profile lists it (``shard allgather``, ...)."""

    def __init__(self) -> None:
        self.on = False
        self.records: list[tuple[str, int, float, float]] = []

    def start(self, on: bool) -> None:
        """A new step, recorded when ``on``."""
        self.on = on
        self.records = []

    @contextlib.contextmanager
    def timed(self, kind: str, nbytes: int) -> Iterator[None]:
        """Record the block as one ``kind`` collective of ``nbytes`` (when on)."""
        if not self.on:
            yield
            return
        start = time.perf_counter()
        yield
        self.records.append((kind, int(nbytes), start, time.perf_counter()))

    def add(self, kind: str, nbytes: int, start: float, end: float) -> None:
        if self.on:
            self.records.append((kind, int(nbytes), start, end))

    def events(self, rank: int, t0: float) -> list[Event]:
        """The recorded collectives as events of ``rank``, relative to ``t0``."""
        return [Event(rank, kind, kind, start - t0, end - t0, "comm", bytes=nbytes)
                for kind, nbytes, start, end in self.records]


_CURRENT: list[CollectiveLog] = []  # the traced step's log, while one runs


@contextlib.contextmanager
def recording(log: CollectiveLog) -> Iterator[None]:
    """Within the block (a traced step), :func:`record` writes to ``log``."""
    _CURRENT.append(log)
    try:
        yield
    finally:
        _CURRENT.pop()


def record(kind: str, nbytes: int) -> contextlib.AbstractContextManager[None]:
    """Time the block as one ``kind`` collective of ``nbytes`` on the traced step (else
    nothing): for collectives code deep inside a piece runs (autograd functions, tensor
    splits), which has no log of its own at hand."""
    return _CURRENT[-1].timed(kind, nbytes) if _CURRENT else contextlib.nullcontext()
