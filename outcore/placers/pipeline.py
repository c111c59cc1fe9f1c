"""The ``pipeline`` placer: contiguous stages over a topological order, balanced on time under
the memory limit with 1F1B's micro-batches in flight (the stage bounds of
:mod:`outcore.placers.stages`), for K devices and the counts below it; the fastest that fits."""

from __future__ import annotations

import numpy as np

from outcore.placers.context import Context
from outcore.placers.feasibility import infeasible
from outcore.placers.registry import Placement, Placer
from outcore.placers.result import Candidate, best_of, evaluate, listed
from outcore.placers.stages import (
    assignment_from_bounds,
    device_counts,
    inflight_1f1b,
    stage_bounds,
)


def plan(ctx: Context) -> tuple[Candidate | None, list[str], list[Candidate]]:
    """The fastest stage split that fits, the notes, and every split tried (one per device
    count that has one)."""
    cands: list[Candidate] = []
    for k in device_counts(ctx.devices):
        sub = ctx.with_devices(k)
        bounds = stage_bounds(sub, k, inflight="1f1b")
        if bounds is None:
            continue
        a = assignment_from_bounds(sub, bounds)
        used = int(bounds.size)
        cands.append(evaluate(sub, a, f"{used} stages (of {k})",
                              inflight=_padded(inflight_1f1b(sub, used), k)))
    best = best_of(cands)
    notes = [listed(cands)]
    if best is not None:
        notes.append(f"chose {best.label}")
    return best, notes, cands


def _padded(x: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros(k)
    out[:x.size] = x
    return out


class Pipeline(Placer):
    """The ``pipeline`` placer (module docstring)."""

    name = "pipeline"
    summary = ("contiguous stages over a topological order, bottleneck-balanced on time under "
               "the memory limit (1F1B memory); may use fewer stages")
    in_auto = True
    inflight = "1f1b"

    def place(self, ctx: Context, seed: int) -> Placement:
        return Placement(*plan(ctx))

    def offers(self, ctx: Context, placed: Placement) -> list[tuple[Candidate, list[str]]]:
        """The best split, and under a memory limit also the split the limit did not shape
        (balanced on time alone): the stage bounds judge memory by the placers' summary model
        (:meth:`~outcore.placers.context.Context.memory`), which can put over the limit a
        split the simulator finds inside it (GPT-2's fastest split, under a limit set at its
        own simulated peak, was never offered); the simulator judges both."""
        out = super().offers(ctx, placed)
        if ctx.memory_bytes is None or placed.best is None:
            return out
        best, notes, _ = plan(ctx.without_limit())
        if best is None or np.array_equal(best.assignment, placed.best.assignment):
            return out
        return out + [(best, notes + ["(split on time alone: the simulator judges memory)"])]

    def refusal(self, ctx: Context, placed: Placement):
        return infeasible(ctx, self.name, inflight=self.inflight)
