"""Topological order and cycles of a graph: what validating a graph needs, kept apart from
:mod:`outcore.graph.algorithms` so that :mod:`outcore.graph.ir` can check its graphs with them
(ties break on index)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from outcore.errors import GraphError

if TYPE_CHECKING:
    from outcore.graph.ir import Graph

__all__ = ["find_cycle", "topological_order"]


def topological_order(g: Graph, *, strict: bool = True) -> np.ndarray:
    """Indices of ``g`` in a topological order (index order when that already is one).

    Kahn's algorithm with a FIFO seeded in index order. With ``strict`` a cycle raises
    :class:`GraphError`; without, the partial order (shorter than ``n``) is returned.
    """
    n = g.num_nodes
    if g.num_edges == 0 or bool((g.src < g.dst).all()):
        return np.arange(n, dtype=np.int64)
    indeg = g.in_degree.tolist()
    ptr = g.succ_ptr.tolist()
    succ = g.succ_idx.tolist()
    queue = deque(i for i in range(n) if indeg[i] == 0)
    order: list[int] = []
    append = order.append
    while queue:
        u = queue.popleft()
        append(u)
        for k in range(ptr[u], ptr[u + 1]):
            v = succ[k]
            indeg[v] -= 1
            if indeg[v] == 0:
                queue.append(v)
    if strict and len(order) != n:
        raise GraphError(f"graph {g.name!r} has a cycle; a training graph must be acyclic")
    return np.asarray(order, dtype=np.int64)


def find_cycle(g: Graph) -> list[int]:
    """One cycle of ``g`` as a list of node indices (empty if ``g`` is acyclic)."""
    ptr = g.succ_ptr.tolist()
    succ = g.succ_idx.tolist()
    state = [0] * g.num_nodes  # 0 new, 1 on stack, 2 done
    for root in range(g.num_nodes):
        if state[root]:
            continue
        stack = [(root, ptr[root])]
        path = [root]
        state[root] = 1
        while stack:
            u, k = stack[-1]
            if k == ptr[u + 1]:
                stack.pop()
                path.pop()
                state[u] = 2
                continue
            stack[-1] = (u, k + 1)
            v = succ[k]
            if state[v] == 1:
                return path[path.index(v):] + [v]
            if state[v] == 0:
                state[v] = 1
                stack.append((v, ptr[v]))
                path.append(v)
    return []
