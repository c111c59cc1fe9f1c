"""Planners: place every node of a training graph on one of K devices under a memory limit.

One entry point, :func:`partition`, runs a strategy from :data:`STRATEGIES` and returns a
:class:`PartitionResult` whose time and memory come from the node-level emulator
(:mod:`outcore.partition.emulate`) and the memory model (:mod:`outcore.partition.context`). Pure
numpy (inner loops compiled with numba when it is installed); no torch.
"""

from __future__ import annotations

import logging

import numpy as np

from outcore.errors import UsageError
from outcore.graph.ir import Graph
from outcore.hardware.spec import Cluster
from outcore.partition import baselines, contiguous, pardnn, pipeline, subgraph
from outcore.partition.emulate import Emulation, emulate
from outcore.partition.feasibility import infeasible
from outcore.partition.context import Context, make_context
from outcore.partition.result import (Candidate, PartitionResult, best_of, compact, evaluate,
                                      listed)

log = logging.getLogger(__name__)

STRATEGIES: dict[str, str] = {
    "pardnn": "ParDNN (Qararyah et al. 2021): critical-path slicing, level-aware mapping, "
              "refinement on the emulated schedule, memory repair; may use fewer devices",
    "pipeline": "contiguous stages over a topological order, bottleneck-balanced on time under "
                "the memory limit (1F1B memory); may use fewer stages",
    "subgraph": "SUPER (Jain et al. 2021) sub-graph parallelism: the branches of each fork-join "
                "region on different devices, trunk and device count chosen by emulation",
    "contiguous": "the simple plans: one topological order (as given, depth-first or "
                  "breadth-first) cut into consecutive parts of equal memory or equal time; the "
                  "fastest that fits",
    "round-robin": "baseline: node i of the topological order on device i mod K",
    "chunks": "baseline: K contiguous chunks of equal node count over the topological order",
    "metis": "baseline: METIS k-way min-cut balanced on compute (needs pymetis)",
    "heft": "baseline: HEFT list scheduling (upward rank, earliest finish, backward co-located)",
}

__all__ = ["STRATEGIES", "Emulation", "PartitionResult", "emulate", "partition"]


def partition(g: Graph, devices: int, *, memory_bytes: float | None = None,
              cluster: Cluster | None = None, strategy: str = "pardnn", optimizer: str = "adam",
              microbatches: int = 1, seed: int = 0) -> PartitionResult:
    """Place every node of ``g`` on one of ``devices`` devices.

    Args:
        g: the graph (costs per micro-batch of ``g.batch_size``).
        devices: K, the most devices the plan may use (>= 1).
        memory_bytes: per-device memory limit in bytes; None = unlimited. (A ``cluster``'s own
            device memory is not applied unless passed here.)
        cluster: links between devices; default a flat 16 GB/s, 25 us network.
        strategy: a key of :data:`STRATEGIES`.
        optimizer: sets the parameter copies of the memory model (Adam: 4).
        microbatches: M micro-batches per iteration (memory: M in flight, 1F1B for pipeline).
        seed: passed to randomised baselines (METIS); the other planners are deterministic.

    Raises:
        UsageError: K < 1, negative memory, unknown strategy, cluster smaller than K.
        InfeasibleError: no placement fits; ``min_devices`` / ``min_memory_bytes`` say what would.
    """
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    ctx = make_context(g, devices, cluster=cluster, optimizer=optimizer,
                       microbatches=microbatches, memory_bytes=memory_bytes)
    if strategy == "pardnn":
        best, notes, cands = pardnn.plan(ctx)
        if best is None:
            raise _no_fit(ctx, strategy, cands)
        return _result(ctx, strategy, best, notes)
    if strategy == "contiguous":
        best, notes, cands = contiguous.plan(ctx)
        if best is None:
            raise _no_fit(ctx, strategy, cands)
        return _result(ctx, strategy, best, notes)
    if strategy == "subgraph":
        best, notes, cands = subgraph.plan(ctx)
        if best is None:
            raise _no_fit(ctx, strategy, cands)
        return _result(ctx, strategy, best, notes)
    if strategy == "pipeline":
        best, notes = _plan_pipeline(ctx)
        if best is None:
            raise infeasible(ctx, strategy, inflight="1f1b")
        return _result(ctx, strategy, best, notes, inflight="1f1b")
    a, note = _baseline(ctx, strategy, seed)
    cand = evaluate(ctx, a, strategy)
    if not cand.fits:
        raise infeasible(ctx, strategy, float(cand.peak_bytes.max()), own_placement=False)
    return _result(ctx, strategy, cand, [note] if note else [])


def contiguous_results(g: Graph, devices: int, *, memory_bytes: float | None = None,
                       cluster: Cluster | None = None, optimizer: str = "adam",
                       microbatches: int = 1, top: int = 4) -> list[PartitionResult]:
    """The ``top`` fastest contiguous splits that fit (by the emulator), fastest first, and the
    plain topological order cut by memory and by time on all devices (the trivial splits the
    search must never lose to, whatever the emulator thinks of them: on a 100k-node RNN grid it
    ranked the memory cut 5th while the simulator found it the fastest by 1.35x), for a caller
    that judges them with the simulator. Raises :class:`InfeasibleError` when none fits."""
    ctx = make_context(g, devices, cluster=cluster, optimizer=optimizer,
                       microbatches=microbatches, memory_bytes=memory_bytes)
    best, notes, cands = contiguous.plan(ctx)
    if best is None:
        raise _no_fit(ctx, "contiguous", cands)
    fitting = sorted((c for c in cands if c.fits), key=lambda c: c.makespan_s)
    plain = contiguous.trivial_labels(ctx.devices)
    trivial = [c for c in fitting[top:] if c.label in plain]
    return [_result(ctx, "contiguous", c, notes[:1] + [f"chose {c.label}"])
            for c in fitting[:top] + trivial]


def subgraph_results(g: Graph, devices: int, *, memory_bytes: float | None = None,
                     cluster: Cluster | None = None, optimizer: str = "adam",
                     microbatches: int = 1, within: float = 0.01) -> list[PartitionResult]:
    """SUPER's best placement, and the next that fits when the emulator puts it within
    ``within`` of the best (a different trunk choice the node-level emulator cannot tell apart;
    on a 100k-node transformer two such ties simulated 7.66 and 7.86 s), fastest first, for a
    caller that judges them with the simulator. Raises :class:`InfeasibleError` when none
    fits."""
    ctx = make_context(g, devices, cluster=cluster, optimizer=optimizer,
                       microbatches=microbatches, memory_bytes=memory_bytes)
    best, notes, cands = subgraph.plan(ctx)
    if best is None:
        raise _no_fit(ctx, "subgraph", cands)
    out = [_result(ctx, "subgraph", best, notes)]
    for c in sorted((c for c in cands if c.fits), key=lambda c: (c.makespan_s, c.label)):
        if c.makespan_s > best.makespan_s * (1 + within):
            break
        if not np.array_equal(compact(c.assignment)[0], out[0].assignment):  # not relabelled
            out.append(_result(ctx, "subgraph", c, notes[:-1] + [f"chose {c.label}"]))
            break
    return out


def _baseline(ctx: Context, strategy: str, seed: int) -> tuple[np.ndarray, str]:
    if strategy == "round-robin":
        return baselines.round_robin(ctx), ""
    if strategy == "chunks":
        return baselines.equal_chunks(ctx), ""
    if strategy == "metis":
        return baselines.metis(ctx, seed)
    return baselines.heft(ctx), ""


def _plan_pipeline(ctx: Context) -> tuple[Candidate | None, list[str]]:
    cands: list[Candidate] = []
    for k in pardnn.device_counts(ctx.devices):
        sub = ctx.with_devices(k)
        bounds = pipeline.stage_bounds(sub, k, inflight="1f1b")
        if bounds is None:
            continue
        a = pipeline.assignment_from_bounds(sub, bounds)
        used = int(bounds.size)
        cands.append(evaluate(sub, a, f"{used} stages (of {k})",
                              inflight=_pad(pipeline.inflight_1f1b(sub, used), k)))
    best = best_of(cands)
    notes = [listed(cands)]
    if best is not None:
        notes.append(f"chose {best.label}")
    return best, notes


def _pad(x: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros(k)
    out[:x.size] = x
    return out


def _no_fit(ctx: Context, strategy: str, cands: list[Candidate]):
    peaks = [float(c.peak_bytes.max()) for c in cands]
    return infeasible(ctx, strategy, min(peaks) if peaks else None)


def _result(ctx: Context, strategy: str, best: Candidate, notes: list[str], *,
            inflight: str = "all") -> PartitionResult:
    a, _ = compact(best.assignment)
    used = int(a.max()) + 1 if a.size else 0
    sub = ctx.with_devices(max(used, 1))
    if np.array_equal(a, best.assignment):
        em, peak = best.emulation, best.peak_bytes[:used]
    else:
        m = pipeline.inflight_1f1b(sub, used) if inflight == "1f1b" else None
        cand = evaluate(sub, a, best.label, inflight=m)
        em, peak = cand.emulation, cand.peak_bytes
    return PartitionResult(assignment=a, strategy=strategy, devices_used=used,
                           makespan_s=em.makespan_s, peak_bytes=np.asarray(peak, np.float64),
                           lower_bound_s=ctx.lower_bound_s(), notes=tuple(notes))
