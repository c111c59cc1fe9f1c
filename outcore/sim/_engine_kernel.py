"""Compiled event loop of the simulator (:mod:`outcore.sim.engine`), on arrays.

The same rules as :class:`outcore.sim.engine._Engine`, step for step and in the same order (the
event queue breaks ties on the order of its pushes, memory changes and events are recorded in
the order the reference records them), so the timelines agree exactly; the reference stays
in plain Python and the tests compare the two. :mod:`outcore.sim.compiled` packs a schedule
into these arrays and reads the result back.

The kernel allocates nothing and is compiled without numba's reference counting
(:func:`~outcore.graph.jit.njit_borrowing`). State lives in a few arrays: ``rf`` (floats per
rank, rows ``R_*``), ``ri`` (integers per rank, rows ``I_*``), ``cnt`` (counters, ``C_*``), and
one array per keyed table of the reference (message arrivals and waiters by ``(transfer,
direction, micro-batch)``, held bytes by ``(transfer, micro-batch)`` and ``(piece,
micro-batch)``, gradients held summed by ``(piece, micro-batch)``, all-reduce arrivals by
bucket).
"""

from __future__ import annotations

import numpy as np

from outcore.graph.heap import heap_pop, heap_push
from outcore.graph.jit import njit_borrowing as njit
from outcore.schedule.ir import OP_INDEX

__all__ = ["run_events", "EVENT_KINDS"]

# event kinds, as the codes the kernel writes (5: a data-parallel all-reduce, labelled DP<piece>)
EVENT_KINDS = ("F", "B", "send", "recv", "allreduce", "allreduce", "optim")
# action ops as the schedule's columns number them
OP_F, OP_B, OP_SF, OP_SB, OP_RF, OP_RB, OP_AR, OP_OPT = (
    OP_INDEX[op] for op in ("F", "B", "SF", "SB", "RF", "RB", "AR", "OPT"))
K_F, K_B, K_SEND, K_RECV, K_AR, K_DP, K_OPT = range(7)

# rows of the per-rank float state (R_ARHELD: no longer used; the rows keep their numbers)
R_FINISH, R_WARM, R_GRADS, R_SENT, R_DPFREE, R_ARFREE, R_ARHELD, R_BLOCKED, R_JSTART, \
    R_JREM, R_SYNCAT = range(11)
# rows of the per-rank integer state
I_PC, I_LEFT, I_ACTIVE, I_JACT, I_JVER, I_WAITB, I_WAITORD, I_SYNCORD, I_ORDER = range(9)
# counters: events, memory changes, pushes, heap size, running shared computes, waiters,
# ranks at the step's synchronisation
C_EV, C_MEM, C_SEQ, C_HEAP, C_ACTIVE, C_WAITS, C_SYNC = range(7)


@njit
def _mem(M, cnt, r, t, delta):
    """Record a memory change (none when ``delta`` is zero, as the reference's ``add_mem``)."""
    if delta != 0.0:
        i = cnt[C_MEM]
        M[0][i] = r
        M[1][i] = t
        M[2][i] = delta
        cnt[C_MEM] = i + 1


@njit
def _event(E, cnt, r, kind, act, start, end, mb, piece, nbytes, peer):
    i = cnt[C_EV]
    E[0][i] = r
    E[1][i] = kind
    E[2][i] = act
    E[3][i] = start
    E[4][i] = end
    E[5][i] = mb
    E[6][i] = piece
    E[7][i] = nbytes
    E[8][i] = peer
    cnt[C_EV] = i + 1


@njit
def _push(Q, cnt, t, r, version):
    """The reference's ``heapq.heappush(queue, (t, seq, r, version))``."""
    seq = cnt[C_SEQ]
    cnt[C_SEQ] = seq + 1
    Q[2][seq] = r
    Q[3][seq] = version
    cnt[C_HEAP] = heap_push(Q[0], Q[1], cnt[C_HEAP], t, seq)


@njit
def _cold(D, rf, r, t, dur):
    """Re-warming a core after a wait (``_Engine.cold``); ``D[5:8]``: cold seconds, fraction,
    idle threshold."""
    if D[5] <= 0 or t - rf[R_WARM, r] <= D[7]:
        return 0.0
    return min(D[6] * dur, D[5])


@njit
def _rate(cores, n):
    return min(1.0, cores / n) if n else 1.0


@njit
def _advance(rf, ri, cnt, G, cores, t):
    rate = _rate(cores, cnt[C_ACTIVE])
    dt = t - G[0]
    for j in range(cnt[C_ACTIVE]):
        r = ri[I_ORDER, j]
        rf[R_JREM, r] = max(rf[R_JREM, r] - dt * rate, 0.0)
    G[0] = t


@njit
def _reschedule(rf, ri, cnt, Q, cores, t):
    rate = _rate(cores, cnt[C_ACTIVE])
    for j in range(cnt[C_ACTIVE]):
        r = ri[I_ORDER, j]
        ri[I_JVER, r] += 1
        _push(Q, cnt, t + rf[R_JREM, r] / rate, r, ri[I_JVER, r])


@njit
def _drop_active(ri, cnt, r):
    """Remove ``r`` from the running computes, keeping the others' order."""
    n = cnt[C_ACTIVE]
    k = 0
    for j in range(n):
        if ri[I_ORDER, j] != r:
            ri[I_ORDER, k] = ri[I_ORDER, j]
            k += 1
    cnt[C_ACTIVE] = k
    ri[I_ACTIVE, r] = 0


@njit
def _dp_allreduce(P, D, rf, cnt, E, r, piece, t, b_start):
    """``_Engine.dp_allreduce``: ``piece`` -1 for the rank's fused all-reduce."""
    ph, rph, dp_port, port_of, bucket_total = P[9], P[10], P[11], P[12], P[13]
    if piece < 0:
        share, intra, inter, after, node = rph[0, r], rph[1, r], rph[2, r], rph[3, r], rph[4, r]
    else:
        share, intra, inter, after, node = P[8][piece], ph[0, piece], ph[1, piece], \
            ph[2, piece], ph[3, piece]
    bucket = D[9]
    ready = t
    if 0 < bucket < share:  # the first bucket is ready part-way through the backward
        ready = t - (1 - bucket / share) * (t - b_start)
    start = max(ready, rf[R_DPFREE, r], rf[R_ARFREE, r])
    end = start + intra
    if node > 0:  # all-reduces through one network port take turns on it
        port = port_of[r]
        end = max(end, dp_port[port])
        dp_port[port] = end + inter
    end += inter + after
    if 0 < bucket < share:  # the last bucket leaves after the backward
        end = max(end, t + bucket_total[r])
    rf[R_DPFREE, r] = end
    rf[R_ARFREE, r] = end
    if end > start:
        _event(E, cnt, r, K_DP, -1, start, end, -1, piece, share, -1)


@njit
def _finish_compute(A, P, D, rf, ri, cnt, E, M, H, k, t, end):
    """A forward or backward (action ``k`` of rank ``A[6][k]``) that ran from ``t`` to
    ``end`` (``_Engine._finish_compute``)."""
    op, mb, p, r = A[1][k], A[2][k], A[3][k], A[6][k]
    work_f, work_b, saved, in_grad, grads, last_b = P[2], P[3], P[4], P[5], P[6], P[7]
    held_p, made = H[2], H[3]
    nmb = A[7]
    rf[R_WARM, r] = end
    _event(E, cnt, r, op, k, t, end, mb, p, 0.0, -1)
    work = work_f[p] if op == OP_F else work_b[p]
    if op == OP_B and not made[p]:  # the step's first: the .grad tensors made so far
        work += P[18][p]
    _mem(M, cnt, r, t, work)
    _mem(M, cnt, r, end, -work)
    if op == OP_F:  # what it saves, and its outputs waiting for later pieces
        _mem(M, cnt, r, end, saved[p] + P[19][p])
        return end
    h = held_p[p * nmb + mb]
    held_p[p * nmb + mb] = 0.0
    _mem(M, cnt, r, end, in_grad[p] - saved[p] - h)
    local_ptr, local_src, local_bytes, cap, grad_held = P[14], P[15], P[16], P[17], H[8]
    grad_held[p * nmb + mb] = 0.0
    handed = 0.0
    for j in range(local_ptr[p], local_ptr[p + 1]):  # handed to a piece of this rank, summed
        key = local_src[j] * nmb + mb  # into one gradient per tensor
        add = min(local_bytes[j], cap[local_src[j]] - grad_held[key])
        if add > 0:
            grad_held[key] += add
            held_p[key] += add
            handed += add
    if handed:
        _mem(M, cnt, r, end, handed)
    if not made[p]:  # its parameters' .grad, until the step
        made[p] = True
        _mem(M, cnt, r, end, grads[p])
        rf[R_GRADS, r] += grads[p]
    if D[8] > 1 and last_b[p] == mb:
        ri[I_LEFT, r] -= 1
        if D[10] == 0:
            _dp_allreduce(P, D, rf, cnt, E, r, p, end, t)
        elif ri[I_LEFT, r] == 0:
            _dp_allreduce(P, D, rf, cnt, E, r, -1, end, end)
    return end


@njit
def _send(A, T, cnt, E, M, H, Q, rf, k, t):
    """``_Engine.send`` of action ``k`` at ``t`` (after the send call's host time)."""
    op, mb, tr, r = A[1][k], A[2][k], A[4][k], A[6][k]
    nmb = A[7]
    tbytes, src_dev, dst_dev = T[0], T[1], T[2]
    d = 0 if r == src_dev[tr] else 1
    dst = dst_dev[tr] if d == 0 else src_dev[tr]
    nbytes = tbytes[tr]
    po, pi, lat, bw, copy = T[4][d, tr], T[5][d, tr], T[6][d, tr], T[7][d, tr], T[8][d, tr]
    port_out, port_in = H[4], H[5]
    start = max(t, port_out[po], port_in[pi])
    busy = nbytes / bw
    port_out[po] = start + busy
    port_in[pi] = start + busy
    arrive = start + lat + busy
    if op == OP_SB:  # the activations received for these gradients go
        h = H[1][tr * nmb + mb]
        H[1][tr * nmb + mb] = 0.0
        _mem(M, cnt, r, t, -h)
        if copy:  # the gradients too: copied out in the send call
            _mem(M, cnt, r, t, -nbytes)
        else:  # kept until the end-of-step flush
            rf[R_SENT, r] += nbytes
    _event(E, cnt, r, K_SEND, k, start, arrive, mb, -1, nbytes, dst)
    key = (tr * 2 + (0 if op == OP_SF else 1)) * nmb + mb
    H[0][key] = arrive
    H[6][key] = 1
    waiter = H[7][key]
    if waiter >= 0:
        H[7][key] = -1
        _push(Q, cnt, arrive, waiter, -1)


@njit
def _receive(A, P, T, D, cnt, E, M, H, rf, reached, k, t):
    """A receive (``_Engine._execute_other``): the rank's next free time, or -1 blocked."""
    op, mb, tr, r = A[1][k], A[2][k], A[4][k], A[6][k]
    nmb = A[7]
    key = (tr * 2 + (0 if op == OP_RF else 1)) * nmb + mb
    if not H[6][key]:
        H[7][key] = r
        if np.isnan(rf[R_BLOCKED, r]):
            rf[R_BLOCKED, r] = t
        return -1.0
    arrive = H[0][key]
    nbytes = T[0][tr]
    since = t
    if not np.isnan(rf[R_BLOCKED, r]):
        since = rf[R_BLOCKED, r]
        rf[R_BLOCKED, r] = np.nan
    if arrive > since:  # the rank waits for this message
        peer = T[2][tr] if r == T[1][tr] else T[1][tr]
        _event(E, cnt, r, K_RECV, k, since, arrive, mb, -1, nbytes, peer)
    # the buffer exists from the receive's post (model.post_positions)
    _mem(M, cnt, r, reached[A[0][r] + A[8][k]], nbytes)
    done = max(t, arrive) + D[2] + D[3] * nbytes
    if op == OP_RF:
        H[1][tr * nmb + mb] += nbytes
        return done
    # gradients: summed into the one held per tensor of the producing piece (at most its
    # outputs others take); the rest of the buffer goes once read
    src = T[3][tr]
    gkey = src * nmb + mb
    cap, grad_held = P[17], H[8]
    keep = max(min(nbytes, cap[src] - grad_held[gkey]), 0.0)
    grad_held[gkey] += keep
    H[2][gkey] += keep
    if nbytes > keep:
        _mem(M, cnt, r, done, keep - nbytes)
    return done


@njit
def _collective(A, B, cnt, E, M, Q, rf, ri, k, t):
    """Launch an all-reduce (``_Engine.collective``); it runs once every member launched."""
    b, r = A[5][k], A[6][k]
    ptr, members, held_b, nbytes_b, end_add, arrived_n, arrived_t, ar_end = B[0], B[1], B[2], \
        B[3], B[4], B[5], B[6], B[7]
    if arrived_n[b] == 0 or t > arrived_t[b]:
        arrived_t[b] = t
    arrived_n[b] += 1
    held = held_b[b]
    if held:  # the gradients copied into the flat bucket, then dropped (engine.collective)
        _mem(M, cnt, r, t, held)
        _mem(M, cnt, r, t, -held)
    if arrived_n[b] == ptr[b + 1] - ptr[b]:
        start = arrived_t[b]
        for j in range(ptr[b], ptr[b + 1]):
            m = members[j]
            start = max(start, max(rf[R_ARFREE, m], rf[R_DPFREE, m]))
        # a pair's latency, overheads and bytes (in the reference's order), or the ring's
        # time and zeros: adding 0.0 changes no value
        end = start + end_add[0, b] + end_add[1, b] + end_add[2, b] + end_add[3, b]
        ar_end[b] = end
        B[8][b] = 1
        for j in range(ptr[b], ptr[b + 1]):
            m = members[j]
            rf[R_ARFREE, m] = end
            rf[R_DPFREE, m] = max(rf[R_DPFREE, m], end)
            _event(E, cnt, m, K_AR, k, start, end, -1, -1, nbytes_b[b], -1)
        _wake_waiters(ri, cnt, Q, b, end)
    return t


@njit
def _wake_waiters(ri, cnt, Q, b, end):
    """Wake the ranks whose step waits for bucket ``b``, in the order they began waiting."""
    R = ri.shape[1]
    while True:
        best = -1
        for w in range(R):
            if ri[I_WAITB, w] == b and (best < 0 or ri[I_WAITORD, w] < ri[I_WAITORD, best]):
                best = w
        if best < 0:
            return
        ri[I_WAITB, best] = -1
        _push(Q, cnt, end, best, -1)


@njit
def _optimizer(A, B, O, D, cnt, E, M, Q, rf, ri, k, t):
    """The rank's optimizer step (``_Engine._execute_other``'s ``OPT``): its next free time,
    or -1 while it waits for its all-reduces or the other ranks' steps."""
    r = A[6][k]
    rb_ptr, rb_list, ar_end, ar_done = B[9], B[10], B[7], B[8]
    for j in range(rb_ptr[r], rb_ptr[r + 1]):  # its buckets, in bucket order
        b = rb_list[j]
        if not ar_done[b]:
            ri[I_WAITB, r] = b
            ri[I_WAITORD, r] = cnt[C_WAITS]
            cnt[C_WAITS] += 1
            return -1.0
    start = max(t, rf[R_DPFREE, r])
    for j in range(rb_ptr[r], rb_ptr[r + 1]):
        start = max(start, ar_end[rb_list[j]])
    G = O[4]
    if D[11] > 0 and O[3] > 1:  # the step's synchronisation
        if np.isnan(G[1]):
            rf[R_SYNCAT, r] = start
            if ri[I_SYNCORD, r] < 0:
                ri[I_SYNCORD, r] = cnt[C_SYNC]
                cnt[C_SYNC] += 1
            if cnt[C_SYNC] < O[3]:
                return -1.0  # the last rank to arrive wakes the others
            last = -np.inf
            for w in range(rf.shape[1]):
                if ri[I_SYNCORD, w] >= 0:
                    last = max(last, rf[R_SYNCAT, w])
            G[1] = last + D[11]
            for order in range(cnt[C_SYNC]):
                for w in range(rf.shape[1]):
                    if ri[I_SYNCORD, w] == order and w != r:
                        _push(Q, cnt, G[1], w, -1)
        start = max(start, G[1])
    pair_recv, work_r, dur_r = O[0], O[1], O[2]
    if pair_recv[r]:  # waiting for the sums: a peer's half read, added, freed
        _mem(M, cnt, r, start, pair_recv[r])
        _mem(M, cnt, r, start, -pair_recv[r])
    work = work_r[r]
    if work:
        _mem(M, cnt, r, start, work)
    dur = dur_r[r]
    dur += _cold(D, rf, r, start, dur)
    rf[R_WARM, r] = start + dur
    _event(E, cnt, r, K_OPT, k, start, start + dur, -1, -1, 0.0, -1)
    if work:
        _mem(M, cnt, r, start + dur, -work)
    if rf[R_GRADS, r]:  # zero_grad(set_to_none=True)
        _mem(M, cnt, r, start + dur, -rf[R_GRADS, r])
        rf[R_GRADS, r] = 0.0
    return start + dur if start + dur > t else t


@njit
def _execute(A, P, T, B, O, D, cnt, E, M, H, Q, rf, ri, reached, k, t):
    """Perform action ``k`` at ``t``: when its rank is free again, or -1 while it is blocked
    (``_Engine.execute``)."""
    op, r = A[1][k], A[6][k]
    if op == OP_F or op == OP_B:
        p = A[3][k]
        dur = P[0][p] if op == OP_F else P[1][p]
        dur += _cold(D, rf, r, t, dur)
        if D[12] > 0:  # ranks share host cores: the end depends on the others
            _advance(rf, ri, cnt, O[4], D[12], t)
            ri[I_ACTIVE, r] = 1
            ri[I_ORDER, cnt[C_ACTIVE]] = r
            cnt[C_ACTIVE] += 1
            ri[I_JACT, r] = k  # (its version continues the rank's count: see _Engine)
            rf[R_JSTART, r] = t
            rf[R_JREM, r] = dur
            _reschedule(rf, ri, cnt, Q, D[12], t)
            return -1.0
        return _finish_compute(A, P, D, rf, ri, cnt, E, M, H, k, t, t + dur)
    if op == OP_SF or op == OP_SB:  # the send call's host time, then the message leaves
        t += D[0] + D[1] * T[0][A[4][k]]
        _send(A, T, cnt, E, M, H, Q, rf, k, t)
        return t
    if op == OP_RF or op == OP_RB:
        return _receive(A, P, T, D, cnt, E, M, H, rf, reached, k, t)
    if op == OP_AR:
        return _collective(A, B, cnt, E, M, Q, rf, ri, k, t)
    return _optimizer(A, B, O, D, cnt, E, M, Q, rf, ri, k, t)


@njit
def _step(A, P, T, B, O, D, cnt, E, M, H, Q, rf, ri, reached, r, t):
    """Run rank ``r``'s actions from ``t`` until it blocks or finishes (``_Engine.step``)."""
    first, stop = A[0][r], A[0][r + 1]
    while first + ri[I_PC, r] < stop:
        k = first + ri[I_PC, r]
        if np.isnan(reached[k]):
            reached[k] = t
        nxt = _execute(A, P, T, B, O, D, cnt, E, M, H, Q, rf, ri, reached, k, t)
        if nxt < 0:  # blocked; someone will wake us
            return
        if nxt > t:
            ri[I_PC, r] += 1
            rf[R_FINISH, r] = nxt
            _push(Q, cnt, nxt, r, -1)
            return
        ri[I_PC, r] += 1
        rf[R_FINISH, r] = max(rf[R_FINISH, r], t)


@njit
def run_events(A, P, T, B, O, D, cnt, E, M, H, Q, rf, ri, reached):
    """The reference's ``run`` loop: every rank woken at the step's host time, then events in
    (time, push order); returns the number of events and memory changes recorded."""
    R = rf.shape[1]
    for r in range(R):
        _push(Q, cnt, D[4], r, -1)
    while cnt[C_HEAP] > 0:
        t = Q[0][0]
        seq = Q[1][0]
        cnt[C_HEAP] = heap_pop(Q[0], Q[1], cnt[C_HEAP])
        r, version = Q[2][seq], Q[3][seq]
        if version < 0:
            _step(A, P, T, B, O, D, cnt, E, M, H, Q, rf, ri, reached, r, t)
            continue
        if not ri[I_ACTIVE, r] or ri[I_JVER, r] != version:
            continue  # superseded by a later rate change
        _advance(rf, ri, cnt, O[4], D[12], t)
        _drop_active(ri, cnt, r)
        _finish_compute(A, P, D, rf, ri, cnt, E, M, H, ri[I_JACT, r], rf[R_JSTART, r], t)
        _reschedule(rf, ri, cnt, Q, D[12], t)
        ri[I_PC, r] += 1
        rf[R_FINISH, r] = t
        _step(A, P, T, B, O, D, cnt, E, M, H, Q, rf, ri, reached, r, t)
    for r in range(R):
        _mem(M, cnt, r, rf[R_FINISH, r], -rf[R_SENT, r])
