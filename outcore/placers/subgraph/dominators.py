"""Post-dominators of a DAG (used to find fork-join regions; pure numpy, numba-compiled).

A virtual sink follows every sink (and a virtual source precedes every source), so every DAG has
one exit. ``d`` post-dominates ``v`` when every path from ``v`` to the exit passes ``d``. On a
DAG the immediate post-dominator of ``v`` is the lowest common ancestor, in the post-dominator
tree, of ``v``'s successors; visiting nodes in reverse topological order gives it in one pass
(Cooper, Harvey and Kennedy's "intersect", with the tree's LCA answered by skew-binary jump
pointers (Myers 1983), O(log n) per query, so that long skip edges do not make the pass
quadratic).
"""

from __future__ import annotations

import numpy as np

from outcore.graph.algorithms import topological_order
from outcore.graph.ir import Graph
from outcore.placers._jit import njit, njit_borrowing

VIRTUAL = -1  # the virtual source or sink


def augmented_graph(g: Graph, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Successor CSR over ``n + 2`` nodes (``n`` = virtual source, ``n + 1`` = virtual sink)
    and a topological order of it."""
    n = g.num_nodes
    srcs = np.flatnonzero(g.in_degree == 0)
    snks = np.flatnonzero(g.out_degree == 0)
    s = np.concatenate((g.src, np.full(srcs.size, n, np.int64), snks))
    d = np.concatenate((g.dst, srcs, np.full(snks.size, n + 1, np.int64)))
    perm = np.lexsort((d, s))
    s, d = s[perm], d[perm]
    ptr = np.zeros(n + 3, np.int64)
    np.cumsum(np.bincount(s, minlength=n + 2), out=ptr[1:])
    topo = np.concatenate(([n], order, [n + 1])).astype(np.int64)
    return ptr, d.astype(np.int64), topo


@njit_borrowing
def lca(a, b, parent, jump, depth):
    if depth[a] < depth[b]:
        a, b = b, a
    while depth[a] > depth[b]:
        if depth[jump[a]] >= depth[b]:
            a = jump[a]
        else:
            a = parent[a]
    while a != b:
        if jump[a] != jump[b]:
            a = jump[a]
            b = jump[b]
        else:
            a = parent[a]
            b = parent[b]
    return a


@njit
def post_dominator_tree(topo, ptr, idx):
    """Immediate post-dominator of every node of the augmented graph (root: itself), with the
    tree's jump pointers and depths (for LCA queries)."""
    m = topo.shape[0]
    parent = np.full(m, -1, np.int64)
    jump = np.full(m, -1, np.int64)
    depth = np.zeros(m, np.int64)
    root = topo[m - 1]
    parent[root] = root
    jump[root] = root
    for i in range(m - 2, -1, -1):
        v = topo[i]
        a = -1
        for k in range(ptr[v], ptr[v + 1]):
            s = idx[k]
            a = s if a < 0 else lca(a, s, parent, jump, depth)
        if a < 0:  # no successor at all (only the virtual source of an empty graph)
            a = root
        parent[v] = a
        depth[v] = depth[a] + 1
        ja = jump[a]
        if depth[a] - depth[ja] == depth[ja] - depth[jump[ja]]:
            jump[v] = jump[ja]
        else:
            jump[v] = a
    return parent, jump, depth


def post_dominators(g: Graph, order: np.ndarray | None = None) -> np.ndarray:
    """``int64[n]``: immediate post-dominator of each node, -1 where it is the virtual sink.

    ``d`` post-dominates ``v`` when every path from ``v`` to any sink passes ``d``; the
    immediate one is the closest. Works with any number of sources and sinks.
    """
    n = g.num_nodes
    if n == 0:
        return np.zeros(0, np.int64)
    order = topological_order(g) if order is None else order
    ptr, idx, topo = augmented_graph(g, order)
    ip = post_dominator_tree(topo, ptr, idx)[0][:n].copy()
    ip[ip >= n] = VIRTUAL
    return ip
