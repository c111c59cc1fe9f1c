"""Compiled longest-path passes (top and bottom levels) over a masked, partly clustered graph:
the graph's own (:func:`outcore.graph.algorithms.longest_from_sources`, every node active and
none clustered) and ParDNN's (:mod:`outcore.placers.pardnn.slicing`, the refinement).

``part[v] >= 0`` is the cluster (device) of node ``v``; ``-1`` means not clustered yet. An edge
costs its communication weight ``ecost[e]`` unless both ends are in the same cluster ("clustered"
levels, ParDNN section 4.1); with every ``part`` at -1 the levels are the unclustered ones.
Nodes with ``active[v] == False`` are ignored (their level stays 0), which gives the levels of the
remaining graph during slicing.
"""

from __future__ import annotations

import numpy as np

from outcore.graph.jit import njit


@njit
def bottom_levels(order, succ_ptr, succ_idx, succ_edge, w, ecost, part, active):
    """``bl(v) = w(v) + max over active successors s of (cost(v, s) + bl(s))``, seconds."""
    n = order.shape[0]
    bl = np.zeros(n, np.float64)
    for i in range(n - 1, -1, -1):
        v = order[i]
        if not active[v]:
            continue
        pv = part[v]
        best = 0.0
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            s = succ_idx[k]
            if not active[s]:
                continue
            c = bl[s]
            if pv < 0 or part[s] != pv:
                c += ecost[succ_edge[k]]
            if c > best:
                best = c
        bl[v] = w[v] + best
    return bl


@njit
def top_levels(order, pred_ptr, pred_idx, pred_edge, w, ecost, part, active):
    """``tl(v) = max over active predecessors u of (tl(u) + w(u) + cost(u, v))``, seconds."""
    n = order.shape[0]
    tl = np.zeros(n, np.float64)
    for i in range(n):
        v = order[i]
        if not active[v]:
            continue
        pv = part[v]
        best = 0.0
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[k]
            if not active[u]:
                continue
            c = tl[u] + w[u]
            if pv < 0 or part[u] != pv:
                c += ecost[pred_edge[k]]
            if c > best:
                best = c
        tl[v] = best
    return tl
