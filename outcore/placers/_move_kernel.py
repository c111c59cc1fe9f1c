"""Compiled helpers that price moving nodes between devices (communication time), and check
which nodes a move would take (:func:`row_marked`).

``cost(a, b, bytes)`` of an edge whose ends are on devices ``a`` and ``b`` is 0 on one device or
for a 0-byte edge, else ``2 * (latency + bytes / bandwidth)``: the tensor in the forward and its
gradient in the backward.
"""

from __future__ import annotations

import numpy as np

from outcore.placers._jit import njit, njit_borrowing


@njit_borrowing
def edge_cost(a, b, eb, lat, inv_bw):
    """Forward + backward transfer seconds of ``eb`` bytes from device ``a`` to ``b``."""
    if a == b or eb <= 0:
        return 0.0
    return 2.0 * (lat[a, b] + eb * inv_bw[a, b])


@njit_borrowing
def set_move_delta(nodes, target, assign, mark, succ_ptr, succ_idx, succ_edge, pred_ptr,
                   pred_idx, pred_edge, edge_bytes, lat, inv_bw):
    """Change of communication seconds if every node of ``nodes`` moves to ``target``.

    Edges inside the set do not change. ``mark`` is a ``bool[n]`` scratch array, all False on
    entry and on exit.
    """
    for i in range(nodes.shape[0]):
        mark[nodes[i]] = True
    delta = 0.0
    for i in range(nodes.shape[0]):
        v = nodes[i]
        dv = assign[v]
        for j in range(succ_ptr[v], succ_ptr[v + 1]):
            y = succ_idx[j]
            if mark[y]:
                continue
            eb = edge_bytes[succ_edge[j]]
            delta += edge_cost(target, assign[y], eb, lat, inv_bw) - edge_cost(
                dv, assign[y], eb, lat, inv_bw)
        for j in range(pred_ptr[v], pred_ptr[v + 1]):
            y = pred_idx[j]
            if mark[y]:
                continue
            eb = edge_bytes[pred_edge[j]]
            delta += edge_cost(assign[y], target, eb, lat, inv_bw) - edge_cost(
                assign[y], dv, eb, lat, inv_bw)
    for i in range(nodes.shape[0]):
        mark[nodes[i]] = False
    return delta


@njit
def cluster_moves(ptr, nodes, assign, num_dev, succ_ptr, succ_idx, succ_edge, pred_ptr,
                  pred_idx, pred_edge, edge_bytes, lat, inv_bw):
    """For each cluster on one device, the device it saves most communication on.

    Returns ``(target, gain_s)`` per cluster; ``target = -1`` when no move saves time or the
    cluster is split over devices.
    """
    nc = ptr.shape[0] - 1
    n = assign.shape[0]
    target = np.full(nc, -1, np.int64)
    gain = np.zeros(nc)
    mark = np.zeros(n, np.bool_)
    delta = np.zeros(num_dev)
    for c in range(nc):
        d0 = assign[nodes[ptr[c]]]
        uniform = True
        for i in range(ptr[c], ptr[c + 1]):
            if assign[nodes[i]] != d0:
                uniform = False
                break
        if not uniform:
            continue
        for i in range(ptr[c], ptr[c + 1]):
            mark[nodes[i]] = True
        for x in range(num_dev):
            delta[x] = 0.0
        for i in range(ptr[c], ptr[c + 1]):
            v = nodes[i]
            for side in range(2):
                a0 = succ_ptr[v] if side == 0 else pred_ptr[v]
                a1 = succ_ptr[v + 1] if side == 0 else pred_ptr[v + 1]
                for j in range(a0, a1):
                    y = succ_idx[j] if side == 0 else pred_idx[j]
                    if mark[y]:
                        continue
                    eb = edge_bytes[succ_edge[j]] if side == 0 else edge_bytes[pred_edge[j]]
                    if eb <= 0:
                        continue
                    dy = assign[y]
                    now = edge_cost(d0, dy, eb, lat, inv_bw)
                    for x in range(num_dev):
                        delta[x] += edge_cost(x, dy, eb, lat, inv_bw) - now
        for i in range(ptr[c], ptr[c + 1]):
            mark[nodes[i]] = False
        best = -1
        bestd = 0.0
        for x in range(num_dev):
            if x != d0 and delta[x] < bestd:
                bestd = delta[x]
                best = x
        target[c] = best
        gain[c] = -bestd
    return target, gain


@njit_borrowing
def _gap_start(ready, dur, ptr, starts, ends, x, max_scan):
    """Earliest start >= ready of an idle gap of length ``dur`` on device ``x`` (inf: none).

    ``starts``/``ends`` of device ``x``'s tasks are ``[ptr[x], ptr[x+1])``, sorted by time.
    """
    lo = ptr[x]
    hi = ptr[x + 1]
    a, b = lo, hi
    while a < b:  # first task ending after ready
        m = (a + b) >> 1
        if ends[m] <= ready:
            a = m + 1
        else:
            b = m
    s = ready
    i = a
    steps = 0
    while i < hi:
        if starts[i] >= s + dur:
            return s
        if ends[i] > s:
            s = ends[i]
        i += 1
        steps += 1
        if steps > max_scan:
            return np.inf
    return s


@njit
def cp_switch_gains(cp_phase, cp_node, assign, num_dev, release, fstart, fend, bstart, bend,
                    fdur, bdur,
                    fptr, fstarts, fends, bptr, bstarts, bends, succ_ptr, succ_idx, succ_edge,
                    pred_ptr, pred_idx, pred_edge, edge_bytes, lat, inv_bw):
    """Node switching on the critical path: for each critical node, the device where its
    forward and backward would end earliest (given every other task fixed, using idle gaps),
    and the estimated gain in seconds (minus delays caused to its consumers). Times are those of
    one micro-batch; ``release`` is the end of the forward. Returns ``(node, target, gain)``
    arrays over the critical rows (target -1: no gain)."""
    m = cp_node.shape[0]
    node = np.empty(m, np.int64)
    target = np.full(m, -1, np.int64)
    gain = np.zeros(m)
    for r in range(m):
        v = cp_node[r]
        node[r] = v
        d = assign[v]
        fwd = cp_phase[r] == 0
        best = 0.0
        for x in range(num_dev):
            if x == d:
                continue
            if fwd:
                ready = 0.0
                for j in range(pred_ptr[v], pred_ptr[v + 1]):
                    u = pred_idx[j]
                    t = fend[u]
                    eb = edge_bytes[pred_edge[j]]
                    if assign[u] != x and eb > 0:
                        t += lat[assign[u], x] + eb * inv_bw[assign[u], x]
                    if t > ready:
                        ready = t
                s = _gap_start(ready, fdur[v], fptr, fstarts, fends, x, 64)
                new_end = s + fdur[v]
                g = fend[v] - new_end
                worst = 0.0
                for j in range(succ_ptr[v], succ_ptr[v + 1]):
                    y = succ_idx[j]
                    eb = edge_bytes[succ_edge[j]]
                    t = new_end
                    if assign[y] != x and eb > 0:
                        t += lat[x, assign[y]] + eb * inv_bw[x, assign[y]]
                    late = t - fstart[y]
                    if late > worst:
                        worst = late
            else:
                ready = 0.0
                for j in range(succ_ptr[v], succ_ptr[v + 1]):
                    y = succ_idx[j]
                    t = bend[y]
                    eb = edge_bytes[succ_edge[j]]
                    if assign[y] != x and eb > 0:
                        t += lat[assign[y], x] + eb * inv_bw[assign[y], x]
                    if t > ready:
                        ready = t
                if ready < release:
                    ready = release
                s = _gap_start(ready, bdur[v], bptr, bstarts, bends, x, 64)
                new_end = s + bdur[v]
                g = bend[v] - new_end
                worst = 0.0
                for j in range(pred_ptr[v], pred_ptr[v + 1]):
                    u = pred_idx[j]
                    eb = edge_bytes[pred_edge[j]]
                    t = new_end
                    if assign[u] != x and eb > 0:
                        t += lat[x, assign[u]] + eb * inv_bw[x, assign[u]]
                    late = t - bstart[u]
                    if late > worst:
                        worst = late
            g -= worst
            if g > best:
                best = g
                target[r] = x
        gain[r] = best
    return node, target, gain


@njit_borrowing
def row_marked(ptr, idx, row, mark):
    """Whether any entry of CSR row ``row`` (``idx[ptr[row]:ptr[row + 1]]``) is marked."""
    for j in range(ptr[row], ptr[row + 1]):
        if mark[idx[j]]:
            return True
    return False
