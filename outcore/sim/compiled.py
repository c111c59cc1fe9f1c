"""The simulator's compiled event loop (:mod:`outcore.sim._engine_kernel`): a schedule packed
into arrays, run, and read back as the same :class:`~outcore.trace.Timeline` the reference
engine (:class:`outcore.sim.engine._Engine`) returns. Used when numba is installed; the rare
schedules it does not pack (an all-reduce of a bucket the schedule does not list, tables too
large to hold as arrays) run on the reference."""

from __future__ import annotations

from typing import cast

import numpy as np

from outcore.errors import ScheduleError
from outcore.hardware.collectives import dp_allreduce as dp_phases, ring_allreduce_s
from outcore.hardware.spec import COLD_START_FRACTION, COLD_START_IDLE_S, Cluster
from outcore.schedule.costs import PieceCosts
from outcore.schedule.ir import Schedule, action_columns
from outcore.sim import _engine_kernel as K
from outcore.sim.model import (
    ar_buffer_bytes,
    grad_bytes,
    held_at_start,
    link_ports,
    pair_recv_bytes,
    paired_buckets,
    post_positions,
)
from outcore.trace import Event, EventColumns, Timeline

# keyed tables past this many entries are not held as arrays (the reference runs instead)
MAX_TABLE = 50_000_000


def simulate_compiled(s: Schedule, costs: PieceCosts, cluster: Cluster, opt) -> Timeline | None:
    """``simulate_schedule(s, costs, cluster, opt)`` on the compiled loop, or None when the
    schedule is one it does not pack."""
    R = s.num_ranks
    columns = [action_columns(acts) for acts in s.actions]
    n_actions = sum(len(c[0]) for c in columns)
    if not n_actions:
        return None
    op, mbs, pcs, trs, bks = (np.concatenate([c[k] for c in columns]).astype(np.int64)
                              for k in range(5))
    if (bks[op == K.OP_AR] >= len(s.buckets)).any():
        return None
    nmb = int(max(mbs.max(), 0)) + 1
    T, P = s.pieces.num_transfers, s.pieces.num_pieces
    if (T * 2 + 2 * P) * nmb > MAX_TABLE:
        return None
    ptr = np.zeros(R + 1, np.int64)
    ptr[1:] = np.cumsum([len(c[0]) for c in columns])
    rank_of = np.repeat(np.arange(R, dtype=np.int64), np.diff(ptr))
    A = (ptr, op, mbs, pcs, trs, bks, rank_of, nmb,
         np.concatenate(post_positions(s)).astype(np.int64))
    Pa, left = _pieces(s, costs, cluster, opt, op, mbs, pcs, R)
    Ta, nports = _transfers(s, costs, cluster)
    paired = paired_buckets(s, cluster, opt)
    Ba = _buckets(s, cluster, opt, R, paired)
    Oa = _optimizer(s, costs, cluster, opt, R, paired,
                    sum(bool((c[0] == K.OP_OPT).any()) for c in columns))
    dev = cluster.device
    D = np.array([dev.send_overhead_s, dev.send_byte_s, dev.recv_overhead_s, dev.recv_byte_s,
                  opt.step_host_s,
                  dev.cold_start_s if dev.host_is_device else 0.0, COLD_START_FRACTION,
                  COLD_START_IDLE_S, opt.dp, opt.dp_bucket_bytes, 1.0 if opt.dp_fused else 0.0,
                  opt.step_sync_s, float(cluster.host_cores or 0)], np.float64)
    n_compute = int(((op == K.OP_F) | (op == K.OP_B)).sum())
    pushes = 2 * R + 2 * n_actions + R * (len(s.buckets) + 1) + 16 + \
        (2 * n_compute * R if cluster.host_cores else 0)
    if pushes > MAX_TABLE:
        return None
    n_ev = n_actions + len(Ba[1]) + P + R + 16
    E = (np.zeros(n_ev, np.int64), np.zeros(n_ev, np.int64), np.zeros(n_ev, np.int64),
         np.zeros(n_ev), np.zeros(n_ev), np.zeros(n_ev, np.int64), np.zeros(n_ev, np.int64),
         np.zeros(n_ev), np.zeros(n_ev, np.int64))
    n_mem = 2 * R + 7 * n_actions + 16
    M = (np.zeros(n_mem, np.int64), np.zeros(n_mem), np.zeros(n_mem))
    M[0][:R] = np.arange(R)  # the static state, less the gradients the step makes
    M[2][:R] = held_at_start(s, costs, Pa[6])
    key = T * 2 * nmb
    H = (np.zeros(key), np.zeros(T * nmb), np.zeros(P * nmb), np.zeros(P, np.bool_),
         np.zeros(nports), np.zeros(nports), np.zeros(key, np.int8), np.full(key, -1, np.int64),
         np.zeros(P * nmb))  # the last: gradients held per (piece, micro-batch), summed
    Q = (np.zeros(pushes), np.zeros(pushes, np.int64), np.zeros(pushes, np.int64),
         np.zeros(pushes, np.int64))
    rf = np.zeros((11, R))
    rf[K.R_WARM] = -np.inf
    rf[K.R_BLOCKED] = np.nan
    ri = np.zeros((9, R), np.int64)
    ri[K.I_LEFT] = left
    ri[K.I_WAITB] = -1
    ri[K.I_SYNCORD] = -1
    cnt = np.zeros(7, np.int64)
    cnt[K.C_MEM] = R
    reached = np.full(n_actions, np.nan)
    K.run_events(A, Pa, Ta, Ba, Oa, D, cnt, E, M, H, Q, rf, ri, reached)
    pc = ri[K.I_PC]
    unfinished = [f"rank {r} at {s.actions[r][pc[r]]}" for r in range(R)
                  if pc[r] < len(s.actions[r])]
    if unfinished:
        raise ScheduleError("the schedule deadlocks in simulation: " +
                            "; ".join(unfinished[:6]))
    iteration = max(rf[K.R_FINISH].tolist() + [0.0])
    limit = cluster.device.memory_bytes
    events = cast(tuple[Event, ...], _events(E, int(cnt[K.C_EV]), s.actions))  # lazy columns
    return Timeline(R, events, iteration,
                    _memory(M, int(cnt[K.C_MEM]), R),
                    limit if np.isfinite(limit) else None, "simulated",
                    {"schedule": s.kind, "microbatches": s.microbatches, "dp": opt.dp})


def _pieces(s: Schedule, costs: PieceCosts, cluster: Cluster, opt, op, mbs, pcs, R: int):
    """Per-piece arrays (and each rank's count of pieces with a last backward)."""
    P = s.pieces.num_pieces
    tb = np.asarray(costs.transfer_bytes, np.float64)
    src, dst = s.pieces.transfer_pieces
    dev = np.asarray(s.pieces.device_of, np.int64)
    remote = dev[src] != dev[dst]  # (a transfer is local when its pieces share a device)
    grads = np.asarray(grad_bytes(s, costs), np.float64)
    last_b = np.full(P, -1, np.int64)
    b = np.flatnonzero(op == K.OP_B)[::-1]  # the last backward of each piece in rank order
    with_b, first = np.unique(pcs[b], return_index=True)
    last_b[with_b] = mbs[b][first]
    # gradients handed to a piece of the same rank, held until its backward
    local = ~remote & (last_b[src] >= 0)
    in_grad = np.zeros(P)
    np.add.at(in_grad, dst[remote], tb[remote])  # in transfer order, as the reference sums
    cap = np.asarray(costs.out_grad_cap, np.float64) if costs.out_grad_cap is not None \
        else np.full(P, np.inf)
    first_extra = np.asarray(costs.first_bwd_extra, np.float64) \
        if costs.first_bwd_extra is not None else np.zeros(P)
    lo = np.flatnonzero(local)
    lo = lo[np.argsort(dst[lo], kind="stable")]
    local_ptr = np.zeros(P + 1, np.int64)
    local_ptr[1:] = np.cumsum(np.bincount(dst[lo], minlength=P))
    left = np.bincount(np.asarray(s.pieces.device_of, np.int64)[with_b], minlength=R)
    pparam = np.asarray(costs.piece_param_bytes, np.float64)
    ph, rph, port_of, ports, total = _dp_phases(s, costs, cluster, opt, last_b, pparam, R)
    return (np.asarray(costs.fwd_s, np.float64), np.asarray(costs.bwd_s, np.float64),
            np.asarray(costs.transient_bytes, np.float64),
            np.asarray(costs.bwd_transient, np.float64),
            np.asarray(costs.saved_bytes, np.float64), in_grad, grads, last_b, pparam, ph, rph,
            np.zeros(ports), port_of, total, local_ptr, src[lo].astype(np.int64),
            tb[lo].copy(), cap, first_extra,
            np.asarray(costs.fwd_held, np.float64) if costs.fwd_held is not None
            else np.zeros(P)), left


def _dp_phases(s: Schedule, costs: PieceCosts, cluster: Cluster, opt, last_b, pparam, R: int):
    """The data-parallel all-reduce phases (intra, inter, after seconds; through a node's
    port or not) of each piece's gradients (``ph``) and of each rank's (``rph``, with its
    share), each rank's network port, and one bucket's whole all-reduce per rank."""
    P = len(last_b)
    ph, rph = np.zeros((4, P)), np.zeros((5, R))
    port_of, total = np.zeros(R, np.int64), np.zeros(R)
    if opt.dp <= 1:
        return ph, rph, port_of, 1, total

    def phases(r: int, share: float):
        return dp_phases(cluster, s.num_ranks, opt.dp, r, share, opt.dp_collective,
                         opt.dp_link)

    device = np.asarray(s.pieces.device_of, np.int64)
    for p in np.flatnonzero(last_b >= 0).tolist() if not opt.dp_fused else ():
        x = phases(int(device[p]), float(pparam[p]))
        ph[:, p] = (x.intra_s, x.inter_s, x.after_s, x.node is not None)
    keys: dict = {}
    for r in range(R):
        share = float(costs.param_bytes[r])
        x = phases(r, share)
        rph[:, r] = (share, x.intra_s, x.inter_s, x.after_s, x.node is not None)
        if 0 < opt.dp_bucket_bytes:
            total[r] = phases(r, opt.dp_bucket_bytes).total_s
        if cluster.size > r:
            port_of[r] = keys.setdefault(cluster.port_of(r), len(keys))
    return ph, rph, port_of, max(len(keys), 1), total


def _transfers(s: Schedule, costs: PieceCosts, cluster: Cluster):
    """Per-transfer arrays: bytes, source and destination devices and source piece, and per
    direction (row 0: source to destination; 1: back) its ports, latency, bandwidth and
    whether the link copies a message out in the send call; and the number of ports."""
    src_p, dst_p = s.pieces.transfer_pieces
    dev = np.asarray(s.pieces.device_of, np.int64)
    T = len(src_p)
    a, b = dev[src_p], dev[dst_p]
    R = max(s.num_ranks, 1)
    pairs, inverse = np.unique(np.concatenate([a * R + b, b * R + a]), return_inverse=True)
    ids: dict = {}
    rows = np.zeros((5, len(pairs)))
    for j, code in enumerate(pairs.tolist()):
        out, into, link = link_ports(cluster, *divmod(code, R))
        rows[:, j] = (ids.setdefault(out, len(ids)), ids.setdefault(into, len(ids)),
                      link.latency_s, link.bandwidth, link.copy_on_send)
    per = rows[:, inverse].reshape(5, 2, T)
    # (contiguous copies throughout: one compiled signature serves every schedule)
    return (np.asarray(costs.transfer_bytes, np.float64), a, b, src_p,
            per[0].astype(np.int64), per[1].astype(np.int64), np.ascontiguousarray(per[2]),
            np.ascontiguousarray(per[3]), per[4].astype(np.bool_)), max(len(ids), 1)


def _buckets(s: Schedule, cluster: Cluster, opt, R: int, paired: frozenset[int]):
    """The gradient buckets: members (in the schedule's order), the buffer each member holds,
    bytes, the seconds added to the collective's start (``paired``: summed over a pair's own
    link), arrival state, and each rank's buckets in order."""
    nb = len(s.buckets)
    ptr = np.zeros(nb + 1, np.int64)
    ptr[1:] = np.cumsum([len(g) for g in s.buckets])
    members = np.array([m for g in s.buckets for m in g], np.int64)
    held, nbytes, add = np.zeros(nb), np.zeros(nb), np.zeros((4, max(nb, 1)))
    dev = cluster.device
    for b, group in enumerate(s.buckets):
        ring = opt.bucket_ring[b] if b < len(opt.bucket_ring) else 0
        held[b] = ar_buffer_bytes(opt, b)
        nbytes[b] = opt.bucket_bytes[b] if b < len(opt.bucket_bytes) else 0.0
        link = cluster.link(min(group), max(group))
        if b in paired:  # one message each way over the pair's own link
            add[:, b] = (link.latency_s, dev.send_overhead_s, dev.recv_overhead_s,
                         nbytes[b] / link.bandwidth)
        else:
            add[0, b] = ring_allreduce_s(nbytes[b], ring or len(group), link)
    of_rank = [[b for b, g in enumerate(s.buckets) if r in g] for r in range(R)]
    rb_ptr = np.zeros(R + 1, np.int64)
    rb_ptr[1:] = np.cumsum([len(x) for x in of_rank])
    rb_list = np.array([b for x in of_rank for b in x], np.int64)
    return (ptr, members, held, nbytes, add, np.zeros(nb, np.int64), np.zeros(nb),
            np.zeros(nb), np.zeros(nb, np.bool_), rb_ptr, rb_list)


def _optimizer(s: Schedule, costs: PieceCosts, cluster: Cluster, opt, R: int,
               paired: frozenset[int], steps: int):
    """Per rank: the pair-sum buffer, the step's working memory and seconds; the ranks that
    step (``steps``, counted by the caller); the loop's clock and the synchronisation's end
    (NaN until known)."""
    pair = np.array(pair_recv_bytes(s, paired, opt), np.float64)
    work = np.array([float(costs.param_bytes[r]) * opt.optimizer_transient for r in range(R)])
    dur = np.zeros(R)
    for r in range(R):
        tensors = float(costs.param_tensors[r]) if costs.param_tensors is not None else 0.0
        dur[r] = opt.optimizer_s(float(costs.param_bytes[r]), tensors,
                                 cluster.device.mem_bandwidth)
    return pair, work, dur, steps, np.array([0.0, np.nan])


def _events(E, n: int, actions) -> EventColumns:
    """The kernel's events as the reference's, in its order (by start, rank, stream, then as
    recorded): columns now, :class:`~outcore.trace.Event` tuples when read."""
    rank, kind, act, start, end = E[0][:n], E[1][:n], E[2][:n], E[3][:n], E[4][:n]
    compute = (kind == K.K_F) | (kind == K.K_B) | (kind == K.K_OPT)
    order = np.lexsort((np.arange(n), compute, rank, start))  # "comm" sorts before "compute"
    nbytes = np.trunc(E[7][:n]).astype(np.int64)[order]
    kind, act = kind[order], act[order]
    cols = {"rank": rank[order], "start_s": start[order], "end_s": end[order], "bytes": nbytes,
            "compute": compute[order], "fb": kind <= K.K_B, "forward": kind == K.K_F,
            "piece": E[6][:n][order],
            "sent": (kind == K.K_SEND) | (kind == K.K_AR) | (kind == K.K_DP)}

    def make() -> tuple[Event, ...]:
        names = K.EVENT_KINDS
        flat = [a for acts in actions for a in acts]
        out = []
        for j, (r, k, a, t0, t1, mb, p, b, peer, on) in enumerate(zip(
                cols["rank"].tolist(), kind.tolist(), act.tolist(), cols["start_s"].tolist(),
                cols["end_s"].tolist(), E[5][:n][order].tolist(), E[6][:n][order].tolist(),
                nbytes.tolist(), E[8][:n][order].tolist(), cols["compute"].tolist())):
            if k == K.K_DP:
                label = "DP" if p < 0 else f"DP{p}"
            else:
                label = "OPT" if k == K.K_OPT else str(flat[a])
            name = flat[a].op if k <= K.K_B else names[k]
            out.append(Event(r, name, label, t0, t1, "compute" if on else "comm", mb, p, b,
                             peer))
        return tuple(out)

    return EventColumns(cols, make)


def _memory(M, n: int, R: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per rank, memory changes ordered by time (ties: as recorded), summed."""
    rank, t, d = M[0][:n], M[1][:n], M[2][:n]
    out = []
    for r in range(R):
        idx = np.flatnonzero(rank == r)
        o = np.argsort(t[idx], kind="stable")
        out.append((t[idx][o], np.cumsum(d[idx][o])))
    return tuple(out)
