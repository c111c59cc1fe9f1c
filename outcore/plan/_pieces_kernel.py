"""Compiled inner loop of :func:`outcore.plan.pieces.cut`: hop levels and piece components.

One pass in topological order gives ``hop(v)`` (the most boundaries on any path into ``v``);
a union-find over the edges whose ends share key and hop gives the pieces (connected
components). Written in the subset of Python numba compiles (:mod:`outcore.graph._jit`); plain
Python without numba, same results.
"""

from __future__ import annotations

import numpy as np

from outcore.graph._jit import njit

__all__ = ["hop_levels", "piece_components"]


@njit
def hop_levels(order, pred_ptr, pred_idx, succ_ptr, succ_idx, key, cut_after):
    """``hop[v]`` per node (see :func:`outcore.plan.pieces.hops`)."""
    n = order.shape[0]
    h = np.zeros(n, np.int64)
    for i in range(n):
        v = order[i]
        best = 0
        kv = key[v]
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[k]
            x = h[u]
            if key[u] != kv or cut_after[u]:
                x += 1
            if x > best:
                best = x
        h[v] = best
    # a source whose consumers all share its key and that need not send joins its earliest
    # consumer's piece (the smallest consumer hop)
    out = h.copy()
    for v in range(n):
        if pred_ptr[v] == pred_ptr[v + 1] and succ_ptr[v] < succ_ptr[v + 1] and not cut_after[v]:
            same = True
            low = -1
            for k in range(succ_ptr[v], succ_ptr[v + 1]):
                w = succ_idx[k]
                if key[w] != key[v]:
                    same = False
                    break
                if low < 0 or h[w] < low:
                    low = h[w]
            if same:
                out[v] = low
    return out


@njit
def piece_components(n, src, dst, key, hop):
    """Component root per node over the edges whose ends share ``key`` and ``hop``."""
    parent = np.arange(n)
    for e in range(src.shape[0]):
        a = src[e]
        b = dst[e]
        if key[a] != key[b] or hop[a] != hop[b]:
            continue
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        while parent[b] != b:
            parent[b] = parent[parent[b]]
            b = parent[b]
        if a < b:
            parent[b] = a
        elif b < a:
            parent[a] = b
    for v in range(n):
        r = v
        while parent[r] != r:
            r = parent[r]
        parent[v] = r
    return parent
