"""Compiled inner loop of :func:`outcore.plan.pieces.cut`: hop levels and piece components.

One pass in topological order gives ``hop(v)`` (the most boundaries on any path into ``v``); a
pass in reverse moves a node that sends nothing to its earliest consumer's hop when a message
of its device would otherwise wait for it; a union-find over the edges whose ends share key and
hop gives the pieces (connected components). Written in the subset of Python numba compiles
(:mod:`outcore.graph.jit`); plain Python without numba, same results.
"""

from __future__ import annotations

import numpy as np

from outcore.graph.jit import njit, njit_borrowing

__all__ = ["hop_levels", "piece_components", "segment_bounds", "sends_kernel"]


@njit
def sends_kernel(succ_ptr, succ_idx, key):
    """``bool[n]``: the nodes with a successor of another ``key`` (their output leaves)."""
    n = succ_ptr.shape[0] - 1
    out = np.zeros(n, np.bool_)
    for v in range(n):
        kv = key[v]
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            if key[succ_idx[k]] != kv:
                out[v] = True
                break
    return out


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
    # A node that sends nothing may run in any piece of its device from its earliest hop to
    # its earliest consumer's (the hop before it, across a key change). It runs as early as
    # it can (filling the time its device would wait for messages) unless a message of its
    # device departs in between that it does not feed: then it runs just in time, so that
    # message leaves after only the work it needs (the first device of an RNN grid would
    # otherwise run every time step of its first layer before its first message). Senders
    # and sinks keep their earliest hop; a source whose consumers all share its key joins its
    # earliest consumer's piece.
    span = h.max() + 1 if n else 1
    sends = np.sort(key[cut_after] * span + h[cut_after])  # (key, hop) of every sender
    out = h.copy()
    for i in range(n - 1, -1, -1):
        v = order[i]
        if cut_after[v] or succ_ptr[v] == succ_ptr[v + 1]:
            continue
        low = -1
        same = True
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            w = succ_idx[k]
            x = out[w]
            if key[w] != key[v]:
                x -= 1
                same = False
            if low < 0 or x < low:
                low = x
        if low > h[v] and (_sends_between(sends, key[v] * span + h[v], key[v] * span + low)
                           or (same and pred_ptr[v] == pred_ptr[v + 1])):
            out[v] = low
    return out


@njit_borrowing
def _sends_between(sends, lo, hi):
    """Whether a value of the sorted ``sends`` lies in ``[lo, hi)``."""
    i = np.searchsorted(sends, lo)
    return i < sends.shape[0] and sends[i] < hi


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


@njit
def segment_bounds(ptr, rows, weights, counts):
    """Consecutive segments of each row ``r`` of ``rows`` (the slice ``ptr[r]:ptr[r + 1]`` of
    ``weights``, per position), ``counts[r]`` of them, cut as :func:`outcore.plan.policies.
    segments` cuts (near-equal weight, or equal length when the row weighs nothing): returns
    ``(start, row)`` per segment, starts as positions in ``weights``, rows in order."""
    total = 0
    for j in range(rows.shape[0]):
        r = rows[j]
        total += max(1, min(counts[r], ptr[r + 1] - ptr[r]))
    start = np.empty(total, np.int64)
    row = np.empty(total, np.int64)
    cuts = np.empty(max(total, 1), np.int64)
    m = 0
    for j in range(rows.shape[0]):
        r = rows[j]
        lo, size = ptr[r], ptr[r + 1] - ptr[r]
        count = max(1, min(counts[r], size))
        weighs = False
        for i in range(lo, lo + size):
            if weights[i] != 0.0:
                weighs = True
        start[m] = lo
        row[m] = r
        m += 1
        if count == 1:
            continue
        if not weighs:  # numpy's array_split: the first size % count parts one longer
            base, extra = size // count, size % count
            at = lo
            for q in range(count - 1):
                at += base + (1 if q < extra else 0)
                start[m] = at
                row[m] = r
                m += 1
            continue
        cum_last = 0.0
        for i in range(lo, lo + size):
            cum_last += weights[i]
        n_cut = 0
        i, acc = 0, weights[lo]  # acc: the running sum through position i (numpy's cumsum)
        for q in range(1, count):  # searchsorted(cum, cum[-1] * q / count, side="right")
            thr = cum_last * q / count  # (ascending in q: the scan goes on from i)
            while i < size and acc <= thr:
                i += 1
                if i < size:
                    acc += weights[lo + i]
            cuts[n_cut] = min(max(i, 1), size - 1)
            n_cut += 1
        last = 0
        for q in range(n_cut):  # already ascending: keep the distinct ones
            if cuts[q] != last:
                start[m] = lo + cuts[q]
                row[m] = r
                m += 1
                last = cuts[q]
    return start[:m], row[:m]
