"""One enumeration of layouts: data x GEMS replicas x micro-batches (x tensor x spatial), pruned
by cheap bounds before any placement is simulated (no torch).

Alpa and FlexFlow search the parallel layout instead of asking the user for it; outcore's
search does the same over its process mesh (:class:`~outcore.plan.layout.Layout`):

1. **Enumerate** (:func:`candidate_layouts`): every ``dp`` dividing the devices, every GEMS mode
   and replica count that fits the model-parallel devices (MP-Basic, MAST, MASTER with 4 and 8
   replicas; Jain et al., SC 2020), every micro-batch count dividing one copy's batch, every
   tensor-parallel degree of 1, 2, 4 and 8 that divides the devices and splits a layer
   (Megatron-LM; with ``sp`` from the request, which does not compose with ``tp``); with
   several data-parallel copies, plain copies and copies that shard the parameter state
   (``depth``: every divisor of ``dp``, or the request's). A fixed request field (``dp``,
   ``parallel``, ``replicas``, ``tp``, a number of micro-batches) fixes that dimension.
2. **Bound** each layout without placing anything, on the graph costed as one tensor-parallel
   rank sees it (:func:`outcore.cost.tensor.tensor_graph`): its time cannot beat
   ``max(total work / device slots, critical path of one micro-batch)``, and a device must hold at
   least ``(state x parameters x replicas + one micro-batch's saved activations) / stages``
   (parameters only, when memory policies may drop activations).
3. **Prune and evaluate** (:func:`search_layouts`): gradient accumulation before checkpointing —
   a first pass allows no memory policy, a second (only when nothing fits) the request's. Layouts
   whose memory floor exceeds the limit, or whose time bound cannot beat the best simulated plan,
   are skipped; the others are planned by the placement search (emulator first, simulator for the
   best few). Every candidate's outcome is kept in ``plan.extra["candidates"]`` (compact: one
   record each) for ``outcore plan --explain``.

The graph of a request with ``whole_batch`` holds the global batch of one iteration; each layout
plans on it rescaled to its micro-batch (:func:`outcore.graph.batch.at_microbatch`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from outcore.cost.memory import state_factor
from outcore.errors import InfeasibleError, OutcoreError, UsageError
from outcore.graph.algorithms import longest_to_sinks
from outcore.graph.batch import at_microbatch, divisors
from outcore.graph.ir import Graph
from outcore.partition.placements import current_threads, shared_threads
from outcore.plan.plan import Plan
from outcore.plan.request import PlanRequest
from outcore.units import format_bytes

log = logging.getLogger(__name__)

__all__ = ["LayoutChoice", "candidate_layouts", "search_layouts"]

# most micro-batches per copy the search tries
MAX_MICROBATCHES = 64
# larger micro-batch counts tried after the first that fits, per (dp, mode) (pipelines fill)
EXTRA_MICROBATCH_STEPS = 2
# set while a refusal checks whether anything fits (:func:`any_fit`): the layout search then
# stops at the first layout with a plan that fits, not the fastest
_FIRST_FIT: contextvars.ContextVar[bool] = contextvars.ContextVar("first_fit", default=False)
# plans within this fraction of the fastest count as ties: the fewest micro-batches, then the
# least data parallelism, wins (the simulator's per-micro-batch overheads are optimistic)
TIE = 0.01
# a layout's placement search is bounded by the best plan of the layouts searched before it
# (``search._search``'s ``beat_s``): placements the emulator finds slower are not simulated,
# and a layout whose one copy is already no faster is not replicated. Off: every layout is
# planned to the end (tests that check each layout's bound against its plan)
BOUND_ACROSS_LAYOUTS = True


@dataclass(frozen=True, kw_only=True)
class LayoutChoice:
    """One candidate layout with its cheap bounds.

    Attributes:
        dp, parallel, replicas, tp, sp, depth: the mesh (``replicas`` 1 for ``mp``; ``depth``
            copies shard the parameter state).
        microbatches: micro-batches per iteration and model copy.
        samples: samples per micro-batch.
        time_bound_s: no plan of this layout is faster (total work / devices, critical path).
        params_floor_bytes: per device, parameter state alone (floor with memory policies).
        memory_floor_bytes: per device, parameter state plus one micro-batch's activations.
    """

    dp: int
    parallel: str
    replicas: int
    microbatches: int
    samples: int
    tp: int = 1
    sp: int = 1
    depth: int = 1
    time_bound_s: float = 0.0
    params_floor_bytes: float = 0.0
    memory_floor_bytes: float = 0.0

    @property
    def label(self) -> str:
        mode = self.parallel if self.parallel != "master" else f"master x{self.replicas}"
        mesh = "".join(f" x {k} {v}" for k, v in (("shard", self.depth), ("tp", self.tp),
                                                  ("sp", self.sp)) if v > 1)
        return f"dp {self.dp} x {mode}{mesh}, {self.microbatches} x {self.samples} samples"

    def request(self, req: PlanRequest, memory_policy: str) -> PlanRequest:
        """``req`` fixed to this layout (the placement search's request)."""
        return req.replace(dp=self.dp, parallel=self.parallel, microbatches=self.microbatches,
                           replicas=self.replicas if self.parallel == "master" else None,
                           tp=self.tp, sp=self.sp, depth=self.depth,
                           memory_policy=memory_policy,
                           search_layout=False)

    def floor(self, memory_policy: str) -> float:
        return self.params_floor_bytes if memory_policy != "none" else self.memory_floor_bytes


def _modes(req: PlanRequest, stages: int) -> list[tuple[str, int]]:
    """(GEMS mode, replicas) pairs for ``stages`` model-parallel devices."""
    if not req.search_layout:
        if req.parallel != "mp" and stages < 2:
            return []
        return [(req.parallel, r) for r in req.replica_options()]
    out = [("mp", 1)]
    if stages >= 2:
        out.append(("mast", 2))
    out += [("master", r) for r in (4, 8) if r <= stages]
    return out


class _Totals:
    """What the bounds of one tensor-parallel degree's layouts read off its costed graph (of
    the global batch): one rank's work and critical path, parameter state, saved activations.

    ``fixed_s`` is what every node's forward and backward cost at any micro-batch size (the
    device's launch cost, as :func:`~outcore.graph.batch.at_microbatch` keeps it): a layout
    that runs the model ``n`` times per iteration (copies x micro-batches) does ``n`` times
    that part of the work and the rest once, and its critical path is the rescaled graph's.
    """

    def __init__(self, g: Graph, optimizer: str, fixed_s: float = 0.0) -> None:
        fwd, bwd = np.asarray(g.fwd_s, np.float64), np.asarray(g.bwd_s, np.float64)
        self._g = g
        self._fixed = np.minimum(fwd, fixed_s) + np.minimum(bwd, fixed_s)
        self._rest = fwd + bwd - self._fixed
        self.work_s = float((fwd + bwd).sum())
        self.fixed_work_s = float(self._fixed.sum())
        self.params_bytes = float(g.param_bytes.sum()) * state_factor(optimizer)
        self.saved_bytes = float(g.saved_bytes.sum())
        self._paths: dict[float, float] = {}

    def work_at(self, runs: int) -> float:
        """Work of ``runs`` runs of the model that together process the global batch once."""
        return self.fixed_work_s * runs + (self.work_s - self.fixed_work_s)

    def path_at(self, scale: float) -> float:
        """Critical path (forward + backward) of one micro-batch of ``scale`` x the batch."""
        if scale not in self._paths:
            g = self._g
            self._paths[scale] = (float(longest_to_sinks(
                g, self._fixed + self._rest * scale, np.zeros(g.num_edges)).max())
                if g.num_nodes else 0.0)
        return self._paths[scale]


def tensor_degrees(g: Graph, req: PlanRequest) -> tuple[dict[int, _Totals], list[str]]:
    """The tensor-parallel degrees the layouts of ``req`` may use, each with its totals: the
    request's ``tp``, or (``tp=None``) 1, 2, 4 and 8 that divide the devices (none with
    ``sp``); and a note for each degree no layer of ``g`` splits into."""
    from outcore.partition.search import tensor_costed

    if req.tp is not None:
        options = [req.tp]
    else:
        options = [t for t in (1, 2, 4, 8) if req.devices % (t * req.sp) == 0
                   and (t == 1 or req.sp == 1)]
    totals: dict[int, _Totals] = {}
    notes: list[str] = []
    for t in options:
        try:
            # a split layer's launch cost is not the one the rescaling keeps (it divides
            # the node's time by tp): its bound scales the whole time, which stays below it
            totals[t] = _Totals(tensor_costed(g, req.replace(tp=t)), req.optimizer,
                                _fixed_s(req) if t == 1 else 0.0)
        except InfeasibleError as e:
            if req.tp is not None:
                raise
            notes.append(str(e).split(" (")[0])  # "--tp N: no layer of ... can be split"
    return totals, notes


def candidate_layouts(g: Graph, req: PlanRequest,
                      degrees: dict[int, _Totals] | None = None) -> list[LayoutChoice]:
    """Every layout the request allows, with bounds, in enumeration order (tp, dp, mode, M):
    plain layouts first, so that their plans prune the tensor-parallel ones by time.

    This is the one place layouts are enumerated: a new dimension (spatial degree) adds its
    values here. ``g`` holds the global batch when ``req.whole_batch``, else one micro-batch
    (then the request's own layout is the only candidate). ``degrees``: the tensor-parallel
    degrees and their totals (default: :func:`tensor_degrees`).
    """
    B = int(g.batch_size or 1)
    if degrees is None:
        degrees = tensor_degrees(g, req)[0]
    if not req.whole_batch:
        M = int(req.microbatches)
        copies = req.dp * (req.replica_options()[0] if req.parallel != "mp" else 1)
        totals = degrees[req.tp]  # of one micro-batch: every run does all of its work
        return [_choice(req.dp, req.parallel, req.replica_options()[0], M, B, req,
                        totals, 1.0, req.depth or 1, req.tp, work_s=totals.work_s * M * copies)]
    out: list[LayoutChoice] = []
    for tp, totals in degrees.items():
        for dp in (divisors(req.devices) if req.search_layout else [req.dp]):
            if req.devices % (dp * tp * req.sp):
                continue
            stages = req.devices // (dp * tp * req.sp)
            for mode, R in _modes(req, stages):
                copies = dp * R
                if B % copies:
                    continue
                per_copy = B // copies
                counts = (divisors(per_copy, at_most=MAX_MICROBATCHES)
                          if req.microbatches == "auto" else [int(req.microbatches)])
                for M in counts:
                    if per_copy % M:
                        continue
                    for depth in _depths(req, dp, mode):
                        out.append(_choice(dp, mode, R, M, per_copy // M, req, totals,
                                           (per_copy // M) / B, depth, tp,
                                           work_s=totals.work_at(copies * M)))
    return out


def _depths(req: PlanRequest, dp: int, mode: str) -> list[int]:
    """Sharding degrees of ``dp`` copies: the request's (where it divides), else every
    divisor of ``dp`` (none with GEMS replicas, which are not sharded)."""
    if req.depth is not None:
        return [req.depth] if dp % req.depth == 0 else []
    return divisors(dp) if mode == "mp" else [1]


def _choice(dp: int, mode: str, R: int, M: int, samples: int, req: PlanRequest,
            totals: _Totals, scale: float, depth: int, tp: int, *,
            work_s: float) -> LayoutChoice:
    """One layout with its bounds; ``totals`` are one tensor-parallel rank's (of ``tp``),
    ``work_s`` that rank's work over the iteration, ``scale`` a micro-batch's share of the
    graph's batch."""
    stages = max(req.devices // (dp * tp * req.sp), 1)
    R = R if mode != "mp" else 1
    own = totals.params_bytes * R / (stages * req.sp * depth)
    return LayoutChoice(dp=dp, parallel=mode, replicas=R, microbatches=M, samples=samples,
                        tp=tp, sp=req.sp, depth=depth,
                        time_bound_s=max(work_s * tp / req.devices, totals.path_at(scale)),
                        params_floor_bytes=own,
                        memory_floor_bytes=own + totals.saved_bytes * scale / (stages * req.sp))


def _no_layout_fits(req: PlanRequest, choices: list[LayoutChoice]) -> InfeasibleError:
    """The refusal when every layout's memory floor exceeds the limit, with estimates of the
    memory and the devices that would fit from the lowest floor (the search's caller checks
    them by planning: :func:`outcore.partition.refusal.checked_refusal`)."""
    floor = min(c.floor(req.memory_policy) for c in choices)
    mem = req.memory_bytes
    devices = max(math.ceil(req.devices * floor / mem), req.devices + 1) if mem else None
    return InfeasibleError(f"no layout of {req.devices} devices fits {format_bytes(mem or 0)} "
                           "per device, even with more micro-batches: add devices or raise "
                           "--memory", min_devices=devices, min_memory_bytes=floor)


@contextlib.contextmanager
def any_fit():
    """Within the block the layout search returns the first plan that fits it finds (a
    refusal's checks ask whether anything fits, not what is fastest)."""
    token = _FIRST_FIT.set(True)
    try:
        yield
    finally:
        _FIRST_FIT.reset(token)


def search_layouts(g: Graph, req: PlanRequest,
                   progress: Callable[[str, int, int], None] | None = None) -> Plan:
    """The fastest plan over every layout :func:`candidate_layouts` allows (see the module
    docstring for the passes and the pruning); ``plan.extra["candidates"]`` records them all.
    ``progress(phase, done, total)`` follows the layouts of each pass."""
    from outcore.partition.search import with_grid_note

    if not g.batch_size and req.search_layout:
        raise UsageError(f"graph {g.name!r} does not record the batch its costs are for: the "
                         "layout search splits that batch over data-parallel copies, replicas "
                         "and micro-batches; capture the model with outcore (which records "
                         "it), set \"batch_size\" in the graph's JSON, or give the layout "
                         "(--dp, --parallel, --microbatches N) instead of --layout auto")
    degrees, tp_notes = tensor_degrees(g, req)
    choices = candidate_layouts(g, req, degrees)
    if not choices:
        raise UsageError(f"the batch of {g.batch_size} samples does not split over any layout "
                         f"of {req.devices} devices: make the batch a multiple of the devices, "
                         "or pass --microbatches and --dp")
    graphs = _Rescaled(g, _fixed_s(req))
    records: list[dict[str, Any]] = []
    best: list[Any] = []  # [key, plan, record] of the best plan so far
    errors: list[InfeasibleError] = []
    groups = _groups(choices)
    with shared_threads():  # the next layout's placements start while one is simulated
        for policy in ["none"] + ([req.memory_policy] if req.memory_policy != "none" else []):
            start = len(records)
            phase = "planning layouts" + (f" (memory policy {policy})" if policy != "none"
                                          else "")
            for i, group in enumerate(groups):
                if progress:
                    progress(phase, len(records) - start, len(choices))
                if group[0].depth > 1 and _fits_unsharded(group[0], records):
                    # sharding is a memory lever: never tried where plain copies fit already
                    records += [{**_record(c, policy), "outcome": "not tried: the copies fit "
                                 "without sharding"} for c in group]
                    continue
                _search_group(graphs, req, group, policy, records, best, errors,
                              upcoming=groups[i + 1:])
                if best and _FIRST_FIT.get():
                    break
            if progress:
                progress(phase, len(records) - start, len(choices))
            if best:
                break
    if not best:
        if errors:
            raise errors[0]
        raise _no_layout_fits(req, choices)
    _, plan, chosen = best
    for rec in records:
        if rec is chosen:
            rec["outcome"] = "chosen"
        elif rec["outcome"] == "fits":
            rec["outcome"] = _why_lost(rec, plan)
    fitting = sum(r["outcome"] == "chosen" or r["outcome"].startswith(("slower", "tie"))
                  for r in records)
    note = (f"layout search: {len(records)} layouts considered, {fitting} fit; chose "
            f"{chosen['layout']} (memory policy {chosen['memory_policy']})")
    if plan.layout.tp > 1:  # the chosen layout's split, for its note on the 2-D grid
        from outcore.cost.tensor import plan_layout
        small = graphs(chosen["samples"], 1, req)
        plan = with_grid_note(plan, plan_layout(small, plan.layout.tp), req)
    return plan.replace(extra={**plan.extra, "candidates": records},
                        predicted=_bound_over_layouts(plan.predicted, records)
                        ).with_notes(*tp_notes, note)


def _bound_over_layouts(predicted: dict[str, Any], records: list[dict[str, Any]]
                        ) -> dict[str, Any]:
    """``predicted`` with ``lower_bound_s`` the lowest bound of any layout the search
    enumerated (the layouts compete: the chosen one's own bound says nothing of the others),
    and that layout's own as ``layout_lower_bound_s``."""
    own = predicted.get("lower_bound_s")
    bounds = [float(r["time_bound_s"]) for r in records] + ([own] if own is not None else [])
    return {**predicted, "lower_bound_s": min(bounds) if bounds else None,
            "layout_lower_bound_s": own}


def _fixed_s(req: PlanRequest) -> float:
    """What a node's time keeps at any micro-batch size: the device's launch cost."""
    return float(req.cluster.device.launch_s)


class _Rescaled:
    """The graph at each micro-batch size and tensor-parallel degree the layouts ask for, made
    once: layouts of the same micro-batch (dp 2 x 2 and dp 1 x 4 micro-batches of a quarter)
    plan on the same graph, so what the planners remember per graph (topological orders, the
    fork-join regions, contexts) serves them all."""

    def __init__(self, g: Graph, fixed_s: float) -> None:
        self.g, self.fixed_s = g, fixed_s
        self._made: dict[tuple[int, int], Graph] = {}

    def __call__(self, samples: int, tp: int, req: PlanRequest) -> Graph:
        from outcore.partition.search import tensor_costed

        if (samples, tp) not in self._made:
            self._made[samples, tp] = tensor_costed(at_microbatch(self.g, samples, self.fixed_s),
                                                    req.replace(tp=tp))
        return self._made[samples, tp]


def _place_next(graphs: _Rescaled, req: PlanRequest, upcoming: list[list[LayoutChoice]],
                policy: str, best: list[Any], now: LayoutChoice) -> None:
    """Start the placements of a layout the search will plan (the first count of a later
    mesh, not a sharded one: tried only where copies do not fit whole) on the planner threads
    while this thread simulates the plans of ``now``
    (:func:`outcore.partition.search.place_next`): the same placements, made earlier. The
    first that no plan of ``now`` or of a layout between could prune: its time bound at most
    ``now``'s, which no plan of ``now`` beats (nor of a later mesh, whose bound is higher).
    Started for a layout the search then skips, they would take the threads from the
    layouts it plans (seen on an RNN grid: 1.1-1.3x the CPU, no faster)."""
    from outcore.partition.search import place_next

    bound = min(now.time_bound_s, best[1].predicted["iteration_s"] if best else math.inf)
    for group in upcoming:
        c = group[0]
        if c.depth > 1 or (req.memory_bytes and c.floor(policy) > req.memory_bytes) or \
                (best and c.time_bound_s > best[1].predicted["iteration_s"]):
            continue  # not planned as things stand
        if c.time_bound_s <= bound:  # planned, after any layout before it that is
            try:
                creq = c.request(req, policy)
                place_next(graphs(c.samples, c.tp, creq), creq)
            except OutcoreError:
                pass  # its own search says why
            return


def _search_group(graphs: _Rescaled, req: PlanRequest, group: list[LayoutChoice],
                  policy: str, records: list[dict[str, Any]], best: list[Any],
                  errors: list[InfeasibleError], upcoming: list[list[LayoutChoice]]) -> None:
    """Plan one mesh's micro-batch counts, fewest first; after the first that fits, at most
    :data:`EXTRA_MICROBATCH_STEPS` more (none on one stage: nothing to fill), and none after
    a count that was slower than the one before it (fewer micro-batches fill a pipeline less
    and pay a run's fixed costs fewer times: the time over the count falls, then rises).
    ``upcoming``: the meshes after this one (:func:`_place_next`)."""
    from outcore.partition.search import Beaten, _search, fits

    threads = current_threads()
    extra_left: int | None = None
    last_s: float | None = None  # the last count's simulated time, when it fit
    slower = False
    for c in group:
        rec = _record(c, policy)
        records.append(rec)
        why = _why_skipped(c, req, policy, best, extra_left, slower)
        if why:
            rec["outcome"] = why
            continue
        if extra_left is not None:
            extra_left -= 1
        try:
            creq = c.request(req, policy)
            # a plan must beat the best so far by more than a tie to win (_better)
            beat = best[1].predicted["iteration_s"] / (1 - TIE) \
                if best and BOUND_ACROSS_LAYOUTS else None
            if threads is not None and not _FIRST_FIT.get():
                threads.after_place = lambda c=c: _place_next(graphs, req, upcoming, policy,
                                                              best, c)
            p = _search(graphs(c.samples, c.tp, creq), creq, beat_s=beat)
        except Beaten as e:
            rec["outcome"] = f"pruned: {e}"
            continue
        except InfeasibleError as e:
            errors.append(e)
            rec["outcome"] = f"no plan: {str(e).split(';')[0]}"
            continue
        _fill(rec, p)
        if not fits(p):
            rec["outcome"] = "does not fit"
            continue
        rec["outcome"] = "fits"
        t = float(p.predicted["iteration_s"])
        slower = last_s is not None and t > last_s * (1 + TIE)
        last_s = t
        if extra_left is None:
            one_stage = req.devices // (c.dp * c.tp * c.sp) == 1
            extra_left = 0 if one_stage else EXTRA_MICROBATCH_STEPS
        key = _key(p, c)
        if not best or _better(key, best[0]):
            best[:] = [key, p, rec]
        if _FIRST_FIT.get():
            return


def _why_skipped(c: LayoutChoice, req: PlanRequest, policy: str, best: list[Any],
                 extra_left: int | None, slower: bool) -> str | None:
    """Why :func:`_search_group` does not plan ``c`` (its outcome), or None."""
    floor = c.floor(policy)
    if req.memory_bytes and floor > req.memory_bytes:
        return f"pruned: memory floor {format_bytes(floor)} per device over the limit"
    if best and c.time_bound_s > best[1].predicted["iteration_s"]:
        return "pruned: its time bound exceeds the best plan's time"
    if extra_left is not None and (extra_left <= 0 or slower):
        return ("not tried: more micro-batches were slower" if slower else
                "not tried: fewer micro-batches fit already")
    return None


def _fits_unsharded(c: LayoutChoice, records: list[dict[str, Any]]) -> bool:
    """Whether ``c``'s mesh without sharding had a plan that fits."""
    return any(r["outcome"] == "fits" and r["depth"] == 1 and
               (r["dp"], r["parallel"], r["replicas"], r["tp"], r["sp"]) ==
               (c.dp, c.parallel, c.replicas, c.tp, c.sp) for r in records)


def _groups(choices: list[LayoutChoice]) -> list[list[LayoutChoice]]:
    """Choices grouped by mesh (dp, mode, replicas), micro-batch counts ascending; plain
    meshes before tensor-parallel ones (:func:`candidate_layouts`), and among them the
    fewest model-parallel devices per copy first: they plan fastest (one device: no
    placement at all), and the plan they find bounds the others' searches
    (:func:`_search_group`)."""
    groups: dict[tuple, list[LayoutChoice]] = {}
    for c in choices:
        groups.setdefault((c.dp, c.parallel, c.replicas, c.tp, c.sp, c.depth), []).append(c)
    ordered = sorted(groups.values(),  # (stable: sharded meshes stay after their plain ones)
                     key=lambda v: (v[0].tp > 1, -v[0].dp * v[0].tp * v[0].sp))
    return [sorted(v, key=lambda c: c.microbatches) for v in ordered]


def _record(c: LayoutChoice, policy: str) -> dict[str, Any]:
    return {"layout": c.label, "dp": c.dp, "parallel": c.parallel, "replicas": c.replicas,
            "tp": c.tp, "sp": c.sp, "depth": c.depth, "microbatches": c.microbatches,
            "samples": c.samples,
            "memory_policy": policy, "time_bound_s": c.time_bound_s,
            "memory_floor_bytes": c.floor(policy)}


def _fill(rec: dict[str, Any], p: Plan) -> None:
    from outcore.partition.search import placement_row

    row = placement_row(p)
    rec.update(strategy=row["strategy"], iteration_s=row["iteration_s"],
               peak_bytes=row["peak_bytes"], placements=p.extra.get("placements", []))


def _key(p: Plan, c: LayoutChoice) -> tuple[float, int, int, int, int]:
    return (float(p.predicted["iteration_s"]), c.microbatches, c.dp, c.depth, c.tp)


def _better(a: tuple[float, int, int, int, int], b: tuple[float, int, int, int, int]) -> bool:
    """``a`` beats ``b``: clearly faster, or a tie (within :data:`TIE`) with fewer
    micro-batches, then less data parallelism, then less sharding, then less tensor
    parallelism."""
    if a[0] < b[0] * (1 - TIE):
        return True
    if b[0] < a[0] * (1 - TIE):
        return False
    return a[1:] < b[1:]


def _why_lost(rec: dict[str, Any], best: Plan) -> str:
    t, bt = rec["iteration_s"], float(best.predicted["iteration_s"])
    if t > bt * (1 + TIE):
        return f"slower ({t / bt:.2f}x)"
    return "tie: more micro-batches, data parallelism, sharding or tensor parallelism"
