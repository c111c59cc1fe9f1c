"""Free functions over a :class:`~outcore.graph.ir.Graph`: order, levels, paths.

All functions take and return node *indices*. They are deterministic: ties break on index.
Loops run over Python lists built once from the CSR arrays, which keeps them near 1 s per
million edges; vectorised numpy is used where a loop is not needed.
"""

from __future__ import annotations

import numpy as np

from outcore.graph.ir import Graph
from outcore.graph.level_kernel import bottom_levels, top_levels
from outcore.graph.order import find_cycle, topological_order

__all__ = ["critical_path", "depth_levels", "find_cycle", "longest_from_sources",
           "longest_to_sinks", "sinks", "sources", "topological_order",
           "weakly_connected_components"]


def sources(g: Graph) -> np.ndarray:
    """Nodes without predecessors."""
    return np.flatnonzero(g.in_degree == 0)


def sinks(g: Graph) -> np.ndarray:
    """Nodes without successors."""
    return np.flatnonzero(g.out_degree == 0)


def depth_levels(g: Graph, order: np.ndarray | None = None) -> np.ndarray:
    """Longest path from any source counted in edges (sources have level 0)."""
    return longest_from_sources(g, np.zeros(g.num_nodes), np.ones(g.num_edges), order).astype(
        np.int64)


def longest_from_sources(g: Graph, node_w: np.ndarray, edge_w: np.ndarray,
                         order: np.ndarray | None = None) -> np.ndarray:
    """Top level: ``tl(v) = max_u tl(u) + node_w(u) + edge_w(u, v)``; sources start at 0.

    ``tl(v)`` is the earliest start of ``v`` with unlimited devices. ``edge_w`` is indexed by
    edge number.
    """
    return top_levels(*_sweep_args(g, order, node_w, edge_w, g.pred_ptr, g.pred_idx,
                                   g.pred_edge))


def longest_to_sinks(g: Graph, node_w: np.ndarray, edge_w: np.ndarray,
                     order: np.ndarray | None = None) -> np.ndarray:
    """Bottom level: ``bl(v) = node_w(v) + max_s edge_w(v, s) + bl(s)``, including ``v`` itself."""
    return bottom_levels(*_sweep_args(g, order, node_w, edge_w, g.succ_ptr, g.succ_idx,
                                      g.succ_edge))


def _sweep_args(g: Graph, order, node_w, edge_w, ptr, idx, edges) -> tuple:
    """The compiled sweeps' arguments (:mod:`outcore.graph.level_kernel`), every node active
    and none clustered: every edge costs its weight."""
    order = topological_order(g) if order is None else order
    n = g.num_nodes
    return (np.ascontiguousarray(order, np.int64), ptr, idx, edges,
            np.ascontiguousarray(node_w, np.float64), np.asarray(edge_w, dtype=np.float64),
            np.full(n, -1, np.int64), np.ones(n, dtype=np.bool_))


def critical_path(g: Graph, node_w: np.ndarray | None = None,
                  edge_w: np.ndarray | None = None) -> tuple[float, list[int]]:
    """Length and nodes of the longest path under the given weights.

    Defaults: node weight = forward + backward time, edge weight = 0 (pure compute path).
    """
    if g.num_nodes == 0:
        return 0.0, []
    w = g.fwd_s + g.bwd_s if node_w is None else np.asarray(node_w, dtype=np.float64)
    ew = np.zeros(g.num_edges) if edge_w is None else np.asarray(edge_w, dtype=np.float64)
    order = topological_order(g)
    bl = longest_to_sinks(g, w, ew, order)
    v = int(np.argmax(np.where(g.in_degree == 0, bl, -np.inf)))
    path = [v]
    ptr, succ, sedge = g.succ_ptr, g.succ_idx, g.succ_edge
    while ptr[v] != ptr[v + 1]:
        ks = np.arange(ptr[v], ptr[v + 1])
        vals = ew[sedge[ks]] + bl[succ[ks]]
        v = int(succ[ks[int(np.argmax(vals))]])
        path.append(v)
    return float(bl[path[0]]), path


def weakly_connected_components(g: Graph, mask: np.ndarray | None = None) -> np.ndarray:
    """Component label per node, over the nodes where ``mask`` is true (others get -1).

    Labels are numbered in order of each component's smallest index. Vectorised min-label
    hooking with pointer jumping (Shiloach and Vishkin 1982): every round hooks each edge's
    larger root onto the smaller, then flattens the trees; a few rounds on real graphs.
    """
    n = g.num_nodes
    keep = np.ones(n, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    src, dst = np.asarray(g.src, np.int64), np.asarray(g.dst, np.int64)
    both = keep[src] & keep[dst]
    src, dst = src[both], dst[both]
    parent = np.arange(n, dtype=np.int64)
    while src.size:
        ps, pd = parent[src], parent[dst]
        differ = ps != pd
        if not differ.any():
            break
        ps, pd = ps[differ], pd[differ]
        low, high = np.minimum(ps, pd), np.maximum(ps, pd)
        np.minimum.at(parent, high, low)
        while True:  # pointer jumping: every node straight onto its root
            up = parent[parent]
            if np.array_equal(up, parent):
                break
            parent = up
        src, dst = src[differ], dst[differ]
    labels = np.full(n, -1, dtype=np.int64)
    roots = parent[keep]
    _, labels[keep] = np.unique(roots, return_inverse=True)
    return labels
