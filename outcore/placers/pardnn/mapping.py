"""ParDNN step 1b, *mapping*: secondary clusters onto primaries by level-aware load balancing.

Qararyah et al. 2021, section 4.1 ("Mapping"): each primary cluster is a device. Secondary
clusters are taken most critical first; each goes to the device with the least load within the
cluster's *span* (the time window in which it can run without lengthening the critical path),
traded against the communication that device would add.

The span of a secondary path with head ``h`` and tail ``t`` is ``[tl(h), L - bl(t) + w(t)]``:
earliest start to latest finish, with ``L`` the clustered critical path (top and bottom levels
after slicing). Device loads are kept per time bucket (the node's top level picks the bucket) in
one Fenwick tree per device, so a span query costs ``O(log B)``. A device's score for cluster
``S`` is::

    delay(k) + cut(k),  delay(k) = max(0, load_k(span) + w(S) - len(span))

where ``cut(k)`` is the forward + backward transfer time of the edges between ``S`` and nodes
already placed on other devices. Ties go to the least loaded, then the lowest device. This is the
"final rule" of the reference (least load in the span minus communication with the primary)
with the load counted as *delay beyond the span's slack*, so a cluster that fits in a device's
idle time costs nothing there; the reference's comm-heavy merge rules (A, B, C) are subsumed by
the cut term.
"""

from __future__ import annotations

import numpy as np

from outcore.placers._jit import njit, njit_borrowing
from outcore.placers.context import Context
from outcore.placers.pardnn.slicing import Slices


def map_secondaries(ctx: Context, sl: Slices) -> np.ndarray:
    """Assign every node to one of ``sl.primaries`` devices; return ``int64[n]``."""
    g = ctx.g
    n = g.num_nodes
    part = sl.part.copy()
    if sl.num_secondaries == 0:
        return part
    w = ctx.work_s
    tl, bl = sl.tl_s, sl.bl_s
    length = float((tl + bl).max())
    buckets = int(min(max(n // 4, 1), 1 << 16))
    scale = buckets / length if length > 0 else 0.0
    node_bucket = np.minimum((tl * scale).astype(np.int64), buckets - 1)
    heads = sl.sec_nodes[sl.sec_ptr[:-1]]
    tails = sl.sec_nodes[sl.sec_ptr[1:] - 1]
    cw = np.add.reduceat(w[sl.sec_nodes], sl.sec_ptr[:-1])
    lo = tl[heads]
    hi = np.maximum(length - bl[tails] + w[tails], lo)
    b_lo = np.minimum((lo * scale).astype(np.int64), buckets - 1)
    b_hi = np.minimum((hi * scale).astype(np.int64), buckets - 1)
    _map(sl.sec_ptr, sl.sec_nodes, cw, b_lo, b_hi, hi - lo, node_bucket, part, w,
         g.succ_ptr, g.succ_idx, g.succ_edge, g.pred_ptr, g.pred_idx, g.pred_edge,
         ctx.edge_bytes, ctx.lat_s, ctx.inv_bw, sl.primaries, buckets)
    return part


@njit_borrowing
def _fen_add(fen, d, i, x):
    i += 1
    size = fen.shape[1]
    while i < size:
        fen[d, i] += x
        i += i & (-i)


@njit_borrowing
def _fen_prefix(fen, d, i):
    """Sum of buckets ``0 .. i-1``."""
    s = 0.0
    while i > 0:
        s += fen[d, i]
        i -= i & (-i)
    return s


@njit
def _map(ptr, nodes, cw, b_lo, b_hi, span_len, node_bucket, part, w, succ_ptr, succ_idx,
         succ_edge, pred_ptr, pred_idx, pred_edge, edge_bytes, lat, inv_bw, k, buckets):
    n = part.shape[0]
    fen = np.zeros((k, buckets + 1))
    for v in range(n):
        if part[v] >= 0:
            _fen_add(fen, part[v], node_bucket[v], w[v])
    cut = np.zeros(k)
    for c in range(ptr.shape[0] - 1):
        for x in range(k):
            cut[x] = 0.0
        for i in range(ptr[c], ptr[c + 1]):
            v = nodes[i]
            for side in range(2):
                if side == 0:
                    a, b = succ_ptr[v], succ_ptr[v + 1]
                else:
                    a, b = pred_ptr[v], pred_ptr[v + 1]
                for j in range(a, b):
                    if side == 0:
                        u = succ_idx[j]
                        eb = edge_bytes[succ_edge[j]]
                    else:
                        u = pred_idx[j]
                        eb = edge_bytes[pred_edge[j]]
                    du = part[u]
                    if du < 0 or eb <= 0:
                        continue
                    for x in range(k):
                        if x != du:
                            cut[x] += 2.0 * (lat[x, du] + eb * inv_bw[x, du])
        best = -1
        best_score = 0.0
        best_load = 0.0
        for x in range(k):
            load = _fen_prefix(fen, x, b_hi[c] + 1) - _fen_prefix(fen, x, b_lo[c])
            delay = load + cw[c] - span_len[c]
            if delay < 0.0:
                delay = 0.0
            score = delay + cut[x]
            if best < 0 or score < best_score or (score == best_score and load < best_load):
                best = x
                best_score = score
                best_load = load
        for i in range(ptr[c], ptr[c + 1]):
            v = nodes[i]
            part[v] = best
            _fen_add(fen, best, node_bucket[v], w[v])
    return 0
