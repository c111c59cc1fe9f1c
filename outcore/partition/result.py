"""Results of planning: the public :class:`PartitionResult` and the planners' candidates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from outcore.partition.emulate import Emulation, run
from outcore.partition.context import Context


@dataclass(frozen=True, eq=False)
class PartitionResult:
    """A placement of every node on a device, with what the emulator predicts for it.

    Attributes:
        assignment: ``int64[n]`` device of each node index, devices numbered ``0 ..
            devices_used - 1`` in order of their first node.
        strategy: the planner that made it.
        devices_used: devices the plan uses (may be fewer than asked when that is faster).
        makespan_s: emulated iteration time (:mod:`outcore.partition.emulate`), seconds.
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


@dataclass(frozen=True, eq=False)
class Candidate:
    """A placement a planner considered: assignment, its emulation and its memory peaks."""

    label: str
    assignment: np.ndarray
    emulation: Emulation
    peak_bytes: np.ndarray
    fits: bool

    @property
    def makespan_s(self) -> float:
        return self.emulation.makespan_s


def evaluate(ctx: Context, assignment: np.ndarray, label: str, *,
             inflight: np.ndarray | float | None = None, em: Emulation | None = None) -> Candidate:
    """Emulate ``assignment`` (unless ``em`` is given) and check it against the memory limit."""
    a = np.ascontiguousarray(assignment, dtype=np.int64)
    em = run(ctx, a) if em is None else em
    peak = ctx.memory(a, inflight)
    return Candidate(label, a, em, peak, ctx.fits(peak))


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
    return int(np.unique(assignment).size) if assignment.size else 0


def compact(assignment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Renumber devices ``0..`` in order of their first node; return (new, old device of each)."""
    a = np.asarray(assignment, dtype=np.int64)
    if a.size == 0:
        return a.copy(), np.zeros(0, np.int64)
    devs, first = np.unique(a, return_index=True)
    old = devs[np.argsort(first, kind="stable")]
    remap = np.empty(int(devs.max()) + 1, np.int64)
    remap[old] = np.arange(old.size)
    return remap[a], old
