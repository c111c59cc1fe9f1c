"""The search: from a :class:`~outcore.plan.request.PlanRequest` to the fastest plan that fits.

For each GEMS replica count the request allows, the search places one model copy on the
model-parallel devices with every planner of ``AUTO_CANDIDATES`` (or the one asked for), makes
each placement fit with per-piece memory policies where needed, replicates the best one
(GEMS MAST/MASTER, data parallelism) and keeps the plan the simulator — which runs the schedule
the runtime executes — finds fastest among those that fit. Every candidate's outcome is kept in
the plan's notes. No torch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from outcore.cost.tensor import plan_layout, tensor_graph
from outcore.errors import InfeasibleError, UsageError
from outcore.graph.ir import Graph
from outcore.graph.tensor_pairs import TensorLayout
from outcore.hardware.allocator import frozen_objects
from outcore.partition.placements import (contended, contended_runs, not_simulated, place,
                                           place_ahead, placements_made, to_simulate)
from outcore.partition.replicated import (as_replicated, better_replicated, fits,  # noqa: F401
                                        replicate, replicated_floor)
from outcore.plan.layout import Layout
from outcore.plan.plan import Plan, make_plan
from outcore.plan.request import PlanRequest

if TYPE_CHECKING:
    from outcore.partition.coarse import Coarse

log = logging.getLogger(__name__)

__all__ = ["AUTO_CANDIDATES", "fits", "search"]

AUTO_CANDIDATES = ("pardnn", "pipeline", "subgraph", "contiguous")


def search(g: Graph, req: PlanRequest, *, check_suggestions: bool = True,
           progress: Callable[[str, int, int], None] | None = None) -> Plan:
    """The fastest plan for ``g`` that fits the request (``predicted`` from the simulator).

    The graph is one micro-batch: an iteration runs ``req.microbatches`` micro-batches of
    ``g.batch_size`` samples on each copy of the model. Raises :class:`InfeasibleError` when
    nothing fits; the device count and memory it suggests instead are ones this search has
    planned and found to fit (``check_suggestions``), never unchecked estimates.
    ``progress(phase, done, total)`` is called as the layout search plans each layout.

    While it runs, the objects that existed before it (the graph, a loaded model, torch's
    modules) are left out of the garbage collector's scans
    (:func:`outcore.hardware.allocator.frozen_objects`), and a placement simulated once is
    not simulated again (:func:`outcore.sim.simulate.remembered`).
    """
    from outcore.sim.simulate import remembered

    with frozen_objects(), remembered():
        return _searched(g, req, check_suggestions, progress)


def _searched(g: Graph, req: PlanRequest, check_suggestions: bool,
              progress: Callable[[str, int, int], None] | None = None) -> Plan:
    if req.sp > 1:  # MPI4DL SP + LP: tiled prefix, then the ordinary search on the rest
        from outcore.partition.spatial import plan_spatial
        return plan_spatial(g, req, lambda graph, r: search(graph, r, check_suggestions=False))
    # the layout search enumerates tp and depth itself
    if req.tp is None and not req.search_layout:
        return _search_degrees(g, req, "tp", req.tp_options(), check_suggestions)
    if req.depth is None and not req.search_layout:
        return _search_degrees(g, req, "depth", req.depth_options(), check_suggestions)
    try:
        return _dispatch(g, req, progress)
    except InfeasibleError as e:
        if not check_suggestions:
            raise
        from outcore.partition.refusal import checked_refusal
        raise checked_refusal(g, req, e, progress=progress) from None


# the option each searched degree comes from, and what the search calls it
_DEGREES = {"tp": ("--tp", "tensor-parallel"), "depth": ("--shard", "sharding")}


def _search_degrees(g: Graph, req: PlanRequest, field: str, options: list[int],
                    check_suggestions: bool) -> Plan:
    """``--tp auto`` / ``--shard auto``: the fastest plan that fits over ``options`` of the
    request's ``field``; the plan's notes give every degree's outcome."""
    flag, what = _DEGREES[field]
    best: Plan | None = None
    notes: list[str] = []
    errors: dict[int, Exception] = {}
    for t in options:
        try:
            p = search(g, req.replace(**{field: t}), check_suggestions=False)
        except (InfeasibleError, UsageError) as e:
            errors[t] = e
            notes.append(f"{field} {t}: {str(e).split('; ')[0]}")
            continue
        ok = fits(p)
        notes.append(f"{field} {t}: {p.predicted['iteration_s'] * 1e3:.2f} ms per iteration, "
                     f"peak {max(p.predicted['peak_bytes']) / 2**20:.1f} MiB"
                     + ("" if ok else " (does not fit)"))
        if ok and (best is None or p.predicted["iteration_s"] < best.predicted["iteration_s"]):
            best = p
    plain = errors.get(1)
    if best is None and isinstance(plain, InfeasibleError):
        # the refusal of the plain request, with its checked suggestions
        from outcore.partition.refusal import checked_refusal
        raise checked_refusal(g, req.replace(**{field: 1}), plain) if check_suggestions \
            else plain
    if best is None:
        raise InfeasibleError(f"no {what} degree fits ({'; '.join(notes)})")
    t = getattr(best.layout, field)
    why = "the fastest that fits" if len(notes) > 1 else "the only degree tried"
    return best.with_notes(*notes, f"{flag} auto: chose {field} {t} ({why})")


def _dispatch(g: Graph, req: PlanRequest,
              progress: Callable[[str, int, int], None] | None = None) -> Plan:
    """The layout search when the request leaves the layout or the micro-batches open
    (:func:`outcore.partition.layouts.search_layouts`, which costs each layout's tensor split
    at its micro-batch), else the placement search on ``g`` costed for the request's ``tp``."""
    if req.whole_batch:
        from outcore.partition.layouts import search_layouts
        return search_layouts(g, req, progress)
    tg, layout = tensor_split(g, req)
    return with_grid_note(_search(tg, req), layout, req)


def with_grid_note(p: Plan, layout: TensorLayout, req: PlanRequest) -> Plan:
    """``p`` with a note on AxoNN's row x column grid when it is tensor-parallel (``layout``:
    its tensor-parallel layout): what the largest pair's collectives take on the plan's 1-D
    layout and on the best grid (:func:`outcore.cost.grid.grid_note`)."""
    if p.layout.tp == 1:
        return p
    from outcore.cost.grid import grid_note

    note = grid_note(layout, req.cluster)
    return p.with_notes(note) if note else p


class Beaten(InfeasibleError):
    """A layout's search stopped: its placements are already slower than ``beat_s``, the
    time another layout's plan has (:func:`_search`); its plan could not win."""


def _search(g: Graph, req: PlanRequest, beat_s: float | None = None) -> Plan:
    """The best plan of the request's layout. ``beat_s``: the time a plan must be under to
    matter (another layout's; the layout search passes it): placements the emulator finds
    :data:`~outcore.partition.placements.PRUNE_RATIO` times slower are not simulated, and
    once the best placement is no faster the layout's search stops (:class:`Beaten`), as
    copies and replicas only add time."""
    from outcore.partition import STRATEGIES

    if req.strategy not in ("auto", "single") and req.strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy {req.strategy!r}: use auto or one of "
                         f"{', '.join(STRATEGIES)}")
    if req.devices == req.tp and req.strategy in ("auto", "single"):
        return single(g, req)
    best: Plan | None = None
    notes: list[str] = []
    first_error: InfeasibleError | None = None
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
    if best is None:
        if first_error is not None:
            raise first_error
        raise InfeasibleError(f"no {req.parallel} plan fits {req.memory_bytes} bytes per device "
                              f"({'; '.join(notes)}): add devices or raise --memory")
    if len(req.replica_options()) > 1 or req.dp > 1:
        best = best.with_notes(*notes)
    return best


def single(g: Graph, req: PlanRequest) -> Plan:
    """Everything on one device, with the memory policies that make it fit."""
    from outcore.partition.memory_policy import choose_simulated

    p = make_plan(g, np.zeros(g.num_nodes, dtype=np.int64), strategy="single",
                  devices=req.tp, layout=Layout(tp=req.tp), memory_bytes=req.memory_bytes,
                  microbatches=req.microbatches,
                  schedule=req.first_schedule,
                  optimizer=req.optimizer, cluster=req.cluster)
    try:
        p, sim = choose_simulated(g, p, mode=req.memory_policy, cluster=req.cluster)
    except InfeasibleError as e:
        raise InfeasibleError(f"{e}; or train on several devices (--devices)",
                              min_devices=e.min_devices,
                              min_memory_bytes=e.min_memory_bytes) from None
    return p.replace(predicted=sim.to_dict())


def tensor_costed(g: Graph, req: PlanRequest) -> Graph:
    """``g`` costed as one rank of the request's tensor-parallel group sees it (``g`` itself
    for ``tp = 1``): every planner then places device slots of ``tp`` ranks."""
    return tensor_split(g, req)[0]


def tensor_split(g: Graph, req: PlanRequest) -> tuple[Graph, TensorLayout]:
    """:func:`tensor_costed`, and the tensor-parallel layout it costed."""
    if req.tp == 1:
        return g, TensorLayout(tp=1, pairs=(), splits=())
    layout = plan_layout(g, req.tp)
    if not layout.split_modules:
        raise InfeasibleError(f"--tp {req.tp}: no layer of {g.name!r} can be split {req.tp} "
                              f"ways (split: an nn.Linear / nn.Embedding, or in a "
                              f"torch.export graph Hugging Face's Conv1D, called once, with a "
                              f"width divisible by {req.tp} and, outside a Megatron pair, at "
                              f"least 1 MiB of parameters; convolutions, norms and layers "
                              f"shared across calls stay whole); use --tp 1")
    return tensor_graph(g, req.tp, req.cluster.link(0, 1), layout=layout)[0], layout


def shard_costed(g: Graph, depth: int) -> Graph:
    """``g`` with each layer's parameter state as one of ``depth`` shards holds it: what the
    placement of a sharded plan budgets (the gathers' working memory and time are the
    lowering's: :func:`outcore.schedule.lower.shard_units`)."""
    return g.replace(param_bytes=np.ceil(g.param_bytes / depth).astype(g.param_bytes.dtype))


def _replicated_plan(g: Graph, req: PlanRequest, replicas: int,
                     beat_s: float | None = None) -> Plan:
    """The best single-copy placement under ``memory / replicas``, replicated and simulated
    (not when the copy alone is no faster than ``beat_s``: :class:`Beaten`)."""
    placed_g, budget, check_fit = _placement_input(g, req, replicas)
    if req.depth > 1:  # placed by the shards' memory; the sharded plan is simulated below
        base = _best_placement(placed_g, req, budget, check_fit=check_fit, beat_s=beat_s)
    else:
        fastest: list[Plan] = []
        base = _best_placement(placed_g, req, budget, check_fit=check_fit, beat_s=beat_s,
                               replicas=replicas, fastest_copy=fastest)
        if replicas == 1 and req.dp == 1:
            return base
        if fastest and not np.array_equal(fastest[0].assignment, base.assignment) and \
                (beat_s is None or replicated_floor(fastest[0], req, replicas) < beat_s):
            return better_replicated(g, req, replicas, base, fastest[0], beat_s)
    floor = replicated_floor(base, req, replicas)
    if beat_s is not None and floor >= beat_s:
        raise Beaten(f"its replicas need at least {floor * 1e3:.2f} ms (one copy's compute "
                     f"on each device, summed over the replicas it holds), no faster than the "
                     f"best plan so far ({beat_s * 1e3:.2f} ms); not replicated")
    return replicate(g, base, req, replicas)


def _placement_input(g: Graph, req: PlanRequest, replicas: int
                     ) -> tuple[Graph, float | None, bool]:
    """What one copy of ``replicas`` GEMS replicas is placed on: ``(graph, memory budget per
    device, whether placements must fit it)`` (a sharded layout: the shards' memory)."""
    mem = req.memory_bytes
    budget = None if mem is None else mem / replicas
    if req.depth > 1:
        return shard_costed(g, req.depth), budget, True
    return g, budget, replicas == 1


def place_next(g: Graph, req: PlanRequest) -> bool:
    """Start the placements :func:`_search` of ``(g, req)`` begins with on the layout search's
    planner threads (:func:`~outcore.partition.placements.place_ahead`), while this thread
    finishes another layout; they are the same placements, only made earlier. Returns whether
    they started (not for a layout of one device per copy, nor a sharded one, whose search
    the layout search tries only where plain copies do not fit)."""
    if req.depth > 1 or (req.devices == req.tp and req.strategy in ("auto", "single")):
        return False
    placed_g, budget, check_fit = _placement_input(g, req, req.replica_options()[0])
    co, names = _placement_call(placed_g, req)
    return names is not None and place_ahead(placed_g if co is None else co.graph, req, budget,
                                             names, check_fit, contend=True)


def _placement_call(g: Graph, req: PlanRequest) -> tuple[Coarse | None, tuple[str, ...] | None]:
    """``(g's coarsened copy or None, the planners)`` of :func:`_placed`: the copy is what they
    place; no planner (None) with one device per copy."""
    from outcore.partition.coarse import coarsened

    names = None if req.strategy == "auto" and req.model_parallel_devices == 1 else \
        (AUTO_CANDIDATES if req.strategy == "auto" else (req.strategy,))
    return coarsened(g), names


def _best_placement(g: Graph, req: PlanRequest, budget: float | None, *,
                    check_fit: bool, beat_s: float | None = None, replicas: int = 1,
                    fastest_copy: list | None = None) -> Plan:
    """The fastest single-replica plan on the model-parallel devices, planned under ``budget``
    per device; with ``check_fit`` only plans whose simulated peak fits the limit count.

    Emulator first, simulator for the best few: every planner places the graph (the node-level
    emulator times each placement in milliseconds); every contiguous split and the
    :data:`~outcore.partition.placements.SIMULATED_PER_SEARCH` fastest other placements by the
    emulator with port contention (:func:`~outcore.partition.placements.contended`) are made
    to fit with memory policies and simulated (the simulator costs a lowering and an event run
    each), fastest first, except those the contended emulation finds
    :data:`~outcore.partition.placements.PRUNE_RATIO` times slower than the best simulated
    plan that fits, or than ``beat_s`` (another layout's plan:
    :func:`_search`; :class:`Beaten` when none is left) or, as ``replicas`` GEMS replicas,
    no faster than ``beat_s`` by their compute alone
    (:func:`~outcore.partition.placements.not_simulated`). Where nothing over the devices
    fits, every node on one device is tried too (:func:`_on_one_device`).
    ``fastest_copy``: a list to receive the simulated placement fastest as one copy."""
    placed, notes, first_error, est = _placed(g, req, budget, check_fit, replicas)
    placements_made()  # the layout search may start the next layout's placements now
    chosen = to_simulate(placed, est)
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
        notes.append(_candidate_note(name, p))
        t = replicated_floor(p, req, replicas)  # its time, at least, as replicas
        tried.append((t, k, p))
        if fits(p):
            bound = min(bound or math.inf, t)
    if check_fit and req.memory_policy != "none" and req.model_parallel_devices > 1 and \
            not beaten and not any(fits(t[2]) for t in tried):
        one = _on_one_device(g, req, bound)
        if one is not None:
            placed.append(("single", one[0]))
            notes.append(_candidate_note("single", one[1]) + f" (nothing over the "
                         f"{req.model_parallel_devices} devices fits)")
            tried.append((one[1].predicted["iteration_s"], len(placed) - 1, one[1]))
    if not tried:
        if beaten:  # the placements that fit in time lost to another layout's plan
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
    """Every planner's placements of ``g`` (:func:`~outcore.partition.placements.place`),
    the notes, the first refusal, and each placement's time by the emulator with port
    contention (as ``replicas`` GEMS replicas, at least its busiest device's compute over
    them). A graph above :data:`~outcore.partition.coarse.COARSEN_ABOVE` nodes is placed and
    emulated coarsened (:func:`~outcore.partition.coarse.coarsened`); the placements come
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
        from outcore.partition.context import make_context
        bound = make_context(g, req.model_parallel_devices, cluster=req.cluster.slots(req.tp),
                             optimizer=req.optimizer,
                             microbatches=req.microbatches).lower_bound_s()
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
    from outcore.partition.context import make_context
    from outcore.partition.emulate import run
    from outcore.partition.result import PartitionResult

    ctx = make_context(g, 1, cluster=req.cluster.slots(req.tp), optimizer=req.optimizer,
                       microbatches=req.microbatches)
    a = np.zeros(g.num_nodes, dtype=np.int64)
    em = run(ctx, a, critical_path=False)
    return PartitionResult(assignment=a, strategy="single", devices_used=1,
                           makespan_s=em.makespan_s, peak_bytes=em.peak_bytes,
                           lower_bound_s=ctx.lower_bound_s(), notes=(note,))


def placement_row(p: Plan) -> dict:
    """A placement as ``outcore plan --explain`` lists it (the schedule when not 1F1B)."""
    return {"strategy": p.strategy + (f" ({p.schedule})" if p.schedule != "1f1b" else ""),
            "iteration_s": float(p.predicted["iteration_s"]),
            "peak_bytes": float(max(p.predicted["peak_bytes"])), "fits": fits(p)}


def _coarsened(g: Graph, req: PlanRequest, result, best: Plan, check_fit: bool) -> Plan:
    """``best`` with the pieces too small to pay for their runtime overhead and messages merged
    into a neighbour's device (:func:`outcore.partition.granularity.merge_small_pieces`, costed
    with the cluster's per-piece overheads and links), when the simulator finds that faster and
    it still fits; the plan's notes say so. Granularity as a planner decision (issue 17)."""
    from outcore.partition.coarse import coarsened
    from outcore.partition.granularity import merge_small_pieces
    if req.model_parallel_devices < 2 or req.strategy != "auto":  # a named planner's plan stays
        return best
    # a placement made on the coarsened graph is merged and emulated there too
    co = coarsened(g)
    on = None if co is None else co.on_clusters(result.assignment)
    mg, a = (g, result.assignment) if on is None else (co.graph, on)
    merged = merge_small_pieces(mg, a, req.cluster.slots(req.tp))
    if np.array_equal(merged, a):
        return best
    was, now = contended(mg, req, [(None, replace(result, assignment=a)),
                                   (None, replace(result, assignment=merged))])
    merged = merged if on is None else merged[co.group]
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


def _candidate_note(name: str, p: Plan) -> str:
    pol = p.policies
    return (f"{name}: simulated {p.predicted['iteration_s'] * 1e3:.2f} ms per iteration, peak "
            f"{max(p.predicted['peak_bytes']) / 2**20:.1f} MiB"
            + (f", memory policies on {int((pol.group_of >= 0).sum())} nodes" if pol else ""))


def _simulated(g: Graph, req: PlanRequest, result, check_fit: bool,
               bound_s: float | None = None) -> Plan:
    """The plan of a partition result, with memory policies if needed, simulated (its
    schedule not checked: the search compares many; one is checked when lowered to run)."""
    from outcore.partition.memory_policy import choose_simulated
    from outcore.sim.simulate import simulate

    K = req.model_parallel_devices
    p = make_plan(g, result.assignment, strategy=result.strategy, devices=K * req.tp,
                  layout=Layout(tp=req.tp), memory_bytes=req.memory_bytes,
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
