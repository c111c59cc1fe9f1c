"""Results of planning: the public :class:`PartitionResult` and the planners' candidates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from outcore.placers.context import Context
from outcore.placers.emulate import Emulation, run, summary


@dataclass(frozen=True, eq=False)
class PartitionResult:
    """A placement of every node on a device, with what the emulator predicts for it.

    Attributes:
        assignment: ``int64[n]`` device of each node index, devices numbered ``0 ..
            devices_used - 1`` in order of their first node.
        strategy: the planner that made it.
        devices_used: devices the plan uses (may be fewer than asked when that is faster).
        makespan_s: emulated iteration time (:mod:`outcore.placers.emulate`), seconds.
        peak_bytes: ``float64[devices_used]`` peak memory per device under the memory model.
        lower_bound_s: max(critical path of forward + backward, M x total work / devices asked).
        notes: what the planner did and decided, one line each.
    """

    assignment: np.ndarray
    strategy: str
    devices_used: int
    makespan_s: float
    peak_bytes: np.ndarray
    lower_bound_s: float
    notes: tuple[str, ...] = ()

    @property
    def efficiency(self) -> float:
        """``lower_bound_s / makespan_s`` (1.0 = provably optimal under the model)."""
        return self.lower_bound_s / self.makespan_s if self.makespan_s > 0 else 1.0


class Candidate:
    """A placement a planner considered: assignment, its memory peaks, whether it fits, and its
    emulation, run when first asked for (a planner ranks the placements that fit by time; one
    that does not fit is often never timed: 46 of 79 evaluations in a 50k-node RNN grid's
    layout search were of such placements)."""

    __slots__ = ("label", "assignment", "peak_bytes", "fits", "_ctx", "_em", "_light",
                 "_all_inflight", "_traced")

    def __init__(self, label: str, assignment: np.ndarray, peak_bytes: np.ndarray, fits: bool,
                 ctx: Context | None = None, em: Emulation | None = None, *,
                 all_inflight: bool = False, traced: bool = False) -> None:
        if ctx is None and em is None:
            raise ValueError("a candidate needs its emulation or the context to run it in")
        self.label, self.assignment, self.peak_bytes, self.fits = label, assignment, \
            peak_bytes, fits
        self._ctx, self._em, self._light = ctx, em, False
        # peak_bytes is the memory model's with every micro-batch in flight (the emulation's)
        self._all_inflight = all_inflight
        self._traced = traced  # its emulation traces the critical path (ParDNN refines it)

    @property
    def emulated(self) -> bool:
        return self._em is not None

    @property
    def emulation(self) -> Emulation:
        if self._em is None:
            assert self._ctx is not None  # made with one or the other
            em = run(self._ctx, self.assignment, critical_path=self._traced,
                     peak_bytes=self.peak_bytes if self._all_inflight else None)
            self._em, self._ctx = summary(em) if self._light else em, None
            return em
        return self._em

    @property
    def makespan_s(self) -> float:
        return self.emulation.makespan_s

    def light(self) -> Candidate:
        """This candidate keeping only its emulation's summary, not its per-task arrays
        (memory at 1M nodes); one not yet emulated stays so."""
        out = Candidate(self.label, self.assignment, self.peak_bytes, self.fits,
                        ctx=self._ctx, em=None if self._em is None else summary(self._em),
                        all_inflight=self._all_inflight, traced=self._traced)
        out._light = True
        return out


def evaluate(ctx: Context, assignment: np.ndarray, label: str, *,
             inflight: np.ndarray | float | None = None, em: Emulation | None = None,
             traced: bool = False) -> Candidate:
    """``assignment`` checked against the memory limit, its emulation ``em`` or one run when
    first asked for (:attr:`Candidate.emulation`; with ``traced``, with its critical path,
    which ParDNN's refinement starts from)."""
    a = np.ascontiguousarray(assignment, dtype=np.int64)
    peak = ctx.memory(a, inflight)
    return Candidate(label, a, peak, ctx.fits(peak), ctx=ctx, em=em,
                     all_inflight=inflight is None, traced=traced)


def listed(cands: list[Candidate], extra_s: list[float] | None = None) -> str:
    """``cands`` for a planner's notes: each one's emulated time (plus ``extra_s``, what the
    planner adds to rank it), or its peak memory when it does not fit and was never timed."""
    from outcore.units import format_bytes, format_seconds

    def one(i: int, c: Candidate) -> str:
        if not c.fits and not c.emulated:
            return f"{c.label}: does not fit ({format_bytes(float(c.peak_bytes.max()))})"
        t = c.makespan_s + (extra_s[i] if extra_s else 0.0)
        return f"{c.label}: {format_seconds(t)}" + ("" if c.fits else " (does not fit)")

    return "candidates: " + ", ".join(one(i, c) for i, c in enumerate(cands))


def best_of(candidates: list[Candidate]) -> Candidate | None:
    """The fitting candidate with the least makespan; ties: fewer devices, then listed first."""
    best = None
    for c in candidates:
        if not c.fits:
            continue
        if best is None or _better(c, best):
            best = c
    return best


def _better(a: Candidate, b: Candidate) -> bool:
    if a.makespan_s < b.makespan_s * (1.0 - 1e-12):
        return True
    if b.makespan_s < a.makespan_s * (1.0 - 1e-12):
        return False
    return devices_used(a.assignment) < devices_used(b.assignment)


def devices_used(assignment: np.ndarray) -> int:
    return int(np.unique(_run_values(np.asarray(assignment))).size) if assignment.size else 0


def _run_values(a: np.ndarray) -> np.ndarray:
    """The device of each run of equal consecutive entries (every device of ``a``, and its
    first node's run first: a placement has few runs, and sorting them is cheap)."""
    return a[np.flatnonzero(np.concatenate(([True], a[1:] != a[:-1])))]


def compact(assignment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Renumber devices ``0..`` in order of their first node; return (new, old device of each)."""
    a = np.asarray(assignment, dtype=np.int64)
    if a.size == 0:
        return a.copy(), np.zeros(0, np.int64)
    runs = _run_values(a)
    devs, first = np.unique(runs, return_index=True)
    old = devs[np.argsort(first, kind="stable")]
    remap = np.empty(int(devs.max()) + 1, np.int64)
    remap[old] = np.arange(old.size)
    return remap[a], old
