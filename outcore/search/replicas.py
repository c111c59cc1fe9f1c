"""GEMS replicas of a placement (MAST / MASTER, Jain et al., "GEMS: GPU-Enabled Memory-Aware
Model-Parallelism System", SC 2020): the search's bounds on them, and the replicated plan.

A placement of one model copy over K devices is replicated ``replicas`` times over the same
devices, each replica running the stages in another order (``Layout.maps``), so every device
computes a stage of each replica. No replication of a split beats the compute its busiest
device then runs (:func:`replica_load`): the search ranks placements for replicas by it before
it simulates any (:func:`as_replicated`) and stops early by it (:func:`replicated_floor`).
"""

from __future__ import annotations

import numpy as np

from outcore.graph.ir import Graph
from outcore.plan.layout import Layout
from outcore.plan.plan import Plan
from outcore.plan.request import PlanRequest
from outcore.search.verdict import fits
from outcore.sim.simulate import simulate

__all__ = ["as_replicated", "better_replicated", "replica_load", "replicate",
           "replicated_floor"]


def better_replicated(g: Graph, req: PlanRequest, replicas: int, base: Plan, fastest: Plan,
                       beat_s: float | None) -> Plan:
    """The faster, replicated, of ``base`` (the placement whose replicas the estimate favours:
    :func:`as_replicated`) and ``fastest`` (the fastest single copy, which it passed over): the
    estimate counts the replicas' compute, not how their messages and bubbles interleave."""
    ok = [p for p in (base, fastest)
          if beat_s is None or replicated_floor(p, req, replicas) < beat_s]
    plans = [replicate(g, p, req, replicas) for p in ok]
    k = min(range(len(plans)),
            key=lambda i: (not fits(plans[i]), plans[i].predicted["iteration_s"], i))
    if ok[k] is base:
        return plans[k] if len(plans) == 1 else plans[k].with_notes(
            f"replicas: the fastest single copy ({fastest.strategy}) replicates to "
            f"{plans[1].predicted['iteration_s'] * 1e3:.2f} ms")
    return plans[k].replace(notes=base.notes, extra=base.extra).with_notes(
        f"replicas: the fastest single copy ({fastest.strategy}) replicates to "
        f"{plans[k].predicted['iteration_s'] * 1e3:.2f} ms, faster than the placement whose "
        f"replicas' compute is least ({base.strategy})")


def replicated_floor(base: Plan, req: PlanRequest, replicas: int) -> float:
    """Seconds no replication of ``base`` can beat: one copy's time, and each device's
    compute summed over the GEMS replicas whose stages it holds (``Layout.maps``; every
    replica runs the copy's micro-batches on its stages, one compute stream a device)."""
    return as_replicated(req, base.predicted.get("busy_s") or [],
                          float(base.predicted["iteration_s"]), replicas)


def replica_load(busy: np.ndarray, mode: str, replicas: int) -> float:
    """The most compute one device runs when ``replicas`` GEMS replicas of a split whose
    stages compute ``busy`` seconds each share the devices (``Layout.maps``)."""
    maps = Layout.replicate(mode, busy.size, replicas).maps
    held = np.zeros(busy.size)
    for stage_device in maps:
        held[np.asarray(stage_device)] += busy
    return float(held.max())


def as_replicated(req: PlanRequest, busy: np.ndarray | list[float], time_s: float,
                  replicas: int) -> float:
    """``time_s`` (one copy's), or the compute ``replicas`` GEMS replicas of a split whose
    devices compute ``busy`` seconds put on the busiest device when that is longer: a time
    no replication of it beats (the simulator adds to the compute)."""
    if replicas < 2 or req.fixed_tp > 1 or len(busy) != req.model_parallel_devices:
        return time_s
    return max(time_s, replica_load(np.asarray(busy, np.float64), req.parallel, replicas))


def replicate(g: Graph, base: Plan, req: PlanRequest, replicas: int) -> Plan:
    """``base`` (a K-device split) replicated GEMS-style and ``req.dp`` times; simulated. Its
    lower bound counts every replica's work on the K devices."""
    mode = "mp" if replicas == 1 else req.parallel  # one replica x dp: plain data parallelism
    layout = Layout.replicate(mode, base.stages, replicas, req.dp, tp=req.fixed_tp,
                              depth=req.fixed_depth)
    p = base.replace(devices=layout.ranks(base.stages), memory_bytes=req.memory_bytes,
                     layout=layout)
    sim = simulate(p, g, checked=False)
    predicted = {**base.predicted, **sim.to_dict()}
    if replicas > 1 and predicted.get("lower_bound_s") is not None:  # one copy's, so far
        work = float((g.fwd_s + g.bwd_s).sum()) * int(req.microbatches) * replicas
        predicted["lower_bound_s"] = max(predicted["lower_bound_s"], work / base.stages)
    return p.replace(predicted=predicted)
