"""The plan of one layout: one model copy's placement (:mod:`outcore.search.placement`)
replicated over GEMS replicas and data-parallel copies (:mod:`outcore.search.replicas`), the
fastest replica count that fits (no torch)."""

from __future__ import annotations

import numpy as np

from outcore.errors import InfeasibleError, UsageError
from outcore.graph.ir import Graph
from outcore.placers import strategies
from outcore.plan.layout import Layout
from outcore.plan.plan import Plan, make_plan
from outcore.plan.request import PlanRequest
from outcore.search.memory_policy import choose_simulated
from outcore.search.placement import best_placement, placement_input
from outcore.search.replicas import better_replicated, replicate, replicated_floor
from outcore.search.verdict import Beaten, fits
from outcore.units import format_bytes

__all__ = ["plan_layout", "single"]


def plan_layout(g: Graph, req: PlanRequest, beat_s: float | None = None) -> Plan:
    """The best plan of the request's layout. ``beat_s``: the time a plan must be under to
    matter (another layout's; the layout search passes it): placements the emulator finds
    :data:`~outcore.search.threads.PRUNE_RATIO` times slower are not simulated, and
    once the best placement is no faster the layout's search stops (:class:`Beaten`), as
    copies and replicas only add time."""
    known = strategies()
    if req.strategy not in ("auto", "single") and req.strategy not in known:
        raise UsageError(f"unknown strategy {req.strategy!r}: use auto or one of "
                         f"{', '.join(known)}")
    if req.devices == req.tp and req.strategy in ("auto", "single"):
        return single(g, req)
    best: Plan | None = None
    notes: list[str] = []
    first_error: InfeasibleError | None = None
    least: float | None = None  # the smallest peak of a plan that did not fit
    for R in req.replica_options():
        try:
            p = _replicated_plan(g, req, R, beat_s)
        except InfeasibleError as e:
            first_error = first_error or e
            notes.append(f"{R} replica(s): {e}")
            continue
        sps = p.predicted.get("samples_per_s", 0.0)
        ok = fits(p)
        notes.append(f"{req.parallel} with {R} replica(s) x dp {req.dp}: {sps:.1f} samples/s, "
                     f"peak {max(p.predicted['peak_bytes']) / 2**20:.1f} MiB"
                     + ("" if ok else " (does not fit)"))
        if ok and (best is None or sps > best.predicted["samples_per_s"]):
            best = p
        if not ok:
            peak = float(max(p.predicted["peak_bytes"]))
            least = peak if least is None else min(least, peak)
    if best is None:
        if first_error is not None:
            raise first_error
        raise InfeasibleError(f"no {req.parallel} plan fits {format_bytes(req.memory_bytes or 0)} "
                              "per device "
                              f"({'; '.join(notes)}): add devices or raise --memory",
                              need_bytes=least)
    if len(req.replica_options()) > 1 or req.dp > 1:
        best = best.with_notes(*notes)
    return best


def single(g: Graph, req: PlanRequest) -> Plan:
    """Everything on one device, with the memory policies that make it fit."""
    p = make_plan(g, np.zeros(g.num_nodes, dtype=np.int64), strategy="single",
                  devices=req.fixed_tp, layout=Layout(tp=req.fixed_tp),
                  memory_bytes=req.memory_bytes,
                  microbatches=req.microbatches,
                  schedule=req.first_schedule,
                  optimizer=req.optimizer, cluster=req.cluster)
    try:
        p, sim = choose_simulated(g, p, mode=req.memory_policy, cluster=req.cluster)
    except InfeasibleError as e:
        raise InfeasibleError(f"{e}; or train on more devices (--devices)",
                              min_devices=e.min_devices,
                              min_memory_bytes=e.min_memory_bytes,
                              need_bytes=e.need_bytes) from None
    return p.replace(predicted=sim.to_dict())


def _replicated_plan(g: Graph, req: PlanRequest, replicas: int,
                     beat_s: float | None = None) -> Plan:
    """The best single-copy placement under ``memory / replicas``, replicated and simulated
    (not when the copy alone is no faster than ``beat_s``: :class:`Beaten`)."""
    placed_g, budget, check_fit = placement_input(g, req, replicas)
    if req.fixed_depth > 1:  # placed by the shards' memory; the sharded plan is simulated
        return _sharded_plan(g, placed_g, req, replicas, budget, beat_s)
    fastest: list[Plan] = []
    base = best_placement(placed_g, req, budget, check_fit=check_fit, beat_s=beat_s,
                          replicas=replicas, fastest_copy=fastest)
    if replicas == 1 and req.dp == 1:
        return base
    if fastest and not np.array_equal(fastest[0].assignment, base.assignment) and \
            (beat_s is None or replicated_floor(fastest[0], req, replicas) < beat_s):
        return better_replicated(g, req, replicas, base, fastest[0], beat_s)
    _check_floor(base, req, replicas, beat_s)
    return replicate(g, base, req, replicas)


def _check_floor(base: Plan, req: PlanRequest, replicas: int, beat_s: float | None) -> None:
    """:class:`Beaten` when ``base``'s replicas cannot be faster than ``beat_s``."""
    floor = replicated_floor(base, req, replicas)
    if beat_s is not None and floor >= beat_s:
        raise Beaten(f"its replicas need at least {floor * 1e3:.2f} ms (one copy's compute "
                     f"on each device, summed over the replicas it holds), no faster than the "
                     f"best plan so far ({beat_s * 1e3:.2f} ms); not replicated")


# how often a sharded layout is placed again under a tighter limit (see _sharded_plan)
SHARDED_RETRIES = 2


def _sharded_plan(g: Graph, placed_g: Graph, req: PlanRequest, replicas: int,
                  budget: float | None, beat_s: float | None) -> Plan:
    """A sharded layout's plan: one copy placed with each layer's parameter state as its
    shard (``placed_g``), with the memory policies that make that fit, then replicated and
    simulated sharded. The placement does not see the parameters each piece gathers while it
    runs, so where the sharded simulation passes the limit the copy is placed again, up to
    :data:`SHARDED_RETRIES` times, under the limit less what sharding added (a data-parallel
    GoogLeNet sharded over 2 ranks at 103 MiB: the placement's checkpoints fitted 96.8 MiB,
    the sharded ranks measured 110.7)."""
    limit = req.memory_bytes
    tighter, bound, p = req, budget, None
    target = float(limit or 0.0)  # the limit the placement is asked to meet
    for attempt in range(SHARDED_RETRIES + 1):
        try:
            base = best_placement(placed_g, tighter, bound, check_fit=True, beat_s=beat_s)
        except InfeasibleError:
            if p is None:
                raise
            return p  # nothing fits the tighter limit: the last plan, which does not fit
        _check_floor(base, req, replicas, beat_s)
        p = replicate(g, base, req, replicas)
        if attempt:
            p = p.with_notes(f"sharded: placed again under {target / 2**20:.1f} "
                             "MiB per device, the limit less what the gathered parameters "
                             "took beyond it")
        if not limit or fits(p) or attempt == SHARDED_RETRIES:
            return p
        # what sharding adds beyond the placement's own peak, which must leave room for it
        extra = max(p.predicted["peak_bytes"]) - max(base.predicted["peak_bytes"])
        target = min(target, float(limit) - extra) - 0.01 * float(limit)
        if target <= 0:
            return p
        tighter = req.replace(memory_bytes=target)
        bound = target if bound is not None else None
    raise AssertionError("unreachable: the last attempt returns")
