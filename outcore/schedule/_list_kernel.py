"""Compiled list scheduler of the schedule builder (:mod:`outcore.schedule.build`).

The same rule as :class:`outcore.schedule.build._ListState`, on arrays: a task ``(op, piece,
mb)`` is ready once its inputs have arrived; each rank runs one task at a time; the task that
can start earliest runs next (ties: the lowest rank), and a rank chooses among its ready tasks
by priority. A task's priority is one integer, ``key = (c * M + mb) * P + x``, where ``c`` is 0
for the op that may always run (1F1B's backwards, GPipe's forwards) and 1 for the gated one,
and ``x`` is the piece (forwards: lower first) or ``P - 1 -`` the piece (backwards: higher
first): the order of the builder's priority tuples. Each rank's pool is three heaps in slices
of shared arrays: pending tasks by (ready time, key), and ready tasks of each class by key.
The builder uses it when numba is installed; its plain-Python twin stays the reference (tests
compare the two).
"""

from __future__ import annotations

import numpy as np

from outcore.graph.heap import heap_pop, heap_push
from outcore.graph.jit import njit, njit_borrowing

__all__ = ["list_schedule", "sink_hops"]


@njit_borrowing
def _runnable(key, gpipe, r, M, P, f_left, inflight, limits, f_started):
    """Whether rank ``r`` may run the task of priority ``key`` now (the gate of
    ``_ListState._gate``; tasks of class 0 always may)."""
    if key // (M * P) == 0:
        return True
    if gpipe:
        return f_left[r] == 0
    m = (key // P) % M
    return inflight[r] < limits[r] or f_started[r * M + m]


@njit_borrowing
def _first(keys, items, size, only_gated, gpipe, r, M, P, f_left, inflight, limits,
           f_started, skip_k, skip_i):
    """Pop the first runnable entry of a heap in heap order, leaving the others; return
    ``(item or -1, new size)``. ``only_gated``: a heap of gated tasks (every entry is
    checked); else class-0 entries are runnable too."""
    found = -1
    nskip = 0
    while size > 0:
        k = keys[0]
        it = items[0]
        size = heap_pop(keys, items, size)
        if _runnable(it, gpipe, r, M, P, f_left, inflight, limits, f_started) and \
                (not only_gated or it // (M * P) == 1):
            found = it
            break
        skip_k[nskip] = k
        skip_i[nskip] = it
        nskip += 1
    for j in range(nskip):
        size = heap_push(keys, items, size, skip_k[j], skip_i[j])
    return found, size


@njit
def list_schedule(P, M, R, gpipe, dev, in_ptr, in_tr, out_ptr, out_tr, tr_src, tr_dst,
                  delay_f, delay_b, fwd, bwd, limits):
    """Run every task once; return ``(rank, op, piece, mb)`` arrays in the order they ran (op 0:
    forward, 1: backward), or empty arrays when no rank can run (an inconsistent piece graph).
    ``in_ptr``/``in_tr`` and ``out_ptr``/``out_tr``: each piece's input and output transfers
    (CSR); ``delay_f``/``delay_b``: what each transfer adds forward and backward (0 local)."""
    off, offh, pend_k, pend_i, r0_k, r0_i, r1_k, r1_i, skip_k, skip_i = _pools(P, M, R, dev)
    n_pend = np.zeros(R, np.int64)
    n_r0 = np.zeros(R, np.int64)
    n_r1 = np.zeros(R, np.int64)
    held = np.full(R, -1, np.int64)
    dirty = np.ones(R, np.bool_)
    free_at = np.zeros(R)
    f_left, b_left, deps = _counts(P, M, R, dev, in_ptr, out_ptr)
    f_started = np.zeros(R * M, np.bool_)
    inflight = np.zeros(R, np.int64)
    ready = np.zeros(2 * P * M)  # task (op, p, m) at (op * P + p) * M + m
    total = 2 * P * M
    out = np.empty((total, 4), np.int64)  # rank, op, piece, mb of each task run
    for p in range(P):  # the forwards of pieces without inputs are ready at 0
        if in_ptr[p + 1] == in_ptr[p]:
            for m in range(M):
                deps[p * M + m] = 1
                _release(0, p, m, 0.0, gpipe, M, P, dev, deps, ready, pend_k, pend_i, n_pend,
                         off, dirty)
    for step in range(total):
        best_r = -1
        best_s = 0.0
        for r in range(R):
            if dirty[r]:
                _pick(r, gpipe, M, P, free_at[r], pend_k[off[r]:off[r + 1]],
                      pend_i[off[r]:off[r + 1]], r0_k[offh[r]:offh[r + 1]],
                      r0_i[offh[r]:offh[r + 1]], r1_k[offh[r]:offh[r + 1]],
                      r1_i[offh[r]:offh[r + 1]], n_pend, n_r0, n_r1, held, ready, f_left,
                      inflight, limits, f_started, skip_k, skip_i)
                dirty[r] = False
            if held[r] >= 0:
                start = max(free_at[r], ready[_task(held[r], gpipe, M, P)])
                if best_r < 0 or start < best_s:
                    best_r = r
                    best_s = start
        if best_r < 0:
            return out[:0, 0], out[:0, 1], out[:0, 2], out[:0, 3]
        r = best_r
        key = held[r]
        held[r] = -1
        dirty[r] = True
        i = _task(key, gpipe, M, P)
        op, p, m = i // (P * M), (i // M) % P, i % M  # op 0: forward
        end = best_s + (fwd[p] if op == 0 else bwd[p])
        free_at[r] = end
        out[step, 0], out[step, 1], out[step, 2], out[step, 3] = r, op, p, m
        if op == 0:
            f_left[r] -= 1
            if not f_started[r * M + m]:
                f_started[r * M + m] = True
                inflight[r] += 1
            for j in range(out_ptr[p], out_ptr[p + 1]):
                t = out_tr[j]
                _release(0, tr_dst[t], m, end + delay_f[t], gpipe, M, P, dev, deps, ready,
                         pend_k, pend_i, n_pend, off, dirty)
            _release(1, p, m, end, gpipe, M, P, dev, deps, ready, pend_k, pend_i, n_pend, off,
                     dirty)
        else:
            b_left[r * M + m] -= 1
            if b_left[r * M + m] == 0:
                inflight[r] -= 1
            for j in range(in_ptr[p], in_ptr[p + 1]):
                t = in_tr[j]
                _release(1, tr_src[t], m, end + delay_b[t], gpipe, M, P, dev, deps, ready,
                         pend_k, pend_i, n_pend, off, dirty)
    return out[:, 0], out[:, 1], out[:, 2], out[:, 3]


@njit
def _pools(P, M, R, dev):
    """Each rank's three heaps as slices of shared arrays: ``off`` bounds its pending heap
    (2 M x its pieces), ``offh`` each of its ready heaps (M x its pieces); and the scratch
    ``_first`` puts skipped entries in."""
    count = np.zeros(R, np.int64)
    for p in range(P):
        count[dev[p]] += 1
    off = np.zeros(R + 1, np.int64)  # pending heap of rank r: 2 * M * its pieces
    offh = np.zeros(R + 1, np.int64)  # each ready heap: M * its pieces
    for r in range(R):
        off[r + 1] = off[r] + 2 * M * count[r]
        offh[r + 1] = offh[r] + M * count[r]
    big = 1
    for r in range(R):
        big = max(big, 2 * M * count[r])
    pend_k = np.zeros(max(off[R], 1))
    pend_i = np.zeros(max(off[R], 1), np.int64)
    r0_k = np.zeros(max(offh[R], 1))
    r0_i = np.zeros(max(offh[R], 1), np.int64)
    r1_k = np.zeros(max(offh[R], 1))
    r1_i = np.zeros(max(offh[R], 1), np.int64)
    skip_k = np.zeros(big)
    skip_i = np.zeros(big, np.int64)
    return off, offh, pend_k, pend_i, r0_k, r0_i, r1_k, r1_i, skip_k, skip_i


@njit
def _counts(P, M, R, dev, in_ptr, out_ptr):
    """Per rank the forwards left and per rank and micro-batch the backwards left; per task the
    dependencies still unmet (a forward: its inputs; a backward: its outputs' and its own
    forward)."""
    f_left = np.zeros(R, np.int64)
    b_left = np.zeros(R * M, np.int64)
    deps = np.zeros(2 * P * M, np.int64)  # task (op, p, m) at (op * P + p) * M + m
    for p in range(P):
        f_left[dev[p]] += M
        for m in range(M):
            b_left[dev[p] * M + m] += 1
            deps[p * M + m] = in_ptr[p + 1] - in_ptr[p]
            deps[(P + p) * M + m] = out_ptr[p + 1] - out_ptr[p] + 1
    return f_left, b_left, deps


@njit_borrowing
def _key(op, p, m, gpipe, M, P):
    """The priority of task (op, p, m) (module docstring)."""
    c = op if gpipe else 1 - op
    return (c * M + m) * P + (p if op == 0 else P - 1 - p)


@njit_borrowing
def _task(key, gpipe, M, P):
    """The index ``(op * P + p) * M + m`` of the task of priority ``key``."""
    c = key // (M * P)
    m = (key // P) % M
    x = key % P
    op = c if gpipe else 1 - c
    p = x if op == 0 else P - 1 - x
    return (op * P + p) * M + m


@njit_borrowing
def _release(op, q, m, at, gpipe, M, P, dev, deps, ready, pend_k, pend_i, n_pend, off, dirty):
    """One dependency of task (op, q, m) is met at ``at``; queued on its rank once all are."""
    i = (op * P + q) * M + m
    if at > ready[i]:
        ready[i] = at
    deps[i] -= 1
    if deps[i] == 0:
        r = dev[q]
        n_pend[r] = heap_push(pend_k[off[r]:off[r + 1]], pend_i[off[r]:off[r + 1]], n_pend[r],
                              ready[i], _key(op, q, m, gpipe, M, P))
        dirty[r] = True


@njit_borrowing
def _pick(r, gpipe, M, P, free, pk, pi, k0, i0, k1, i1, n_pend, n_r0, n_r1, held, ready,
          f_left, inflight, limits, f_started, skip_k, skip_i):
    """Hold the task rank ``r`` runs next (``_Pool.pick``): the best-priority runnable task
    ready by ``free``, else the runnable task ready first (-1: none)."""
    if held[r] >= 0:  # picked before the pool or the rank changed: pick again
        n_pend[r] = heap_push(pk, pi, n_pend[r], ready[_task(held[r], gpipe, M, P)], held[r])
        held[r] = -1
    while n_pend[r] > 0 and pk[0] <= free:
        key = pi[0]
        n_pend[r] = heap_pop(pk, pi, n_pend[r])
        if key // (M * P) == 0:
            n_r0[r] = heap_push(k0, i0, n_r0[r], 0.0, key)
        else:
            n_r1[r] = heap_push(k1, i1, n_r1[r], 0.0, key)
    if n_r0[r] > 0:
        held[r] = i0[0]
        n_r0[r] = heap_pop(k0, i0, n_r0[r])
        return
    found, size = _first(k1, i1, n_r1[r], True, gpipe, r, M, P, f_left, inflight, limits,
                         f_started, skip_k, skip_i)
    n_r1[r] = size
    if found < 0:  # nothing ready yet: the runnable task ready first
        found, size = _first(pk, pi, n_pend[r], False, gpipe, r, M, P, f_left, inflight,
                             limits, f_started, skip_k, skip_i)
        n_pend[r] = size
    held[r] = found


@njit
def sink_hops(out_ptr, out_tr, tr_dst, tr_local, dev, R):
    """Per rank, 1 + the most device hops from any of its pieces to a sink piece (the 1F1B
    in-flight bound, :func:`outcore.schedule.build.inflight_limits`): one pass over the pieces
    in reverse id order (transfers go to higher ids)."""
    P = dev.shape[0]
    after = np.zeros(P, np.int64)
    for p in range(P - 1, -1, -1):
        best = 0
        for j in range(out_ptr[p], out_ptr[p + 1]):
            t = out_tr[j]
            best = max(best, after[tr_dst[t]] + (0 if tr_local[t] else 1))
        after[p] = best
    limit = np.ones(R, np.int64)
    for p in range(P):
        limit[dev[p]] = max(limit[dev[p]], after[p] + 1)
    return limit
