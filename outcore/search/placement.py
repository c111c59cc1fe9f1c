"""One model copy's placement for a fixed layout, emulator first and simulator for the best few.

Every placer places the graph (:mod:`outcore.search.threads`; the node-level emulator times each
placement in milliseconds); the few :mod:`outcore.search.prune` keeps are made to fit with
memory policies (:mod:`outcore.search.memory_policy`) and simulated, fastest first; the fastest
that fits is coarsened where small pieces do not pay for themselves, and its schedule chosen
(no torch).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from outcore.errors import InfeasibleError
from outcore.graph.ir import Graph
from outcore.placers import PartitionResult, always_simulated, auto_placers
from outcore.placers.coarse import Coarse, coarsened
from outcore.placers.context import make_context
from outcore.placers.emulate import run
from outcore.placers.granularity import merge_small_pieces
from outcore.plan.layout import Layout
from outcore.plan.plan import Plan, make_plan
from outcore.plan.request import PlanRequest
from outcore.search.memory_policy import choose_simulated
from outcore.search.prune import not_simulated, to_simulate
from outcore.search.replicas import as_replicated, replicated_floor
from outcore.search.tensor import shard_costed
from outcore.search.threads import contended, contended_runs, place, place_ahead, placements_made
from outcore.search.verdict import Beaten, candidate_note, fits, placement_row
from outcore.sim.simulate import simulate

__all__ = ["RUNNER_UP_MARGIN", "SCHEDULE_TIE", "best_placement", "place_next",
           "placement_input"]


def place_next(g: Graph, req: PlanRequest) -> bool:
    """Start the placements :func:`~outcore.search.copies.plan_layout` of ``(g, req)`` begins
    with on the layout search's planner threads (:func:`~outcore.search.threads.place_ahead`),
    while this thread finishes another layout; they are the same placements, only made
    earlier. Returns whether they started (not for a layout of one device per copy, nor a
    sharded one, whose search the layout search tries only where plain copies do not fit)."""
    if req.fixed_depth > 1 or (req.devices == req.fixed_tp and req.strategy in ("auto", "single")):
        return False
    placed_g, budget, check_fit = placement_input(g, req, req.replica_options()[0])
    co, names = _placement_call(placed_g, req)
    return names is not None and place_ahead(placed_g if co is None else co.graph, req, budget,
                                             names, check_fit, contend=True)


def _placement_call(g: Graph, req: PlanRequest) -> tuple[Coarse | None, tuple[str, ...] | None]:
    """``(g's coarsened copy or None, the planners)`` of :func:`_placed`: the copy is what they
    place; no planner (None) with one device per copy."""
    names = None if req.strategy == "auto" and req.model_parallel_devices == 1 else \
        (auto_placers() if req.strategy == "auto" else (req.strategy,))
    return coarsened(g), names


def placement_input(g: Graph, req: PlanRequest, replicas: int
                    ) -> tuple[Graph, float | None, bool]:
    """What one copy of ``replicas`` GEMS replicas is placed on: ``(graph, memory budget per
    device, whether placements must fit it)`` (a sharded layout: the shards' memory)."""
    mem = req.memory_bytes
    budget = None if mem is None else mem / replicas
    if req.fixed_depth > 1:
        return shard_costed(g, req.fixed_depth), budget, True
    return g, budget, replicas == 1


def best_placement(g: Graph, req: PlanRequest, budget: float | None, *,
                   check_fit: bool, beat_s: float | None = None, replicas: int = 1,
                   fastest_copy: list | None = None) -> Plan:
    """The fastest single-replica plan on the model-parallel devices, planned under ``budget``
    per device; with ``check_fit`` only plans whose simulated peak fits the limit count.

    Emulator first, simulator for the best few: every planner places the graph (the node-level
    emulator times each placement in milliseconds); every contiguous split and the
    :data:`~outcore.search.threads.SIMULATED_PER_SEARCH` fastest other placements by the
    emulator with port contention (:func:`~outcore.search.threads.contended`) are made
    to fit with memory policies and simulated (the simulator costs a lowering and an event run
    each), fastest first, except those the contended emulation finds
    :data:`~outcore.search.threads.PRUNE_RATIO` times slower than the best simulated
    plan that fits, or than ``beat_s`` (another layout's plan:
    :func:`~outcore.search.copies.plan_layout`; :class:`Beaten` when none is left) or, as
    ``replicas`` GEMS replicas, no faster than ``beat_s`` by their compute alone
    (:func:`~outcore.search.threads.not_simulated`). Where nothing over the devices
    fits, every node on one device is tried too (:func:`_on_one_device`).
    ``fastest_copy``: a list to receive the simulated placement fastest as one copy."""
    placed, notes, first_error, est = _placed(g, req, budget, check_fit, replicas)
    placements_made()  # the layout search may start the next layout's placements now
    chosen = to_simulate(placed, est, always_simulated())
    tried: list[tuple[float, int, Plan]] = []
    bound = beat_s  # the fastest simulated plan that fits so far (or another layout's)
    beaten = False  # a placement lost to beat_s
    seen: dict[bytes, str] = {}  # the planner that offered each placement simulated so far
    for k in sorted(range(len(placed)), key=lambda k: (k not in chosen, est[k], k)):
        name, result = placed[k]
        skip = not_simulated(name, result, est[k], k in chosen, bound, beat_s, replicas)
        if skip is not None:
            notes.append(skip[0])
            beaten = beaten or skip[1]
            continue
        alike = result.assignment.tobytes()
        if alike in seen:  # it could only tie, and ties go to the first
            notes.append(f"{name}: the placement {seen[alike]} offered; simulated once")
            continue
        seen[alike] = name
        try:
            p = _simulated(g, req, result, check_fit, bound)
        except InfeasibleError as e:
            first_error = first_error or e
            notes.append(f"{name}: {e}")
            continue
        if check_fit and not fits(p) and bound is not None and \
                p.predicted["iteration_s"] >= bound:
            notes.append(f"{name}: simulated {p.predicted['iteration_s'] * 1e3:.2f} ms before "
                         "it fits (memory policies only add time), already slower than the best "
                         "plan that fits; not fitted")
            beaten = beaten or bound == beat_s
            continue
        notes.append(candidate_note(name, p))
        t = replicated_floor(p, req, replicas)  # its time, at least, as replicas
        tried.append((t, k, p))
        if fits(p):
            bound = min(bound or math.inf, t)
    if check_fit and req.memory_policy != "none" and req.model_parallel_devices > 1 and \
            not beaten and not any(fits(t[2]) for t in tried):
        one = _on_one_device(g, req, bound)
        if one is not None:
            placed.append(("single", one[0]))
            notes.append(candidate_note("single", one[1]) + f" (nothing over the "
                         f"{req.model_parallel_devices} devices fits)")
            tried.append((one[1].predicted["iteration_s"], len(placed) - 1, one[1]))
    if not tried:
        if beaten:  # the placements that fit in time lost to another layout's plan
            assert beat_s is not None  # only another layout's plan beats a placement
            raise Beaten(f"every placement is slower than the best plan so far "
                         f"({beat_s * 1e3:.2f} ms) by the emulator, the simulator"
                         + (" or its replicas' compute" if replicas > 1 else ""))
        if first_error is not None:
            raise first_error
        raise InfeasibleError(f"no plan fits when simulated with the {req.first_schedule} schedule "
                              f"({'; '.join(notes)}): add devices or raise --memory")
    if fastest_copy is not None:  # by one copy's time (tried is ranked as replicas)
        fastest_copy.append(min(tried, key=lambda t: (not fits(t[2]),
                                                      t[2].predicted["iteration_s"], t[1]))[2])
    return _finished(g, req, placed, tried, notes, check_fit)


def _placed(g: Graph, req: PlanRequest, budget: float | None, check_fit: bool,
            replicas: int) -> tuple[list, list[str], InfeasibleError | None, list[float]]:
    """Every planner's placements of ``g`` (:func:`~outcore.search.threads.place`),
    the notes, the first refusal, and each placement's time by the emulator with port
    contention (as ``replicas`` GEMS replicas, at least its busiest device's compute over
    them). A graph above :data:`~outcore.placers.coarse.COARSEN_ABOVE` nodes is placed and
    emulated coarsened (:func:`~outcore.placers.coarse.coarsened`); the placements come
    back projected onto ``g``, whose simulation judges them."""
    co, names = _placement_call(g, req)
    pg = g if co is None else co.graph
    if names is None:
        # one device per copy: every planner would return this placement
        placed, notes, first_error = [("single", _all_on_one(pg, req, "one device per copy"))], \
            [], None
        runs = contended_runs(pg, req, placed)
    else:
        placed, notes, first_error, runs = place(pg, req, budget, names, check_fit,
                                                 contend=True)
    est = [as_replicated(req, em.busy_s, em.makespan_s, replicas) for em in runs]
    if co is not None:
        bound = make_context(g, req.model_parallel_devices, cluster=req.cluster.slots(req.fixed_tp),
                             optimizer=req.optimizer,
                             microbatches=req.fixed_microbatches).lower_bound_s()
        placed = [(name, co.projected(r, bound)) for name, r in placed]  # (each notes it)
    return placed, notes, first_error, est


def _finished(g: Graph, req: PlanRequest, placed: list, tried: list, notes: list[str],
              check_fit: bool) -> Plan:
    """The fastest of the simulated placements ``tried`` (one that fits first), coarsened,
    its schedule chosen (with ``schedule="auto"``), the others listed in its ``extra``."""
    _, k_best, best = min(tried, key=lambda t: (not fits(t[2]), t[0], t[1]))
    best = _coarsened(g, req, placed[k_best][1], best, check_fit)
    if req.schedule == "auto":  # placements were compared under req.first_schedule
        best = _scheduled(g, req, placed[k_best][1], best, check_fit)
        best = _runner_up_scheduled(g, req, placed, tried, k_best, best, check_fit)
    # the chosen plan first (coarsened, its schedule chosen), then the other placements
    best = best.replace(extra={**best.extra, "placements": [placement_row(best)] + [
        placement_row(p) for _, k, p in sorted(tried, key=lambda t: (t[0], t[1]))
        if k != k_best]})
    if req.strategy == "auto":
        best = best.with_notes(*notes, f"auto: chose {best.strategy}")
    return best


def _on_one_device(g: Graph, req: PlanRequest, bound_s: float | None):
    """``(result, plan)``: every node on the first device, the others idle, with the memory
    policies that make it fit; None when they cannot. Tried where no placement over the
    devices fits: a split's devices also hold the activations they pass on and receive, and
    one device with its parameters offloaded can fit where two halves cannot (the zoo MLP at
    20 KiB per device: 17.5 KiB on one; on either of two, 21.6 KiB after offloading all its
    parameters)."""
    result = _all_on_one(g, req, f"one device of {req.model_parallel_devices}: no placement "
                         "over them fits")
    try:
        p = _simulated(g, req, result, True, bound_s)
    except InfeasibleError:
        return None
    return (result, p) if fits(p) else None


def _all_on_one(g: Graph, req: PlanRequest, note: str):
    """Every node on the first model-parallel device, emulated, as a placement."""
    ctx = make_context(g, 1, cluster=req.cluster.slots(req.fixed_tp), optimizer=req.optimizer,
                       microbatches=req.fixed_microbatches)
    a = np.zeros(g.num_nodes, dtype=np.int64)
    em = run(ctx, a, critical_path=False)
    return PartitionResult(assignment=a, strategy="single", devices_used=1,
                           makespan_s=em.makespan_s, peak_bytes=em.peak_bytes,
                           lower_bound_s=ctx.lower_bound_s(), notes=(note,))


def _coarsened(g: Graph, req: PlanRequest, result, best: Plan, check_fit: bool) -> Plan:
    """``best`` with the pieces too small to pay for their runtime overhead and messages merged
    into a neighbour's device (:func:`outcore.placers.granularity.merge_small_pieces`, costed
    with the cluster's per-piece overheads and links), when the simulator finds that faster and
    it still fits; the plan's notes say so. Granularity as a planner decision."""
    if req.model_parallel_devices < 2 or req.strategy != "auto":  # a named planner's plan stays
        return best
    # a placement made on the coarsened graph is merged and emulated there too
    co = coarsened(g)
    on = None if co is None else co.on_clusters(result.assignment)
    mg, a = (g, result.assignment) if co is None or on is None else (co.graph, on)
    merged = merge_small_pieces(mg, a, req.cluster.slots(req.fixed_tp))
    if np.array_equal(merged, a):
        return best
    was, now = contended(mg, req, [(None, replace(result, assignment=a)),
                                   (None, replace(result, assignment=merged))])
    merged = merged if co is None or on is None else merged[co.group]
    moved = int((merged != result.assignment).sum())
    if now >= was:  # the emulator costs each piece as the simulator does: no gain to find
        return best.with_notes(f"granularity: merging {moved} node(s) of pieces too small to "
                               f"pay for their overhead emulates {now * 1e3:.2f} ms against "
                               f"{was * 1e3:.2f} ms; not simulated")
    try:
        p = _simulated(g, req, replace(result, assignment=merged,
                                       devices_used=int(np.unique(merged).size)), check_fit,
                       best.predicted["iteration_s"])
    except InfeasibleError:
        return best
    before, after = best.predicted["iteration_s"], p.predicted["iteration_s"]
    if (check_fit and not fits(p)) or after >= before:
        return best.with_notes(f"granularity: merging {moved} node(s) of pieces too small to "
                               f"pay for their overhead gives {after * 1e3:.2f} ms"
                               + _unfit(check_fit, p, after, before)
                               + f"; kept {before * 1e3:.2f} ms")
    return p.with_notes(*best.notes, f"granularity: moved {moved} node(s) of pieces too small to "
                        f"pay for their runtime overhead and messages to a neighbour's device: "
                        f"{before * 1e3:.2f} -> {after * 1e3:.2f} ms")


def _scheduled(g: Graph, req: PlanRequest, result, best: Plan, check_fit: bool,
               beat_s: float | None = None) -> Plan:
    """``best`` (1F1B), or its placement under GPipe when the simulator finds that faster by
    more than :data:`SCHEDULE_TIE` and it fits (the schedule as a search dimension). The two
    differ only with several micro-batches over several devices: GPipe runs every forward
    before any backward, which on a placement that is not a chain of stages can keep a device
    busy where 1F1B's order makes it wait (the ResNet generator's pipeline split at 300 GB/s:
    14.4 against 15.7 s), and holds more micro-batches' activations. ``beat_s``: GPipe must
    also be faster than that to count (its memory policies stop being sought once it is not)."""
    if int(req.microbatches) < 2 or best.used_devices < 2:
        return best
    before = best.predicted["iteration_s"]
    need = min(before * (1 - SCHEDULE_TIE), math.inf if beat_s is None else beat_s)
    try:
        p = _simulated(g, req.replace(schedule="gpipe"),
                       replace(result, assignment=best.assignment,
                               devices_used=best.used_devices), check_fit, need)
    except InfeasibleError as e:
        return best.with_notes(f"schedule: gpipe {e}; kept 1f1b")
    after = p.predicted["iteration_s"]
    if (check_fit and not fits(p)) or after >= need:
        return best.with_notes(f"schedule: gpipe simulated {after * 1e3:.2f} ms"
                               + _unfit(check_fit, p, after, need)
                               + f"; kept 1f1b ({before * 1e3:.2f} ms)")
    return p.replace(extra=best.extra, notes=best.notes).with_notes(
        f"schedule: gpipe {after * 1e3:.2f} ms, faster than 1f1b {before * 1e3:.2f} ms")


def _unfit(check_fit: bool, p: Plan, after: float, need: float) -> str:
    """What a note adds about an alternative ``p`` that did not fit: nothing when its time
    already lost (its memory policies were not completed: they only add time)."""
    if not check_fit or fits(p):
        return ""
    return " before it fits" if after >= need else " and does not fit"


# GPipe must beat 1F1B by this fraction to be chosen (1F1B holds fewer activations)
SCHEDULE_TIE = 0.01


# a placement this close to the best under 1F1B is tried under GPipe too
RUNNER_UP_MARGIN = 0.15


def _runner_up_scheduled(g: Graph, req: PlanRequest, placed: list, tried: list,
                         k_best: int, best: Plan, check_fit: bool) -> Plan:
    """``best``, or the second-fastest placement under 1F1B (within
    :data:`RUNNER_UP_MARGIN`, fitting) run with GPipe when that beats ``best`` by more than
    :data:`SCHEDULE_TIE`: a placement second under one schedule may be first under the other."""
    if int(req.microbatches) < 2:
        return best
    others = sorted((t for t in tried if t[1] != k_best and fits(t[2])),
                    key=lambda t: (t[0], t[1]))
    if not others or others[0][2].predicted["iteration_s"] > \
            best.predicted["iteration_s"] * (1 + RUNNER_UP_MARGIN):  # one copy's times
        return best
    _, k, second = others[0]
    before = best.predicted["iteration_s"]
    alt = _scheduled(g, req, placed[k][1], second, check_fit,  # second itself on one device
                     before * (1 - SCHEDULE_TIE))
    if alt.schedule != "gpipe":  # GPipe, when chosen, beat the bound it was given
        return best
    return alt.replace(extra=best.extra).with_notes(
        f"schedule: {alt.strategy} under gpipe {alt.predicted['iteration_s'] * 1e3:.2f} ms, "
        f"faster than the best 1f1b placement's {before * 1e3:.2f} ms")


def _simulated(g: Graph, req: PlanRequest, result, check_fit: bool,
               bound_s: float | None = None) -> Plan:
    """The plan of a partition result, with memory policies if needed, simulated (its
    schedule not checked: the search compares many; one is checked when lowered to run)."""
    K = req.model_parallel_devices
    p = make_plan(g, result.assignment, strategy=result.strategy, devices=K * req.fixed_tp,
                  layout=Layout(tp=req.fixed_tp), memory_bytes=req.memory_bytes,
                  schedule=req.first_schedule,
                  microbatches=req.microbatches, optimizer=req.optimizer,
                  cluster=req.cluster, notes=tuple(result.notes),
                  devices_used=result.devices_used)
    if check_fit and req.memory_bytes:
        p, sim = choose_simulated(g, p, mode=req.memory_policy, cluster=req.cluster,
                                  give_up_above_s=bound_s, checked=False)
    else:
        sim = simulate(p, g, cluster=req.cluster, checked=False)
    predicted = {**sim.to_dict(), "lower_bound_s": result.lower_bound_s,
                 "planner_makespan_s": result.makespan_s,
                 "planner_peak_bytes": np.asarray(result.peak_bytes).tolist()}
    return p.replace(predicted=predicted)
