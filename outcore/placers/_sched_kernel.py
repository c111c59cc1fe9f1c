"""Compiled inner loop of the emulator: list scheduling of one phase (forward or backward).

A *task* is one node for one micro-batch: ``task = mb * n + v``. A phase is a DAG of tasks given
by two CSR views of the graph: ``dep`` (what a task waits for: predecessors in the forward,
successors in the backward) and ``ntf`` (whom a finished task notifies, with the edge numbers).
Each device runs one task at a time; whenever a device is idle it starts, among the tasks whose
inputs have all arrived, the one of the earliest micro-batch, and among those the one its node's
priority puts first (``prio``: the emulator passes the order in which the schedule builder runs
pieces, fewest device boundaries upstream first; see :mod:`outcore.placers.emulate`).
Preferring earlier micro-batches lets a device hand micro-batch 0 to the next one as soon as it
can, so contiguous stages pipeline as GPipe does, instead of running every micro-batch of one
node before the next node. Transfers between devices take ``latency + bytes / bandwidth`` and do
not contend (one independent link per transfer).

With ``contend``, transfers queue for each device's one outgoing and one incoming port, and a
tensor crosses to a device once (what the schedule simulator's pieces do): a finished task's
output is sent once per device that consumes it; in the backward, the gradients of one tensor
from its consumers on one device are summed there and sent once, when the last of them ends
(``grp``: that tensor-and-device group of each notification, -1 for none).

Events at equal times are processed together before any device picks its next task, so a device
that frees up at ``t`` sees every task arriving at ``t``. The result is a pure function of the
inputs.
"""

from __future__ import annotations

import numpy as np

from outcore.graph.heap import heap_pop as _fheap_pop, heap_push as _fheap_push
from outcore.placers._jit import njit, njit_borrowing

__all__ = ["_fheap_pop", "_fheap_push", "schedule_phase"]


@njit
def _delays(n, ntf_ptr, ntf_idx, ntf_edge, dev, lat, inv_bw, edge_bytes):
    """Transfer time of each notification (by CSR entry) that crosses devices with bytes,
    without contention: ``latency + bytes / bandwidth``; 0 for the rest."""
    delay = np.zeros(ntf_idx.shape[0], np.float64)
    for v in range(n):
        dv = dev[v]
        for k in range(ntf_ptr[v], ntf_ptr[v + 1]):
            dw = dev[ntf_idx[k]]
            eb = edge_bytes[ntf_edge[k]]
            if dw != dv and eb > 0:
                delay[k] = lat[dv, dw] + eb * inv_bw[dv, dw]
    return delay


@njit_borrowing
def _sent(d, dw, nbytes, now, port_out, port_in, lat, inv_bw):
    """A message of ``nbytes`` from device ``d`` to ``dw`` ready at ``now``: it waits for
    ``d``'s outgoing and ``dw``'s incoming port, holds both for ``bytes / bandwidth``; returns
    its arrival (plus the latency)."""
    busy_s = nbytes * inv_bw[d, dw]
    go = max(now, port_out[d], port_in[dw])
    port_out[d] = go + busy_s
    port_in[dw] = go + busy_s
    return go + busy_s + lat[d, dw]


@njit
def schedule_phase(n, mbs, dep_ptr, ntf_ptr, ntf_idx, ntf_edge, dur, dev, release,
                   lat, inv_bw, edge_bytes, num_dev, start, end, cause, contend,
                   grp, grp_count, grp_bytes, prio):
    """List-schedule ``n * mbs`` tasks; fill ``start``, ``end`` (seconds) and ``cause``.

    Args:
        n, mbs: nodes and micro-batches; task ``t`` is node ``t % n`` of micro-batch ``t // n``.
        dep_ptr: CSR row pointers of what each node waits for (only the counts are used).
        ntf_ptr, ntf_idx, ntf_edge: CSR of whom each node notifies, with edge numbers.
        dur: ``float64[n]`` task duration, seconds. dev: ``int64[n]`` device of each node.
        release: time before which no task starts (the end of the previous phase).
        lat, inv_bw: ``float64[D, D]`` link latency (s) and seconds per byte between devices.
        edge_bytes: ``int64[m]`` bytes per edge (0 bytes = free control dependency).
        num_dev: number of devices D.
        contend: transfers queue for the devices' ports (see module docstring).
        grp, grp_count, grp_bytes: with ``contend``, ``int64[nnz]`` the gradient group of each
            notification (-1: none), ``int64[G]`` notifications per group, ``int64[G]`` bytes
            each group sends once (see module docstring); empty: no groups.
        prio: ``int64[n]``, a permutation: among ready tasks of one micro-batch, a device
            starts the one whose node has the lowest ``prio``.
        start, end: ``float64[n * mbs]`` outputs. cause: ``int32[n * mbs]`` output: the task
            whose completion let this one start (a data predecessor, or the previous task on the
            device when the device was the bottleneck); -1 when it started at ``release``.
    """
    total = n * mbs
    node_at = np.empty(n, np.int64)  # the node of each priority
    for v in range(n):
        node_at[prio[v]] = v
    delay = _delays(n, ntf_ptr, ntf_idx, ntf_edge, dev, lat, inv_bw, edge_bytes)
    remaining = np.empty(total, np.int32)
    ready_at = np.zeros(total, np.float64)
    data_cause = np.full(total, -1, np.int32)
    base = np.zeros(num_dev + 1, np.int64)
    for v in range(n):
        base[dev[v] + 1] += mbs
    for d in range(num_dev):
        base[d + 1] += base[d]
    # one heap region per device (from base[d] on), ordered by (micro-batch, priority)
    hkeys = np.empty(total, np.float64)
    hitems = np.empty(total, np.int64)
    hsize = np.zeros(num_dev, np.int64)
    busy = np.zeros(num_dev, np.bool_)
    last = np.full(num_dev, -1, np.int64)
    ev_key = np.empty(total + 1, np.float64)
    ev_item = np.empty(total + 1, np.int64)
    nev = 0
    for mb in range(mbs):
        for v in range(n):
            t = mb * n + v
            remaining[t] = dep_ptr[v + 1] - dep_ptr[v]
            if remaining[t] == 0:
                ready_at[t] = release
                d = dev[v]
                hsize[d] = _fheap_push(hkeys, hitems, hsize[d], float(mb), prio[v], base[d])
    grouped = contend and grp.shape[0] > 0
    ngrp = grp_count.shape[0] if grouped else 0
    left = np.empty(ngrp * mbs, np.int64)
    for i in range(ngrp * mbs):
        left[i] = grp_count[i % ngrp]
    port_out = np.full(num_dev, release, np.float64)
    port_in = np.full(num_dev, release, np.float64)
    sent = np.full(num_dev, -1.0, np.float64)  # arrival of this task's output per device
    now = release
    while True:
        for d in range(num_dev):  # idle devices start their best ready task
            if busy[d] or hsize[d] == 0:
                continue
            b0 = base[d]
            v = node_at[hitems[b0]]
            t = int(hkeys[b0]) * n + v
            hsize[d] = _fheap_pop(hkeys, hitems, hsize[d], b0)
            start[t] = now
            end[t] = now + dur[v]
            if data_cause[t] >= 0 and ready_at[t] == now:
                cause[t] = data_cause[t]
            elif last[d] >= 0 and now > ready_at[t]:
                cause[t] = last[d]
            else:
                cause[t] = data_cause[t]
            busy[d] = True
            nev = _fheap_push(ev_key, ev_item, nev, end[t], 2 * t)
        if nev == 0:
            break
        now = ev_key[0]
        while nev > 0 and ev_key[0] == now:
            item = ev_item[0]
            nev = _fheap_pop(ev_key, ev_item, nev)
            t = item >> 1
            mb = t // n  # the one division per event (a task's successors share its mb)
            mb0 = mb * n
            v = t - mb0
            d = dev[v]
            if item & 1:  # arrival: every input is on the device
                hsize[d] = _fheap_push(hkeys, hitems, hsize[d], float(mb), prio[v], base[d])
                continue
            busy[d] = False  # finish
            last[d] = t
            if contend:
                sent[:] = -1.0
            for k in range(ntf_ptr[v], ntf_ptr[v + 1]):
                tw = mb0 + ntf_idx[k]
                arrive = now + delay[k]
                if grouped and grp[k] >= 0:  # a gradient summed here, sent by the last
                    gi = mb * ngrp + grp[k]
                    left[gi] -= 1
                    arrive = now
                    if left[gi] == 0:
                        arrive = _sent(d, dev[ntf_idx[k]], grp_bytes[grp[k]], now, port_out,
                                       port_in, lat, inv_bw)
                elif contend and delay[k] > 0.0:
                    dw = dev[ntf_idx[k]]
                    if sent[dw] < 0.0:
                        sent[dw] = _sent(d, dw, edge_bytes[ntf_edge[k]], now, port_out,
                                         port_in, lat, inv_bw)
                    arrive = sent[dw]
                if data_cause[tw] < 0 or arrive > ready_at[tw]:
                    ready_at[tw] = arrive
                    data_cause[tw] = t
                remaining[tw] -= 1
                if remaining[tw] == 0:
                    if ready_at[tw] < release:
                        ready_at[tw] = release
                    if ready_at[tw] == now:  # arrived already: queue it without an event
                        dq = dev[ntf_idx[k]]
                        hsize[dq] = _fheap_push(hkeys, hitems, hsize[dq], float(mb),
                                                prio[ntf_idx[k]], base[dq])
                    else:
                        nev = _fheap_push(ev_key, ev_item, nev, ready_at[tw], 2 * tw + 1)
    return 0
