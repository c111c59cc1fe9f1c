"""How a local run that failed is told: one error naming the rank where it started and the
errors it caused, a worker's silent death described by its exit code, and whether the workers
only failed to join their process group (then they are started once more)."""

from __future__ import annotations

import re
import signal
from typing import Any

import outcore.errors as errors_mod
from outcore.errors import RuntimeFailure

__all__ = ["JOINING", "RUNNING", "SILENT", "WorkerTraceback", "failure", "join_failed",
           "silent_death"]


# where a worker was when it failed: joining the process group, or running the function
JOINING, RUNNING = "joining", "running"


def join_failed(outputs: dict[int, Any], errors: list[tuple[int, Any]]) -> str | None:
    """The first connection error when the workers failed only while joining the process
    group (none returned, none failed in the function, none died silently); else None."""
    if outputs or not errors or not all(isinstance(v, tuple) and v[2] == JOINING
                                         for _, v in errors):
        return None
    for r, (msg, _, _) in errors:
        if any(w in _short(msg).lower() for w in ("connect", "closed by peer", "reset by peer")):
            return f"rank {r} could not join the process group: {_short(msg)}"
    return None


# what every error of a worker that ended without reporting one says
SILENT = "without reporting an error"


def silent_death(rank: int, exitcode: int) -> str:
    """What a worker's exit code says of a worker that ended :data:`SILENT`ly: a signal that
    killed it, or Python's own exit while it was starting (its traceback, printed to standard
    error, is above)."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = " (the system may have run out of memory)" if name == "SIGKILL" else ""
        return f"worker {rank} was killed by {name} {SILENT}{why}"
    if exitcode == 1:
        return (f"worker {rank} failed while starting, {SILENT} (exit code 1): its traceback "
                "is printed above")
    return f"worker {rank} exited with code {exitcode} {SILENT}"


def failure(procs: list[Any], outputs: dict[int, Any],
             errors: list[tuple[int, Any]]) -> tuple[RuntimeFailure, "WorkerTraceback"]:
    """One error for the run: the root cause first, then up to two errors it caused. Its class
    is the worker's own when that is a :class:`RuntimeFailure` (e.g. ``NonFiniteError``); its
    cause is the failing worker's traceback (shown by ``outcore --debug``)."""
    kinds: dict[int, str] = {}
    flat: list[tuple[int, str]] = []
    for r, value in errors:
        if isinstance(value, tuple):
            value, kinds[r] = value[0], value[1]
        flat.append((r, value))
    for r, p in enumerate(procs):  # workers that died without a word
        if p.exitcode not in (None, 0) and r not in outputs and not any(e[0] == r for e in flat):
            flat.append((r, silent_death(r, p.exitcode)))
    ordered = sorted(flat, key=lambda e: _root_cause_rank(e[1], e[0]))
    rank, msg = ordered[0]
    who = f"rank {rank}" if rank >= 0 else "the run"
    short = _short(msg)
    text = short if short.startswith(f"rank {rank}") else f"{who} failed: {short}"
    others = [f"rank {r}: {_short(m)}" for r, m in ordered[1:3]
              if r != rank and _short(m) != short]  # every rank saying the same: once
    if others:
        text += " (then " + "; ".join(others) + ")"
    cls = getattr(errors_mod, kinds.get(rank, ""), None)
    if not (isinstance(cls, type) and issubclass(cls, RuntimeFailure)):
        cls = RuntimeFailure
    return cls(text), WorkerTraceback(f"rank {rank}: {msg}")


_COMM_WORDS = ("timed out", "timeout", "connection", "read error", "gloo", "nccl",
               "failed receiving", "failed sending", "peer")


class WorkerTraceback(Exception):
    """The traceback of the worker whose failure ended a local run, as text: the cause of the
    :class:`RuntimeFailure` the launcher raises, so ``outcore --debug`` prints it."""


def _root_cause_rank(msg: str, rank: int) -> tuple[int, int]:
    """Order errors: a worker's own failure first, then a worker that died silently, then the
    communication errors and timeouts those caused in the other ranks."""
    low = _short(msg).lower()
    if SILENT in low:
        return (1, rank)
    if any(w in low for w in _COMM_WORDS):
        return (2, rank)
    return (0, rank)


def _short(msg: str) -> str:
    """The first line of an error, without C++ source locations."""
    line = msg.strip().splitlines()[0] if msg.strip() else "unknown error"
    return re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", line)[:300]
