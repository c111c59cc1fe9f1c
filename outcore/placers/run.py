"""Running a placer by name: :func:`partition` returns its placement, :func:`placements` every
placement it offers the search, each a :class:`~outcore.placers.result.PartitionResult` whose
time and memory come from the node-level emulator (:mod:`outcore.placers.emulate`) and the
memory model (:mod:`outcore.placers.context`). Pure numpy; no torch."""

from __future__ import annotations

import numpy as np

from outcore.graph.ir import Graph
from outcore.hardware.spec import Cluster
from outcore.placers.context import Context, make_context
from outcore.placers.registry import Placer, get_placer
from outcore.placers.result import Candidate, PartitionResult, compact, evaluate
from outcore.placers.stages import inflight_1f1b

__all__ = ["partition", "placements"]


def partition(g: Graph, devices: int, *, memory_bytes: float | None = None,
              cluster: Cluster | None = None, strategy: str = "pardnn", optimizer: str = "adam",
              microbatches: int = 1, seed: int = 0) -> PartitionResult:
    """Place every node of ``g`` on one of ``devices`` devices with the placer ``strategy``.

    Args:
        g: the graph (costs per micro-batch of ``g.batch_size``).
        devices: K, the most devices the plan may use (>= 1).
        memory_bytes: per-device memory limit in bytes; None = unlimited. (A ``cluster``'s own
            device memory is not applied unless passed here.)
        cluster: links between devices; default a flat 16 GB/s, 25 us network.
        strategy: a registered placer (:func:`~outcore.placers.registry.placer_names`).
        optimizer: sets the parameter copies of the memory model (Adam: 4).
        microbatches: M micro-batches per iteration (memory: M in flight, 1F1B for pipeline).
        seed: passed to randomised placers (METIS); the others are deterministic.

    Raises:
        UsageError: K < 1, negative memory, unknown strategy, cluster smaller than K.
        InfeasibleError: no placement fits; ``min_devices`` / ``min_memory_bytes`` say what would.
    """
    placer = get_placer(strategy)
    ctx = make_context(g, devices, cluster=cluster, optimizer=optimizer,
                       microbatches=microbatches, memory_bytes=memory_bytes)
    placed = placer.place(ctx, seed)
    if placed.best is None:
        raise placer.refusal(ctx, placed)
    return _result(ctx, placer, placed.best, placed.notes)


def placements(g: Graph, devices: int, *, memory_bytes: float | None = None,
               cluster: Cluster | None = None, strategy: str = "pardnn",
               optimizer: str = "adam", microbatches: int = 1,
               seed: int = 0) -> list[PartitionResult]:
    """Every placement the placer ``strategy`` offers for the simulator to judge
    (:meth:`~outcore.placers.registry.Placer.offers`), its best first; arguments and errors
    as :func:`partition`."""
    placer = get_placer(strategy)
    ctx = make_context(g, devices, cluster=cluster, optimizer=optimizer,
                       microbatches=microbatches, memory_bytes=memory_bytes)
    placed = placer.place(ctx, seed)
    if placed.best is None:
        raise placer.refusal(ctx, placed)
    return [_result(ctx, placer, c, notes) for c, notes in placer.offers(ctx, placed)]


def _result(ctx: Context, placer: Placer, best: Candidate, notes: list[str]) -> PartitionResult:
    """``best`` with its devices numbered in order of first use, emulated on them."""
    a, _ = compact(best.assignment)
    used = int(a.max()) + 1 if a.size else 0
    sub = ctx.with_devices(max(used, 1))
    if np.array_equal(a, best.assignment):
        em, peak = best.emulation, best.peak_bytes[:used]
    else:
        m = inflight_1f1b(sub, used) if placer.inflight == "1f1b" else None
        cand = evaluate(sub, a, best.label, inflight=m)
        em, peak = cand.emulation, cand.peak_bytes
    return PartitionResult(assignment=a, strategy=placer.name, devices_used=used,
                           makespan_s=em.makespan_s, peak_bytes=np.asarray(peak, np.float64),
                           lower_bound_s=ctx.lower_bound_s(), notes=tuple(notes))
