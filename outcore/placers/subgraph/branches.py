"""Fork-join regions of a DAG: the parallel branches sub-graph parallelism places apart.

SUPER (Jain et al., "SUPER: SUb-Graph Parallelism for TransformERs", IPDPS 2021, section III)
runs the branches of a multi-branch block (the heads of a transformer layer, the paths of an
Inception or AmoebaNet cell) on different devices at the same time, joined where the model
joins them. Here the branches are found from the graph alone, for any model:

* **Post-dominators.** A virtual sink follows every sink (and a virtual source precedes every
  source), so every DAG has one exit. ``d`` post-dominates ``v`` when every path from ``v`` to
  the exit passes ``d``. On a DAG the immediate post-dominator of ``v`` is the lowest common
  ancestor, in the post-dominator tree, of ``v``'s successors; visiting nodes in reverse
  topological order gives it in one pass (Cooper, Harvey and Kennedy's "intersect", with the
  tree's LCA answered by skew-binary jump pointers (Myers 1983), O(log n) per query, so that
  long skip edges do not make the pass quadratic).
* **Regions.** A *fork* is a node (or the virtual source) with two or more distinct successors,
  except a parameter read (op ``param``): a weight read at every step of an unrolled RNN starts
  no parallel work (its readers' branches are forked by the activations they read too, and the
  weight is attached to its readers as a feeder), and searching its fan-out took half of the
  region search on a 1M-node RNN grid.
  Its successors meet in the post-dominator tree at its immediate post-dominator, and some of
  them may meet earlier: a *join* of the fork is any such meeting point (the LCA of two
  successors adjacent in the tree's preorder); the immediate post-dominator is the outermost.
  (In ``outcore:diamond`` the fork also feeds the head through a skip edge, so its immediate
  post-dominator is the head's concat; its left and right paths join at the add.) For a join
  ``c``, the *interior* is every node reachable, before ``c``, from the fork's successors that
  ``c`` post-dominates. A *branch* is a weakly connected component of the interior: the sets
  reachable from each successor, merged when they intersect (a node reached from two of them,
  or an edge between their sets, makes them one). A successor that is the join itself (a skip
  edge, e.g. a residual connection) is an empty branch and does not count. A region is
  *useful* when it has two or more branches. Each search runs in topological order and stops as
  soon as all successors have merged, so the forks of long sequential models (every time step
  of an unrolled RNN forks) cost little; a visit budget bounds the rest.
* **Feeders and side branches** (for the chosen regions). Nodes outside the interior whose every
  successor lies in one branch or among its feeders (constants such as an attention mask, a
  parameter node) are attached to that branch: they have no other consumer, so placing them
  elsewhere only adds a transfer. Nodes the fork does not reach whose successors all lie in the
  region, spread over several branches or the join (an AmoebaNet/NAS cell's second input and
  the ops on it), form *side branches*: they run beside the fork's branches, between their own
  producers and the join.
* **Choice among nested regions.** Regions nest (a region inside one branch of another) and may
  overlap. We keep disjoint regions maximising the *parallel saving*: the work no longer run in
  series when a region's branches run on separate devices, total branch work minus the largest
  branch's. Over the containment tree, a region is kept when its saving is at least that of the
  best choice inside it (ties keep the outer region: fewer, larger pieces and fewer transfers),
  else the inner choices; overlapping survivors are then taken by decreasing saving. Why not
  simply the outermost region: a two-way split whose heavy branch holds a balanced eight-way
  region saves far less than that region. Regions that save nothing are dropped (on a graph
  without costs, node counts stand in for work).

All outputs are deterministic: ties break on node index (or topological rank).
"""

from __future__ import annotations

import logging
from functools import cached_property

import numpy as np

from outcore.graph.algorithms import topological_order
from outcore.graph.ir import Graph, memo
from outcore.placers.subgraph._kernel import closure_kernel, regions_kernel, tree_intervals
from outcore.placers.subgraph.dominators import (
    augmented_graph,
    post_dominator_tree,
    post_dominators,  # noqa: F401  (re-exported)
)
from outcore.placers.subgraph.region_sets import Region, RegionSet, Shapes

log = logging.getLogger(__name__)

VIRTUAL = -1  # fork = the graph's inputs (virtual source) or join = its outputs (virtual sink)


class Branches:
    """What :func:`find_branches` found.

    Attributes:
        chosen: the chosen disjoint regions, ordered by the topological rank of their fork,
            feeders attached, as columns (:class:`~outcore.placers.subgraph.region_sets.RegionSet`).
        truncated: True when the search stopped at its visit budget (huge nested regions); the
            regions found up to then are still exact.
    """

    def __init__(self, chosen: RegionSet, shapes: Shapes, weights: np.ndarray):
        self.chosen, self._shapes, self._weights = chosen, shapes, weights
        self.truncated = shapes.truncated

    @property
    def regions(self) -> tuple[Region, ...]:
        """The chosen regions as :class:`Region` objects."""
        return self.chosen.regions

    @cached_property
    def candidates(self) -> tuple[Region, ...]:
        """Every useful region found (without feeders), inner forks first."""
        return self._shapes.regions(self._weights)

    @property
    def branch_nodes(self) -> int:
        return self.chosen.branch_nodes


# ---------------------------------------------------------------------------- regions
def _weights(g: Graph) -> np.ndarray:
    """Node weight for balancing: forward + backward seconds (1 per node if all are zero)."""
    w = np.asarray(g.fwd_s + g.bwd_s, np.float64)
    return w if w.sum() > 0 else np.ones(g.num_nodes)


# the graphs (name, nodes, edges) whose fork-join search was cut short, told once
_TRUNCATED: set[tuple[str, int, int]] = set()


def fork_join_regions(g: Graph, *, order: np.ndarray | None = None,
                      max_visits: int | None = None) -> tuple[tuple[Region, ...], bool]:
    """Every useful fork-join region of ``g`` (two or more non-empty branches), inner forks first.

    Args:
        g: the graph.
        order: a topological order of ``g`` (computed if None).
        max_visits: edge visits allowed over all searches (default ``32 * (n + m) + 10**6``),
            and ``4 * (n + m) + 10**5`` region nodes kept in all; beyond either, the remaining
            (outer) forks are skipped. Deeply nested regions can hold O(n) nodes each (every
            weight node of an unrolled RNN forks to every time step), which these bounds cut.

    Returns ``(regions, truncated)``; ``work_s`` of a branch is its forward + backward seconds
    (its node count when the graph has no costs), feeders are empty.
    """
    if g.num_nodes == 0:
        return (), False
    shapes = _shapes(g, order, max_visits)
    return shapes.regions(_weights(g)), shapes.truncated


def _shapes(g: Graph, order: np.ndarray | None, max_visits: int | None) -> Shapes:
    """Every useful region of ``g``'s shape as columns, remembered per graph structure (unless
    another ``order`` is given)."""
    n = g.num_nodes
    cache = _shape_cache(g) if order is None else {}  # another order: not remembered
    if ("regions", max_visits) not in cache:
        f, j, rptr, nodes, labels, truncated = _region_shapes(
            g, topological_order(g) if order is None else order, max_visits)
        cache[("regions", max_visits)] = Shapes.from_search(f, j, rptr, nodes, labels, n,
                                                            truncated, VIRTUAL)
    shapes = cache[("regions", max_visits)]
    if shapes.truncated:  # once per graph shape: the layout search rescales the same graph
        key = (g.name, n, g.num_edges)
        (log.debug if key in _TRUNCATED else log.warning)(
            "graph %r: the fork-join search reached its budget; outer regions were not "
            "examined", g.name)
        _TRUNCATED.add(key)
    return shapes


def _region_shapes(g: Graph, order: np.ndarray, max_visits: int | None) -> tuple:
    """The compiled search's flat output (:func:`fork_join_regions`): edges alone decide it."""
    n = g.num_nodes
    ptr, idx, topo = augmented_graph(g, order)
    ipdom, jump, depth = post_dominator_tree(topo, ptr, idx)
    tin, tout = tree_intervals(ipdom, n + 1)
    rank = np.empty(n + 2, np.int64)
    rank[topo] = np.arange(n + 2)
    deg = np.diff(ptr)
    forks = topo[::-1][deg[topo[::-1]] >= 2]  # reverse topological: inner forks first
    if g.param_nodes.size:  # a weight read by several nodes forks no parallel work
        param = np.zeros(n + 2, np.bool_)
        param[g.param_nodes] = True
        forks = forks[~param[forks]]
    size = n + g.num_edges
    budget = 32 * size + 10**6 if max_visits is None else int(max_visits)
    return regions_kernel(forks, ipdom, jump, depth, tin, tout, rank, ptr, idx, n + 1, budget,
                           4 * size + 10**5)


def _shape_cache(g: Graph) -> dict:
    """Remembered per graph structure: the layout search rescales one graph's costs for each
    micro-batch size, and neither the search's regions per visit budget nor the feeders of a
    chosen set of regions depend on them."""
    return memo(g.structure, "branch shapes")


# ---------------------------------------------------------------------------- choice
def select_regions(g: Graph, regions: tuple[Region, ...]) -> tuple[Region, ...]:
    """A set of disjoint regions with the largest total parallel saving (module docstring), on
    region objects: the reference :func:`find_branches`' choice on columns is held to
    (:meth:`outcore.placers.subgraph.region_sets.Shapes.select`,
    ``tests/placers/test_branches.py``).

    Regions with no saving are dropped when the graph has costs. The result is ordered by the
    topological rank of the fork, with feeders attached (:func:`attach_feeders`).
    """
    n = g.num_nodes
    if not regions:
        return ()
    interiors = [r.interior for r in regions]
    sizes = np.array([x.size for x in interiors])
    # outer (larger) regions first; ties: smaller fork index (virtual source first)
    forks = np.fromiter((r.fork for r in regions), np.int64, len(regions))
    by_size = np.lexsort((np.arange(len(regions)), forks, -sizes)).tolist()
    owner = np.full(n, -1, np.int64)
    parent = np.full(len(regions), -1, np.int64)
    for i in by_size:  # parent: the smallest larger region holding this one's first node
        parent[i] = owner[interiors[i][0]]
        owner[interiors[i]] = i
    children: list[list[int]] = [[] for _ in regions]
    for i in by_size:
        if parent[i] >= 0:
            children[int(parent[i])].append(i)
    costed = float(g.fwd_s.sum() + g.bwd_s.sum()) > 0
    value = _savings(regions)
    best = np.zeros(len(regions))
    chosen: list[list[int]] = [[] for _ in regions]
    for i in reversed(by_size):  # inner first
        inner = float(sum(best[c] for c in children[i]))
        if value[i] >= inner * (1 - 1e-12) and (value[i] > 0 or not costed):  # ties: outer
            best[i], chosen[i] = value[i], [i]
        else:
            best[i], chosen[i] = inner, [x for c in children[i] for x in chosen[c]]
    picks = [x for i in by_size if parent[i] < 0 for x in chosen[i]]
    # overlapping (non-nested) regions: keep the larger saving, then the outer one
    picks.sort(key=lambda i: (-value[i], -sizes[i], regions[i].fork, i))
    taken = np.zeros(n, bool)
    ends = np.zeros(n, bool)
    keep = []
    for i in picks:
        r = regions[i]
        inner = interiors[i]
        if taken[inner].any() or ends[inner].any():
            continue
        if any(e >= 0 and taken[e] for e in (r.fork, r.join)):
            continue
        taken[inner] = True
        for e in (r.fork, r.join):
            if e >= 0:
                ends[e] = True
        keep.append(r)
    rank = np.empty(n, np.int64)
    rank[topological_order(g)] = np.arange(n)
    keep.sort(key=lambda r: (rank[r.fork] if r.fork >= 0 else -1, r.join))
    return attach_feeders(g, tuple(keep))


def _savings(regions: tuple[Region, ...]) -> np.ndarray:
    """Every region's :attr:`Region.saving_s`, in one pass over their branch works."""
    counts = np.fromiter((r.work_s.size for r in regions), np.int64, len(regions))
    value = np.zeros(len(regions))
    some = counts > 0
    if some.any():
        work = np.concatenate([r.work_s for r in regions])
        starts = np.cumsum(counts) - counts
        value[some] = (np.add.reduceat(work, starts[some])
                       - np.maximum.reduceat(work, starts[some]))
    return value


def attach_feeders(g: Graph, regions: tuple[Region, ...]) -> tuple[Region, ...]:
    """The regions with feeders and side branches attached, counted in the branches' work.

    A *feeder* of branch ``b`` is a node outside every chosen region (interiors, forks, joins,
    what earlier regions claimed) whose successors all lie in ``b`` or among ``b``'s feeders.
    A *side* node of a region is such a node whose successors all lie in the region (any
    branch, feeder, side node, or the join) without it feeding one branch only: the ops an
    AmoebaNet/NAS cell applies to its *other* input, which the fork does not reach. It cannot be
    an ancestor of the fork (it would need a successor outside the region). Side nodes form
    weakly connected components; a component that feeds one branch joins it as feeders, the
    others become extra branches at the end of ``branches`` (``Region.side`` counts them).
    The plain walk: the reference :class:`~outcore.placers.subgraph.region_sets.RegionSet` is held
    to (the search attaches feeders to its choice there, compiled).
    """
    w = _weights(g)
    n = g.num_nodes
    blocked = np.zeros(n, np.uint8)
    for r in regions:
        blocked[r.interior] = 1
        for e in (r.fork, r.join):
            if e >= 0:
                blocked[e] = 1
    adj = _Adjacency(g)
    out = []
    for r in regions:
        feeders = [adj.closure(b, blocked) for b in r.branches]
        branches = list(r.branches)
        inside = np.concatenate([r.interior] + [np.array(f, np.int64) for f in feeders]
                                + ([np.array([r.join], np.int64)] if r.join >= 0 else []))
        side = adj.closure(inside, blocked)
        extra = []
        if side:
            owner = {v: i for i, b in enumerate(branches) for v in b.tolist()}
            owner.update({v: i for i, f in enumerate(feeders) for v in f})
            for comp in adj.components(side):
                hit = sorted({owner[s] for v in comp for s in adj.succ(v) if s in owner})
                if len(hit) == 1:
                    feeders[hit[0]] = sorted(feeders[hit[0]] + comp)
                else:
                    extra.append(comp)
        branches += [np.array(c, np.int64) for c in extra]
        fed = tuple(np.array(f, np.int64) for f in feeders + [[] for _ in extra])
        for f in fed:
            blocked[f] = 1
        for c in extra:
            blocked[c] = 1
        work = np.array([float(w[b].sum() + w[f].sum()) for b, f in zip(branches, fed)])
        out.append(Region(r.fork, r.join, tuple(branches), fed, work, len(extra)))
    return tuple(out)


class _Adjacency:
    """Successor lists as Python lists (the side components' walks are per node), and the
    feeder closure on the graph's arrays."""

    def __init__(self, g: Graph):
        self._sp, self._si = g.succ_ptr.tolist(), g.succ_idx.tolist()
        self._arrays = (g.succ_ptr, g.succ_idx, g.pred_ptr, g.pred_idx)
        self._mark = np.full(g.num_nodes, -1, np.int64)
        self._stamp = 0
        self._stack = np.empty(g.num_nodes + 1, np.int64)  # (each node once)
        self._out = np.empty(g.num_nodes + 1, np.int64)
        self._count = np.zeros(g.num_nodes, np.int64)

    def succ(self, v: int) -> list[int]:
        return self._si[self._sp[v]:self._sp[v + 1]]

    def closure(self, targets: np.ndarray, blocked: np.ndarray) -> list[int]:
        """Nodes not blocked nor in ``targets`` whose successors all lie in ``targets`` or in
        the result (grown upward from the targets' predecessors), sorted."""
        self._stamp += 4  # marks of earlier calls are all below the new stamp
        found = closure_kernel(np.asarray(targets, np.int64), blocked, self._mark,
                                self._stamp, *self._arrays, self._stack, self._out,
                                self._count)
        return sorted(self._out[:found].tolist())

    def components(self, nodes: list[int]) -> list[list[int]]:
        """Weakly connected components of the sub-graph induced by ``nodes``, by first node."""
        label = {v: v for v in nodes}

        def find(x: int) -> int:
            while label[x] != x:
                label[x] = label[label[x]]
                x = label[x]
            return x

        for v in nodes:
            for s in self.succ(v):
                if s in label:
                    a, b = find(v), find(s)
                    label[max(a, b)] = min(a, b)
        comps: dict[int, list[int]] = {}
        for v in nodes:
            comps.setdefault(find(v), []).append(v)
        return [c for _, c in sorted(comps.items())]


def find_branches(g: Graph, *, max_visits: int | None = None) -> Branches:
    """Find the fork-join regions of ``g`` and choose the disjoint set to split (see module).

    Remembered per graph (a :class:`Graph` is immutable): the search plans the same graph
    under several memory limits and device counts, and the regions depend on neither; what
    depends on the edges alone is remembered for its rescaled copies too (:func:`_shape_cache`)."""
    found = memo(g, "branches")  # {max_visits: Branches}
    if max_visits not in found:
        shapes = _shapes(g, None, max_visits)
        w = _weights(g)
        rank = np.empty(g.num_nodes, np.int64)
        rank[topological_order(g)] = np.arange(g.num_nodes)
        kept = shapes.select(w, float(g.fwd_s.sum() + g.bwd_s.sum()) > 0, rank)
        cache = _shape_cache(g)  # which regions are kept depends on the work; their feeders not
        key = ("chosen", max_visits, kept.tobytes())
        if key not in cache:
            cache[key] = RegionSet.with_feeders(g, shapes, kept)
        found[max_visits] = Branches(cache[key].weighed(w), shapes, w)
    return found[max_visits]
