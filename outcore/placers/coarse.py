"""Planning a very large graph on its chains: the search's planners place a coarsened copy.

Above :data:`COARSEN_ABOVE` nodes the placement search (:func:`outcore.search.loop.
_best_placement`) places a coarsened graph of about :data:`TARGET_NODES` nodes, ranks the
placements by emulating them there, and projects each back to every node; the simulator then
judges the projected placements on the full graph, as always (so the time and memory a plan
reports are the full graph's). METIS and dagP coarsen the same way before they partition; what
a placement decides at a million nodes (which branch, which layers, which time steps go where)
is decided as well by a tenth of them.

A **cluster** is a run of consecutive nodes of a topological order in which every node after
the first consumes the output of an earlier node of the run, of at most ``ceil(n /
TARGET_NODES)`` nodes. Runs of a topological order contract to an acyclic graph (every edge
between runs goes forward), and a node that reads nothing of the run starts a new one, so
independent branches are never merged: one whose head follows another branch's tail in the
order would otherwise wait for that whole branch. The order is the graph's own or depth-first
(:func:`outcore.placers.contiguous.depth_first_order`, which finishes a branch before the
next), whichever gives fewer clusters: an RNN grid in its own order gives cells of a time step,
AmoebaNet-like cells depth-first give their branches. A graph that does not shrink to at most
half (:data:`MIN_SHRINK`) is placed as it is.

Coarse costs are sums over a cluster (forward, backward, parameters, saved activations); its
output buffer is its largest member's (the memory model's working buffer), and an edge between
clusters carries each producer's tensor once (its largest edge into the consuming cluster).
A parameter read (op ``param``) reads nothing, so it starts a cluster: it stays a node of its
own, with its op (so the planners still move weights beside their users), unless the next node
in the order reads it, which then joins it (the weight is placed with that reader).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from outcore.graph.ir import Graph, build, memo
from outcore.placers._jit import njit
from outcore.placers.context import make_context, max_by_device

__all__ = ["COARSEN_ABOVE", "Coarse", "chain_clusters", "coarsened"]

# graphs with more nodes than this are placed on their coarsened copy
COARSEN_ABOVE = 250_000
# about this many clusters (each at most ceil(nodes / TARGET_NODES) nodes)
TARGET_NODES = 100_000
# the coarsened graph is used only when it has at most this fraction of the nodes
MIN_SHRINK = 0.5


@dataclass(frozen=True, eq=False)
class Coarse:
    """A graph's coarsened copy. ``group[i]``: the cluster (node of ``graph``) of node ``i``
    of the full graph; clusters are numbered in a topological order of ``graph``."""

    graph: Graph
    group: np.ndarray
    order_name: str

    def projected(self, result, lower_bound_s: float):
        """A planner's result on :attr:`graph` as a placement of the full graph, with the
        full graph's ``lower_bound_s`` (a coarse critical path is longer: clusters run their
        members one after another); its emulated time and memory are the coarse graph's."""
        return replace(result, assignment=np.ascontiguousarray(result.assignment[self.group]),
                       lower_bound_s=lower_bound_s, notes=tuple(result.notes) + (self.note(),))

    def on_clusters(self, assignment: np.ndarray) -> np.ndarray | None:
        """The placement of :attr:`graph` that ``assignment`` (of the full graph) projects
        from; None when some cluster's nodes are on different devices."""
        a = np.asarray(assignment, np.int64)
        out = np.zeros(self.graph.num_nodes, np.int64)
        out[self.group] = a
        return out if np.array_equal(out[self.group], a) else None

    def note(self) -> str:
        return (f"placed on the graph coarsened to {self.graph.num_nodes} clusters of "
                f"consecutive dependent nodes ({self.order_name} order) of its "
                f"{self.group.size} nodes; simulated at full size")


@njit
def _runs(order: np.ndarray, pred_ptr: np.ndarray, pred_idx: np.ndarray, cap: int
          ) -> tuple[np.ndarray, int]:
    """Cluster of each node: runs of ``order`` of at most ``cap`` nodes in which each node
    after the first has a predecessor in the run."""
    n = order.size
    rank = np.empty(n, np.int64)
    for i in range(n):
        rank[order[i]] = i
    group = np.empty(n, np.int64)
    k = -1
    start = 0
    for i in range(n):
        v = order[i]
        join = False
        if k >= 0 and i - start < cap:
            for j in range(pred_ptr[v], pred_ptr[v + 1]):
                if rank[pred_idx[j]] >= start:
                    join = True
                    break
        if not join:
            k += 1
            start = i
        group[v] = k
    return group, k + 1


def chain_clusters(g: Graph, cap: int) -> tuple[np.ndarray, int, str]:
    """``(group, clusters, order name)``: :func:`_runs` on the graph's own topological order
    and on the depth-first one, whichever gives fewer clusters (the first on a tie)."""
    from outcore.placers.contiguous import depth_first_order

    ctx = make_context(g, 1)
    pp = np.ascontiguousarray(g.pred_ptr, np.int64)
    pi = np.ascontiguousarray(g.pred_idx, np.int64)
    best = None
    for name, order in (("the graph's own", ctx.order), ("depth-first", None)):
        if order is None:
            order = depth_first_order(ctx)
        group, k = _runs(np.ascontiguousarray(order, np.int64), pp, pi, int(cap))
        if best is None or k < best[1]:
            best = (group, k, name)
    assert best is not None
    return best


@dataclass(frozen=True, eq=False)
class _Shape:
    """What a coarsening keeps of a graph's structure (shared by its rescaled copies): the
    clusters, the coarse edges, and which full edges carry each producer's tensor into a
    cluster (``perm`` sorted by (producer, consuming cluster), ``starts`` of each such key,
    ``edge_of_key``: the coarse edge each key adds to)."""

    group: np.ndarray
    clusters: int
    order_name: str
    src: np.ndarray
    dst: np.ndarray
    perm: np.ndarray
    starts: np.ndarray
    edge_of_key: np.ndarray
    ops: tuple[str, ...] | None


def coarsened(g: Graph, *, above: int | None = None, target: int | None = None
              ) -> Coarse | None:
    """``g``'s coarsened copy when it has more than ``above`` (:data:`COARSEN_ABOVE`) nodes
    and shrinks to at most :data:`MIN_SHRINK` of them; else None. Made once per graph, its
    clusters once per graph structure (the layout search's rescaled copies share them)."""
    above = COARSEN_ABOVE if above is None else above
    if g.num_nodes <= above:
        return None
    cap = max(1, math.ceil(g.num_nodes / (TARGET_NODES if target is None else target)))
    made = memo(g, "coarsened")  # {cap: Coarse | None}
    if cap not in made:
        # {cluster cap: (its _Shape, [its first coarse graph])}
        shapes = memo(g.structure, "coarse shapes")
        if cap not in shapes:
            shapes[cap] = (_shape(g, cap), [])
        shape, first = shapes[cap]
        made[cap] = None if shape.clusters > MIN_SHRINK * g.num_nodes else Coarse(
            graph=_costed(g, shape, first), group=shape.group, order_name=shape.order_name)
    return made[cap]


def _shape(g: Graph, cap: int) -> _Shape:
    group, k, name = chain_clusters(g, cap)
    gs, gd = group[g.src], group[g.dst]
    cross = np.flatnonzero(gs != gd)
    # one tensor per (producer node, consuming cluster)
    key = g.src[cross] * np.int64(k) + gd[cross]
    perm = cross[np.argsort(key, kind="stable")]
    skey = g.src[perm] * np.int64(k) + gd[perm]
    starts = np.flatnonzero(np.r_[True, skey[1:] != skey[:-1]]) if perm.size else \
        np.zeros(0, np.int64)
    kp = gs[perm[starts]] * np.int64(k) + gd[perm[starts]]  # (producer cluster, consumer)
    pairs, edge_of_key = np.unique(kp, return_inverse=True)
    sizes = np.bincount(group, minlength=k)
    ops = None
    if g.ops is not None:
        first = np.full(k, g.num_nodes, np.int64)
        np.minimum.at(first, group, np.arange(g.num_nodes))
        ops = tuple(g.ops[int(f)] if s == 1 else "block" for f, s in zip(first.tolist(),
                                                                         sizes.tolist()))
    return _Shape(group=group, clusters=k, order_name=name, src=pairs // k, dst=pairs % k,
                  perm=perm, starts=starts, edge_of_key=edge_of_key.reshape(-1), ops=ops)


def _costed(g: Graph, s: _Shape, first: list[Graph]) -> Graph:
    """The coarse graph of ``s`` with ``g``'s costs (a rescaled copy of a graph already
    coarsened shares the first coarse graph's structure and its caches)."""
    k = s.clusters

    def sums(a: np.ndarray) -> np.ndarray:
        return np.bincount(s.group, weights=np.asarray(a, np.float64), minlength=k)

    per_key = (np.maximum.reduceat(np.asarray(g.edge_bytes, np.float64)[s.perm], s.starts)
               if s.starts.size else np.zeros(0))
    edge_bytes = np.bincount(s.edge_of_key, weights=per_key, minlength=s.src.size)
    out_bytes = max_by_device(s.group, np.asarray(g.out_bytes, np.float64), k)  # per cluster
    costs = dict(fwd_s=sums(g.fwd_s), bwd_s=sums(g.bwd_s),
                 param_bytes=np.rint(sums(g.param_bytes)).astype(np.int64),
                 saved_bytes=np.rint(sums(g.saved_bytes)).astype(np.int64),
                 out_bytes=out_bytes.astype(np.int64),
                 edge_bytes=np.rint(edge_bytes).astype(np.int64))
    meta = {**g.meta, "coarsened_from": g.num_nodes}
    if first:
        return first[0].replace(**costs, batch_size=g.batch_size, meta=meta)
    cg = build(f"{g.name} (coarsened)", src=s.src, dst=s.dst, ops=s.ops,
               batch_size=g.batch_size, meta=meta, check=False, **costs)
    first.append(cg)
    return cg
