"""The search: from a :class:`~outcore.plan.request.PlanRequest` to the fastest plan that fits.

Read top to bottom, it is one loop::

    for layout in layouts(request):          # dp x GEMS replicas x tp x sharding x micro-batches
        for placer in placers(request):      # ParDNN, pipeline, SUPER, contiguous, ...
            place one model copy (emulator), simulate the best few, fit memory policies
        replicate the best placement, keep the layout's plan if it is the fastest that fits

* :func:`search` is the entry point. A spatial request (``sp > 1``) plans its tiled prefix
  first (:mod:`outcore.search.spatial`) and runs this search on the rest; ``--tp auto`` and
  ``--shard auto`` without a layout search try each degree (:func:`_search_degrees`).
* The layouts (:mod:`outcore.search.layouts`) are enumerated with cheap bounds and planned in
  the order :mod:`outcore.search.ranking` gives them, pruned by the best plan so far
  (:func:`search_layouts`); a fixed layout is the only one.
* One layout's plan is :func:`outcore.search.copies.plan_layout`: the placers' placements of
  one copy (:mod:`outcore.search.placement`), replicated (:mod:`outcore.search.replicas`).
* When nothing fits, :mod:`outcore.search.refusal` checks what would, running this search
  (:func:`fits_request`) on other device counts and memory limits.

Every candidate's outcome is kept in the plan's notes and ``extra`` (``--explain``). No torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

from outcore.cost.tensor import plan_layout as tensor_plan_layout
from outcore.errors import InfeasibleError, OutcoreError, UsageError
from outcore.graph.batch import at_microbatch
from outcore.graph.ir import Graph
from outcore.hardware.allocator import frozen_objects
from outcore.plan.plan import Plan
from outcore.plan.request import PlanRequest
from outcore.search.copies import plan_layout
from outcore.search.layouts import (
    LayoutChoice,
    candidate_layouts,
    fixed_s,
    no_layout_fits,
    tensor_degrees,
)
from outcore.search.memory_policy import NO_POLICY
from outcore.search.placement import place_next
from outcore.search.ranking import (
    EXTRA_MICROBATCH_STEPS,
    TIE,
    better,
    fill,
    fits_unsharded,
    layout_key,
    mesh_groups,
    record,
    why_lost,
    why_skipped,
)
from outcore.search.refusal import checked_refusal
from outcore.search.runnable import runnable, statistics_note
from outcore.search.spatial import plan_spatial
from outcore.search.tensor import tensor_costed, tensor_split, with_grid_note
from outcore.search.threads import current_threads, shared_threads
from outcore.search.verdict import Beaten, fits
from outcore.sim.simulate import remembered

log = logging.getLogger(__name__)

__all__ = ["BOUND_ACROSS_LAYOUTS", "first_fit", "fits_request", "search", "search_layouts"]


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
    with frozen_objects(), remembered():
        plan = _searched(g, req, check_suggestions, progress)
    note = statistics_note(g, req, plan)  # first: the search's own notes end with its verdict
    return plan.replace(notes=(note, *plan.notes)) if note else plan


def _searched(g: Graph, req: PlanRequest, check_suggestions: bool,
              progress: Callable[[str, int, int], None] | None = None) -> Plan:
    if req.sp > 1:  # MPI4DL SP + LP: tiled prefix, then the ordinary search on the rest
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
        raise checked_refusal(g, req, e, fits_request, progress=progress) from None


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
        raise checked_refusal(g, req.replace(**{field: 1}), plain, fits_request) \
            if check_suggestions else plain
    if best is None:
        raise InfeasibleError(f"no {what} degree fits ({'; '.join(notes)})")
    t = getattr(best.layout, field)
    why = "the fastest that fits" if len(notes) > 1 else "the only degree tried"
    return best.with_notes(*notes, f"{flag} auto: chose {field} {t} ({why})")


def _dispatch(g: Graph, req: PlanRequest,
              progress: Callable[[str, int, int], None] | None = None) -> Plan:
    """The layout search when the request leaves the layout or the micro-batches open
    (:func:`search_layouts`, which costs each layout's tensor split at its micro-batch), else
    the plan of the request's own layout on ``g`` costed for its ``tp``."""
    if req.whole_batch:
        return search_layouts(g, req, progress)
    why = runnable(g, rescaled=False).refusal(int(g.batch_size or 1))
    if why:
        raise UsageError(f"the model cannot train on {why}; use more samples per micro-batch "
                         "(--batch-size, fewer --microbatches or --dp)")
    tg, layout = tensor_split(g, req)
    return with_grid_note(plan_layout(tg, req), layout, req)


# a record's mark: its placement search turned down a placement that needed a memory policy
_NEEDED_POLICY = "_needed_policy"
# set while a refusal checks whether anything fits (:func:`fits_request`): the layout search
# then stops at the first layout with a plan that fits, not the fastest
_FIRST_FIT: contextvars.ContextVar[bool] = contextvars.ContextVar("first_fit", default=False)


# a layout's placement search is bounded by the best plan of the layouts searched before it
# (:func:`~outcore.search.copies.plan_layout`'s ``beat_s``): placements the emulator finds slower
# are not simulated, and a layout whose one copy is already no faster is not replicated. Off: every
# layout is planned to the end (tests that check each layout's bound against its plan)
BOUND_ACROSS_LAYOUTS = True


@contextlib.contextmanager
def first_fit() -> Iterator[None]:
    """Within the block the layout search returns the first plan that fits it finds (a
    refusal's checks ask whether anything fits, not what is fastest)."""
    token = _FIRST_FIT.set(True)
    try:
        yield
    finally:
        _FIRST_FIT.reset(token)


def fits_request(g: Graph, req: PlanRequest) -> bool:
    """Whether the search finds a plan that fits ``req``, stopping at the first layout that
    does (what :func:`~outcore.search.refusal.checked_refusal` asks of other device counts
    and memory limits)."""
    try:
        with first_fit():
            return fits(_dispatch(g, req))
    except (InfeasibleError, UsageError):  # nothing fits, or nothing the model can run
        return False


def search_layouts(g: Graph, req: PlanRequest,
                   progress: Callable[[str, int, int], None] | None = None) -> Plan:
    """The fastest plan over every layout :func:`candidate_layouts` allows (see the module
    docstring for the passes and the pruning); ``plan.extra["candidates"]`` records them all.
    ``progress(phase, done, total)`` follows the layouts of each pass."""
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
    records: list[dict[str, Any]] = []
    choices = _runnable_only(g, req, choices, records)
    graphs = _Rescaled(g, fixed_s(req))
    best: list[Any] = []  # [key, plan, record] of the best plan so far
    errors: list[InfeasibleError] = []
    groups = mesh_groups(choices)
    with shared_threads():  # the next layout's placements start while one is simulated
        # gradient accumulation before memory policies: a first pass without them; a second
        # with the request's plans again every layout that did not fit, or that fit but
        # turned down a placement for memory, where its time bound may beat the best plan so
        # far: a placement that needs a policy can be faster than every one that fits without
        # (so a fixed layout's plan, whose placements may take policies, is among this
        # search's candidates)
        limited = req.memory_bytes is not None and req.memory_policy != "none"
        last_pass = 0  # the first error of the last pass: the request's own policy's
        for policy in ["none"] + ([req.memory_policy] if limited else []):
            last_pass = len(errors)
            if policy != "none":  # the first pass's choices, one record each, in order
                done = [c for group in groups for c in group]
                groups = mesh_groups([c for c, rec in zip(done, records[:len(done)])
                                      if rec["outcome"] != "fits" or rec.get(_NEEDED_POLICY)])
            start = len(records)
            phase = "planning layouts" + (f" (memory policy {policy})" if policy != "none"
                                          else "")
            for i, group in enumerate(groups):
                if progress:
                    progress(phase, len(records) - start, len(choices))
                if group[0].depth > 1 and fits_unsharded(group[0], records):
                    # sharding is a memory lever: never tried where plain copies fit already
                    records += [{**record(c, policy), "outcome": "not tried: the copies fit "
                                 "without sharding"} for c in group]
                    continue
                _search_group(graphs, req, group, policy, records, best, errors,
                              upcoming=groups[i + 1:])
                if best and _FIRST_FIT.get():
                    break
            if progress:
                progress(phase, len(records) - start, len(choices))
            if best and _FIRST_FIT.get():
                break
    if not best:
        if errors:  # what the request's own policy met, not the pass without policies
            raise _closest(errors[last_pass:] or errors)
        raise no_layout_fits(req, choices)
    _, plan, chosen = best
    for rec in records:
        rec.pop(_NEEDED_POLICY, None)
        if rec is chosen:
            rec["outcome"] = "chosen"
        elif rec["outcome"] == "fits":
            rec["outcome"] = why_lost(rec, plan)
    fitting = sum(r["outcome"] == "chosen" or r["outcome"].startswith(("slower", "tie"))
                  for r in records)
    note = (f"layout search: {len(records)} layouts considered, {fitting} fit; chose "
            f"{chosen['layout']} (memory policy {chosen['memory_policy']})")
    if plan.layout.tp > 1:  # the chosen layout's split, for its note on the 2-D grid
        small = graphs(chosen["samples"], 1, req)
        plan = with_grid_note(plan, tensor_plan_layout(small, plan.layout.tp), req)
    return plan.replace(extra={**plan.extra, "candidates": records},
                        predicted=_bound_over_layouts(plan.predicted, records)
                        ).with_notes(*tp_notes, note)


def _closest(errors: list[InfeasibleError]) -> InfeasibleError:
    """The refusal that came nearest to fitting (the least memory it says a device needs;
    the first where none says): more micro-batches may need less than one."""
    need = [e.need_bytes for e in errors]
    known = [k for k, m in enumerate(need) if m is not None]
    return errors[min(known, key=lambda k: float(need[k] or 0.0))] if known else errors[0]


def _runnable_only(g: Graph, req: PlanRequest, choices: list[LayoutChoice],
                   records: list[dict[str, Any]]) -> list[LayoutChoice]:
    """The layouts whose micro-batches the model can run; the others recorded with why
    (:mod:`outcore.search.runnable`). None left: a refusal that says what to change, or,
    when the rule is a preference (not ``strict``), every layout."""
    need = runnable(g, rescaled=req.whole_batch)
    ok = [c for c in choices if need.refusal(c.samples) is None]
    if not ok and not need.strict:
        return choices
    for c in choices:
        why = need.refusal(c.samples)
        if why is not None:
            verdict = "cannot run" if need.strict else "not tried"
            records.append({**record(c, "none"), "outcome": f"{verdict}: {why}"})
    if not ok:
        raise UsageError(f"no layout of {req.devices} devices gives the model a micro-batch it "
                         f"can train on: {need.refusal(1)}; use a batch of at least "
                         f"{need.min_samples} samples per micro-batch and model copy "
                         "(--batch-size, fewer --microbatches or --dp)")
    return ok


def _bound_over_layouts(predicted: dict[str, Any], records: list[dict[str, Any]]
                        ) -> dict[str, Any]:
    """``predicted`` with ``lower_bound_s`` the lowest bound of any layout the search
    enumerated (the layouts compete: the chosen one's own bound says nothing of the others),
    and that layout's own as ``layout_lower_bound_s``."""
    own = predicted.get("lower_bound_s")
    bounds = [float(r["time_bound_s"]) for r in records] + ([own] if own is not None else [])
    return {**predicted, "lower_bound_s": min(bounds) if bounds else None,
            "layout_lower_bound_s": own}


class _Rescaled:
    """The graph at each micro-batch size and tensor-parallel degree the layouts ask for, made
    once: layouts of the same micro-batch (dp 2 x 2 and dp 1 x 4 micro-batches of a quarter)
    plan on the same graph, so what the planners remember per graph (topological orders, the
    fork-join regions, contexts) serves them all."""

    def __init__(self, g: Graph, fixed_s: float) -> None:
        self.g, self.fixed_s = g, fixed_s
        self._made: dict[tuple[int, int], Graph] = {}

    def __call__(self, samples: int, tp: int, req: PlanRequest) -> Graph:
        if (samples, tp) not in self._made:
            self._made[samples, tp] = tensor_costed(at_microbatch(self.g, samples, self.fixed_s),
                                                    req.replace(tp=tp))
        return self._made[samples, tp]


def _place_next(graphs: _Rescaled, req: PlanRequest, upcoming: list[list[LayoutChoice]],
                policy: str, best: list[Any], now: LayoutChoice) -> None:
    """Start the placements of a layout the search will plan (the first count of a later
    mesh, not a sharded one: tried only where copies do not fit whole) on the planner threads
    while this thread simulates the plans of ``now``
    (:func:`outcore.search.placement.place_next`): the same placements, made earlier. The
    first that no plan of ``now`` or of a layout between could prune: its time bound at most
    ``now``'s, which no plan of ``now`` beats (nor of a later mesh, whose bound is higher).
    Started for a layout the search then skips, they would take the threads from the
    layouts it plans (seen on an RNN grid: 1.1-1.3x the CPU, no faster)."""
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
    threads = current_threads()
    extra_left: int | None = None
    last_s: float | None = None  # the last count's simulated time, when it fit
    slower = False
    for c in group:
        rec = record(c, policy)
        records.append(rec)
        why = why_skipped(c, req, policy, best, extra_left, slower)
        if why:
            rec["outcome"] = why
            continue
        if extra_left is not None:
            extra_left -= 1
        try:
            creq = c.request(req, policy)
            # a plan must beat the best so far by more than a tie to win (better)
            beat = best[1].predicted["iteration_s"] / (1 - TIE) \
                if best and BOUND_ACROSS_LAYOUTS else None
            if threads is not None and not _FIRST_FIT.get():
                threads.after_place = lambda c=c: _place_next(graphs, req, upcoming, policy,
                                                              best, c)
            p = plan_layout(graphs(c.samples, c.tp, creq), creq, beat_s=beat)
        except Beaten as e:
            rec["outcome"] = f"pruned: {e}"
            continue
        except InfeasibleError as e:
            errors.append(e)
            rec["outcome"] = f"no plan: {str(e).split(';')[0]}"
            continue
        fill(rec, p)
        rec[_NEEDED_POLICY] = any(NO_POLICY in n for n in p.notes)
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
        key = layout_key(p, c)
        if not best or better(key, best[0]):
            best[:] = [key, p, rec]
        if _FIRST_FIT.get():
            return
