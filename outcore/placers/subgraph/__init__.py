"""The ``subgraph`` strategy: SUPER sub-graph parallelism, branches of a block on different devices.

Jain, Moon, Benson, Subramoni, Jacobs, Panda, Van Essen, "SUPER: SUb-Graph Parallelism for
TransformERs", IPDPS 2021. Section III splits a multi-branch model (the heads of a transformer's
attention, the paths of an Inception or AmoebaNet cell) into sub-graphs, one per device, that run
at the same time between the layer that forks them and the layer that joins them; the rest of the
model runs once. Section IV combines it with data parallelism (D&SP): each group of S devices
holds one sub-graph-parallel replica, and gradients are all-reduced across groups. This module
plans the S-device part (``plan(..., dp=DataParallel(replicas, link))`` ranks it for D&SP); the
data-parallel part is a replica count outside the placement (``docs/subgraph.md``,
``benchmarks/subgraph_vs_dp.py``).

Steps (names ours; the paper assigns branches by hand, per model, ``subgraph_topology``):

1. **Branches** (:mod:`outcore.placers.subgraph.branches`): fork-join regions found from the graph,
   disjoint, with the constants that feed only one branch attached to it, and the side
   branches of multi-input cells.
2. **Trunk**: the nodes outside every branch start on one device ("home", device 0), or on the
   memory- and time-balanced contiguous stages of the pipeline planner ("stages", for graphs that
   do not fit one device).
3. **Branch placement**: region by region in program order, branches by decreasing forward +
   backward work (ties: lower node index), each to the device where it would *finish* first:
   ``max(load in this region, arrival of its inputs) + work + transfer of its outputs`` (inputs
   come from wherever their producers are, the fork's device in general; outputs go to their
   consumers', the join's); ties go to the device with the least load accumulated over the whole
   graph, then the lowest index. Longest-processing-time-first list scheduling (Graham 1969) with
   the communication of each branch counted, so a cheap branch whose transfers cost more than it
   saves stays with the fork.
4. **Trunk follows** ("follow" candidates): every weakly connected trunk segment moves to the
   device it exchanges the most bytes with, then the branches are placed again; twice.
5. **Memory**: a candidate that overflows the limit is repaired by ParDNN's step 2
   (:func:`~outcore.placers.pardnn.memory.repair_memory`).
6. **Choice**: every candidate, for every device count in {K, K/2, ..., 2}, and the 1-device
   plan, is emulated (:mod:`outcore.placers.emulate`); the fastest that fits wins
   (:func:`~outcore.placers.result.best_of`), so the plan is never slower than one device.
   When no sub-graph candidate fits, or the graph has no branches (a chain), the contiguous
   stages of the ``pipeline`` planner are offered too, and the notes say so. For one group of
   a D&SP layout (:class:`DataParallel`) the rank is makespan + the slowest device's gradient
   all-reduce across the replicas, which favours trunks spread over the group: the trunk runs
   in series anyway, and a device holding fewer parameters all-reduces less.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass

import numpy as np

from outcore.graph.algorithms import weakly_connected_components
from outcore.graph.ir import Graph
from outcore.hardware.collectives import ring_allreduce_s
from outcore.hardware.spec import LinkSpec
from outcore.placers._jit import njit
from outcore.placers.context import Context
from outcore.placers.feasibility import holds_floor
from outcore.placers.pardnn.memory import repair_memory
from outcore.placers.registry import Placement, Placer
from outcore.placers.result import Candidate, best_of, compact, devices_used, evaluate, listed
from outcore.placers.stages import assignment_from_bounds, device_counts, stage_bounds
from outcore.placers.subgraph.branches import Branches, find_branches
from outcore.placers.subgraph.region_sets import RegionSet, gather_slices
from outcore.units import format_seconds

log = logging.getLogger(__name__)

FOLLOW_ROUNDS = 2


@dataclass(frozen=True, eq=False)
class BranchTable:
    """The chosen regions as flat arrays for the placement kernel (B branches in all).

    Attributes:
        reg_ptr: ``int64[R+1]``: branches of region r are ``reg_ptr[r]:reg_ptr[r+1]``, by
            decreasing work (ties: lower first node).
        work_s: ``float64[B]`` forward + backward seconds per branch (with feeders).
        mem_ptr, mem_idx: CSR of each branch's nodes (branch nodes and feeders).
        in_ptr, in_prod, in_bytes: per branch, the producers outside it that it reads, each once
            at its largest edge into the branch.
        out_ptr, out_prod, out_cons, out_bytes: per branch, its edges to consumers outside it,
            sorted by producer.
        member: ``int64[n]`` branch of each node, -1 for the trunk.
    """

    reg_ptr: np.ndarray
    work_s: np.ndarray
    mem_ptr: np.ndarray
    mem_idx: np.ndarray
    in_ptr: np.ndarray
    in_prod: np.ndarray
    in_bytes: np.ndarray
    out_ptr: np.ndarray
    out_prod: np.ndarray
    out_cons: np.ndarray
    out_bytes: np.ndarray
    member: np.ndarray

    @property
    def num_branches(self) -> int:
        return int(self.work_s.size)


def branch_table(ctx: Context, chosen: RegionSet) -> BranchTable:
    """Flatten the ``chosen`` regions (see :class:`BranchTable`); work is taken from
    ``ctx.work_s``."""
    g = ctx.g
    n = g.num_nodes
    nb = int(chosen.br_ptr.size - 1)
    reg_ptr = chosen.reg_ptr
    # each branch's nodes, then its feeders, branch after branch
    starts = np.column_stack([chosen.br_ptr[:-1], chosen.br_nodes.size + chosen.fd_ptr[:-1]])
    lens = np.column_stack([np.diff(chosen.br_ptr), np.diff(chosen.fd_ptr)])
    flat = gather_slices(starts.ravel(), lens.ravel(),
                         np.concatenate([chosen.br_nodes, chosen.fd_nodes]), np.arange(2 * nb))[1]
    raw = np.repeat(np.arange(2 * nb) // 2, lens.ravel())  # branch of each
    # within a region, branches by decreasing work, then by first node
    w = np.bincount(raw, weights=ctx.work_s[flat], minlength=nb)
    first = np.full(nb, n, np.int64)
    np.minimum.at(first, raw, flat)
    region_of = np.repeat(np.arange(chosen.num_regions), np.diff(reg_ptr))
    new_id = np.empty(nb, np.int64)
    new_id[np.lexsort((first, -w, region_of))] = np.arange(nb)
    member = np.full(n, -1, np.int64)
    member[flat] = new_id[raw]
    by_branch = np.lexsort((flat, new_id[raw]))  # nodes by branch, sorted within it
    mem_idx = flat[by_branch]
    mem_ptr = np.zeros(nb + 1, np.int64)
    np.cumsum(np.bincount(new_id[raw], minlength=nb), out=mem_ptr[1:])
    work = np.bincount(member[member >= 0], weights=ctx.work_s[member >= 0], minlength=nb)
    ms, md = member[g.src], member[g.dst]
    eb = g.edge_bytes.astype(np.float64)
    # inputs: (branch, producer) pairs, largest edge each
    e_in = np.flatnonzero((md >= 0) & (ms != md))
    key_b, key_u, byt = md[e_in], g.src[e_in], eb[e_in]
    o = np.lexsort((-byt, key_u, key_b))
    key_b, key_u, byt = key_b[o], key_u[o], byt[o]
    first = np.ones(key_b.size, bool)
    first[1:] = (key_b[1:] != key_b[:-1]) | (key_u[1:] != key_u[:-1])
    in_b, in_prod, in_bytes = key_b[first], key_u[first], byt[first]
    in_ptr = np.zeros(nb + 1, np.int64)
    np.cumsum(np.bincount(in_b, minlength=nb), out=in_ptr[1:])
    # outputs: edges leaving a branch, by (branch, producer, consumer)
    e_out = np.flatnonzero((ms >= 0) & (ms != md))
    o = np.lexsort((g.dst[e_out], g.src[e_out], ms[e_out]))
    e_out = e_out[o]
    out_ptr = np.zeros(nb + 1, np.int64)
    np.cumsum(np.bincount(ms[e_out], minlength=nb), out=out_ptr[1:])
    return BranchTable(reg_ptr, work, mem_ptr, mem_idx.astype(np.int64),
                       in_ptr, in_prod.astype(np.int64), in_bytes, out_ptr,
                       g.src[e_out].astype(np.int64), g.dst[e_out].astype(np.int64), eb[e_out],
                       member)


@njit
def _place_kernel(reg_ptr, work, mem_ptr, mem_idx, in_ptr, in_prod, in_bytes, out_ptr,
                  out_prod, out_cons, out_bytes, a, acc, lat, inv, k):
    """Step 3 (module docstring): every branch to the device where it finishes first."""
    local = np.zeros(k)
    cin = np.zeros(k)
    cout = np.zeros(k)
    tob = np.zeros(k)
    for r in range(reg_ptr.shape[0] - 1):
        for d in range(k):
            local[d] = 0.0
        for b in range(reg_ptr[r], reg_ptr[r + 1]):
            for d in range(k):
                cin[d] = 0.0
                cout[d] = 0.0
            for e in range(in_ptr[b], in_ptr[b + 1]):
                du = a[in_prod[e]]
                nb = in_bytes[e]
                if nb <= 0.0:
                    continue
                for d in range(k):
                    if d != du:
                        cin[d] += 2.0 * (lat[du, d] + nb * inv[du, d])
            e = out_ptr[b]
            while e < out_ptr[b + 1]:
                x = out_prod[e]
                for d in range(k):
                    tob[d] = 0.0
                while e < out_ptr[b + 1] and out_prod[e] == x:
                    dv = a[out_cons[e]]
                    if out_bytes[e] > tob[dv]:
                        tob[dv] = out_bytes[e]
                    e += 1
                for dv in range(k):
                    if tob[dv] > 0.0:
                        for d in range(k):
                            if d != dv:
                                cout[d] += 2.0 * (lat[d, dv] + tob[dv] * inv[d, dv])
            best = -1
            best_t = 0.0
            for d in range(k):
                start = local[d] if local[d] > cin[d] else cin[d]
                t = start + work[b] + cout[d]
                if best < 0:
                    best, best_t = d, t
                    continue
                tol = 1e-12 * (t if t > best_t else best_t)
                if t < best_t - tol or (t <= best_t + tol and acc[d] < acc[best]):
                    best, best_t = d, t
            start = local[best] if local[best] > cin[best] else cin[best]
            local[best] = start + work[b]
            acc[best] += work[b]
            for i in range(mem_ptr[b], mem_ptr[b + 1]):
                a[mem_idx[i]] = best
    return a


def place_branches(ctx: Context, table: BranchTable, trunk: np.ndarray) -> np.ndarray:
    """Steps 3: the trunk as given, every branch placed by the finish-first rule."""
    a = np.ascontiguousarray(trunk, dtype=np.int64).copy()
    outside = table.member < 0
    acc = np.bincount(a[outside], weights=ctx.work_s[outside], minlength=ctx.devices)
    return _place_kernel(table.reg_ptr, table.work_s, table.mem_ptr, table.mem_idx,
                         table.in_ptr, table.in_prod, table.in_bytes, table.out_ptr,
                         table.out_prod, table.out_cons, table.out_bytes, a, acc.astype(np.float64),
                         ctx.lat_s, ctx.inv_bw, ctx.devices)


def follow_branches(ctx: Context, table: BranchTable, a: np.ndarray,
                    segments: np.ndarray) -> np.ndarray:
    """Step 4: each trunk segment to the device it exchanges the most bytes with.

    ``segments`` labels the trunk's weakly connected pieces (-1 on branch nodes). Segments with
    no edge to a branch stay where they are; ties: the lowest device.
    """
    g = ctx.g
    k = ctx.devices
    out = np.asarray(a, np.int64).copy()
    nseg = int(segments.max()) + 1 if segments.size and segments.max() >= 0 else 0
    if nseg == 0 or g.num_edges == 0:
        return out
    ss, sd = segments[g.src], segments[g.dst]
    eb = g.edge_bytes.astype(np.float64)
    score = np.zeros(nseg * k)
    e1 = np.flatnonzero((ss >= 0) & (sd < 0))  # trunk -> branch
    np.add.at(score, ss[e1] * k + a[g.dst[e1]], eb[e1])
    e2 = np.flatnonzero((sd >= 0) & (ss < 0))  # branch -> trunk
    np.add.at(score, sd[e2] * k + a[g.src[e2]], eb[e2])
    by_segment = score.reshape(nseg, k)
    touched = by_segment.max(axis=1) > 0
    target = np.argmax(by_segment, axis=1)
    trunk = segments >= 0
    move = trunk & touched[np.maximum(segments, 0)]
    out[move] = target[segments[move]]
    return out


@dataclass(frozen=True)
class DataParallel:
    """D&SP (SUPER section IV): ``replicas`` copies of the plan, each on its share of the batch;
    device ``d`` of every copy all-reduces the gradients of its own parameters over ``link``."""

    replicas: int
    link: LinkSpec


def allreduce_s(g: Graph, assignment: np.ndarray, dp: DataParallel) -> float:
    """Slowest device's ring all-reduce of its parameters' gradients across the replicas, s."""
    own = np.bincount(assignment, weights=g.param_bytes.astype(np.float64))
    return max((ring_allreduce_s(float(b), dp.replicas, dp.link) for b in own), default=0.0)


def plan(ctx: Context, branches: Branches | None = None, dp: DataParallel | None = None
         ) -> tuple[Candidate | None, list[str], list[Candidate]]:
    """Plan sub-graph parallelism for ``ctx``; return (best fitting candidate, notes, all).

    With ``dp`` the plan is one group of a D&SP layout and candidates are ranked by emulated
    makespan + :func:`allreduce_s` (a plan that spreads the trunk's parameters all-reduces
    less), else by makespan alone.
    """
    g = ctx.g
    br = find_branches(g) if branches is None else branches
    notes: list[str] = []
    cands: list[Candidate] = [evaluate(ctx.with_devices(1), np.zeros(g.num_nodes, np.int64),
                                       "1 device")]
    if br.truncated:
        notes.append("the fork-join search hit its budget; outer regions were not examined")
    if br.chosen.num_regions == 0:
        notes.append("no fork-join region with two or more non-empty branches (a chain for "
                     "sub-graph parallelism): offered the 1-device plan and contiguous stages")
        cands += _stage_candidates(ctx)
        return _finish(ctx, cands, notes, dp)
    shapes = sorted(set(np.diff(br.chosen.reg_ptr).tolist()))
    notes.append(f"{br.chosen.num_regions} fork-join regions ({br.branch_nodes} of {g.num_nodes} "
                 f"nodes in branches; branches per region: {', '.join(map(str, shapes))})")
    counts = [k for k in device_counts(ctx.devices) if k >= 2]
    held = [k for k in counts if holds_floor(ctx, k)]  # the others fit no placement
    notes += [f"K={k}: not tried, {k} devices cannot hold the graph's memory floor"
              for k in counts if k not in held]
    placed = [p for k in held for p in _candidates(ctx.with_devices(k), br.chosen)]
    cands += _fit_lazily(placed, cands, dp, notes)
    if not any(c.fits for c in cands[1:]):
        notes.append("no sub-graph placement fits the memory limit: offered contiguous stages")
        cands += _stage_candidates(ctx)
    return _finish(ctx, cands, notes, dp)


def _candidates(sub: Context, chosen: RegionSet) -> list[tuple[Context, Candidate]]:
    """Steps 2-4 on ``sub.devices`` devices: home and stages trunks, then follow rounds; each
    placement evaluated, not yet repaired (step 5, :func:`_fit_lazily`)."""
    g = sub.g
    k = sub.devices
    table = branch_table(sub, chosen)
    segments = weakly_connected_components(g, table.member < 0)
    trunks = [("home", np.zeros(g.num_nodes, np.int64))]
    bounds = stage_bounds(sub, k, inflight="all")
    if bounds is not None and bounds.size > 1:
        trunks.append(("stages", assignment_from_bounds(sub, bounds)))
    out: list[tuple[Context, Candidate]] = []
    for name, trunk in trunks:
        a = place_branches(sub, table, trunk)
        out.append((sub, evaluate(sub, a, f"subgraph K={k} trunk={name}").light()))
        for r in range(FOLLOW_ROUNDS):
            before, a = a, place_branches(sub, table, follow_branches(sub, table, a, segments))
            if np.array_equal(a, before):
                break  # converged: further rounds repeat this placement
            label = f"subgraph K={k} trunk={name} follow {r + 1}"
            out.append((sub, evaluate(sub, a, label).light()))
    return out


def _fit_lazily(placed: list[tuple[Context, Candidate]], known: list[Candidate],
                dp: DataParallel | None, notes: list[str]) -> list[Candidate]:
    """Step 5, branch and bound: repair the placements that overflow the limit, fastest
    first, while one could still beat the best fitting plan (``known`` and the placements
    that fit). Repair moves nodes to spare memory, never to save time, so a placement already
    as slow before repair as the best fitting plan is left unrepaired (and not fitting).

    Placements are emulated only as the order needs them: one whose floor (its busiest
    device's compute, the critical path) is past the fastest emulated one waits, and one whose
    floor is no faster than the best fitting plan is never emulated (most of SUPER's
    placements of an RNN grid hold a whole layer stack on one device: 20 of 23 at 50k nodes)."""
    if not placed:
        return []
    g = placed[0][0].g
    path_s = placed[0][0].critical_path_s

    def total(c: Candidate) -> float:  # what the plan is ranked by (see _finish)
        return c.makespan_s + (allreduce_s(g, c.assignment, dp) if dp else 0.0)

    def floor(sub: Context, c: Candidate) -> float:  # no emulation of ``c`` is shorter
        busy = np.bincount(c.assignment, weights=sub.work_s, minlength=sub.devices).max()
        return max(path_s, sub.microbatches * float(busy))

    best = min([total(c) for c in known + [c for _, c in placed] if c.fits], default=np.inf)
    out = {id(c): c for _, c in placed}
    over = sorted((floor(sub, c), k) for k, (sub, c) in enumerate(placed)
                  if not c.fits and sub.memory_bytes is not None)
    timed: list[tuple[float, int]] = []  # (emulated time, index): the fastest first
    nxt = 0
    while True:
        while nxt < len(over) and over[nxt][0] < best and \
                (not timed or over[nxt][0] <= timed[0][0]):
            k = over[nxt][1]
            heapq.heappush(timed, (placed[k][1].makespan_s, k))
            nxt += 1
        if not timed:
            break
        _, k = heapq.heappop(timed)
        sub, c = placed[k]
        if c.makespan_s >= best:
            notes.append(f"{c.label}: not repaired (before repair already no faster than "
                         f"the best fitting plan, {format_seconds(best)})")
            continue
        fixed, st = repair_memory(sub, c.assignment)
        notes.append(f"{c.label}: memory repair moved {st.moved_nodes} nodes"
                     + ("" if st.fits else " and did not fit"))
        r = evaluate(sub, fixed, c.label + ", memory repaired").light()
        out[id(c)] = r
        if r.fits:
            best = min(best, total(r))
    for lb, k in over[nxt:]:
        notes.append(f"{placed[k][1].label}: not repaired (at least {format_seconds(lb)} "
                     "before repair, by its busiest device's compute or the critical path; "
                     f"no faster than the best fitting plan, {format_seconds(best)})")
    return [out[id(c)] for _, c in placed]


def _stage_candidates(ctx: Context) -> list[Candidate]:
    """The pipeline planner's contiguous splits on K, K/2, ..., 2 devices (memory: all M)."""
    out = []
    for k in device_counts(ctx.devices):
        if k < 2:
            continue
        sub = ctx.with_devices(k)
        bounds = stage_bounds(sub, k, inflight="all")
        if bounds is not None:
            out.append(evaluate(sub, assignment_from_bounds(sub, bounds),
                                f"{bounds.size} contiguous stages (of {k})"))
    return out


def _finish(ctx: Context, cands: list[Candidate], notes: list[str], dp: DataParallel | None
            ) -> tuple[Candidate | None, list[str], list[Candidate]]:
    if dp is None:
        best = best_of(cands)
        notes.append(listed(cands))
    else:
        extra = [allreduce_s(ctx.g, c.assignment, dp) for c in cands]
        fit = [(c.makespan_s + x, devices_used(c.assignment), i)
               for i, (c, x) in enumerate(zip(cands, extra)) if c.fits]
        best = cands[min(fit)[2]] if fit else None
        notes.append(f"ranked by makespan + all-reduce over {dp.replicas} replicas")
        notes.append(listed(cands, extra))
    if best is not None:
        notes.append(f"chose {best.label}")
    log.debug("subgraph: %s", "; ".join(notes))
    return best, notes, cands


# a second placement the search simulates when the emulator puts it within this fraction of
# the best (a different trunk choice the node-level emulator cannot tell apart)
NEAR_TIE = 0.01


class SubGraph(Placer):
    """The ``subgraph`` placer (module docstring)."""

    name = "subgraph"
    summary = ("SUPER (Jain et al. 2021) sub-graph parallelism: the branches of each fork-join "
               "region on different devices, trunk and device count chosen by emulation")
    in_auto = True

    def place(self, ctx: Context, seed: int) -> Placement:
        return Placement(*plan(ctx))

    def offers(self, ctx: Context, placed: Placement) -> list[tuple[Candidate, list[str]]]:
        """The best placement, and the next that fits when the emulator puts it within
        :data:`NEAR_TIE` of the best (on a 100k-node transformer two such ties simulated 7.66
        and 7.86 s), fastest first."""
        best = placed.best
        assert best is not None
        out = [(best, placed.notes)]
        first = compact(best.assignment)[0]
        for c in sorted((c for c in placed.considered if c.fits),
                        key=lambda c: (c.makespan_s, c.label)):
            if c.makespan_s > best.makespan_s * (1 + NEAR_TIE):
                break
            if not np.array_equal(compact(c.assignment)[0], first):  # not relabelled
                out.append((c, placed.notes[:-1] + [f"chose {c.label}"]))
                break
        return out
