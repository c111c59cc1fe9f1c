"""A fast node-level emulator of one training iteration of a placed graph.

Model (what the planners optimise; the schedule simulator in ``outcore.sim`` is the detailed one):

* **Forward.** Every node runs on its device; each device runs one node at a time; a node is
  *ready* when the outputs of all its predecessors have arrived (same device: at once; another
  device: ``latency + bytes / bandwidth`` after the producer ends, links never contend;
  ``run(..., contend=True)`` queues transfers on each device's two ports and sends a tensor
  to a device once, its gradients summed there and sent back once, as the simulator does).
  An idle device starts, among its ready nodes, the one of the earliest micro-batch, then the
  one the schedule builder would run first (:func:`priority`): the fewest device boundaries
  on a path from an input (its piece's hop level), then the earliest in topological order.
  That is the order in which the runtime runs a rank's pieces (``outcore.schedule.build``
  numbers pieces by hop level and first position and runs the lowest ready one). ParDNN's
  emulator, like TensorFlow's executor, runs the node that became ready first instead; on an
  RNN grid split in topological order that ran each device's layers one after another (10k
  nodes: 953 ms emulated against 612 ms simulated; 456 ms with this order).
* **Backward.** It starts once the whole forward has ended (the loss is computed, then
  ``loss.backward()``). The backward of ``v`` runs on ``v``'s device (autograd keeps saved tensors
  where the forward ran) once the backwards of all its successors have ended and their gradients
  have arrived (same bytes as the forward edge, reverse direction); among ready nodes the
  forward's priority reversed (the builder runs the highest piece first).
* **Micro-batches.** With ``M`` micro-batches, every node runs once per micro-batch, GPipe-like:
  all forwards (micro-batch 0 first), then all backwards. ``M = 1`` is ParDNN's setting.
* **Memory.** See :mod:`outcore.placers.context`: static + in-flight activations + received
  tensors + one transient buffer; the timeline peaks at the end of the forward.

The emulator is ParDNN's "schedule emulation" (paper section 4.2) adapted to PyTorch semantics;
its critical path drives the refinement of ParDNN step 1.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from outcore.errors import UsageError
from outcore.graph.ir import Graph
from outcore.hardware.spec import Cluster
from outcore.placers._jit import njit
from outcore.placers._sched_kernel import schedule_phase
from outcore.placers.context import Context, make_context
from outcore.plan.pieces import device_sends, hops
from outcore.plan.pieces_kernel import piece_components

log = logging.getLogger(__name__)

FORWARD, BACKWARD = 0, 1


@dataclass(frozen=True, eq=False)
class Emulation:
    """One emulated iteration.

    Attributes (n nodes, M micro-batches, D devices):
        makespan_s: end of the last backward, seconds.
        forward_s: end of the last forward (the backward starts there).
        busy_s: ``float64[D]`` compute seconds per device (with ``contend``, the runtime's
            fixed cost per piece included).
        fwd_start_s, fwd_end_s, bwd_start_s, bwd_end_s: ``float64[M, n]`` per micro-batch and node.
        critical_path: ``int32[L, 3]`` rows ``(phase, mb, node)`` from the first to the last task
            of the chain of tasks that determined the makespan (phase 0 forward, 1 backward);
            consecutive tasks are linked by a data dependency or by waiting for the device.
        peak_bytes: ``float64[D]`` peak memory per device (memory model).
        memory: per device ``(times_s, bytes)`` step function, only with ``timeline=True``.
    """

    makespan_s: float
    forward_s: float
    busy_s: np.ndarray
    fwd_start_s: np.ndarray
    fwd_end_s: np.ndarray
    bwd_start_s: np.ndarray
    bwd_end_s: np.ndarray
    critical_path: np.ndarray
    peak_bytes: np.ndarray
    memory: tuple[tuple[np.ndarray, np.ndarray], ...] = field(default=())


def summary(em: Emulation) -> Emulation:
    """A copy of ``em`` without per-task arrays (keeps makespan, busy time and peaks)."""
    z = np.zeros((0, 0))
    return Emulation(em.makespan_s, em.forward_s, em.busy_s, z, z, z, z,
                     np.zeros((0, 3), np.int32), em.peak_bytes, ())


def emulate(g: Graph, assignment: np.ndarray, cluster: Cluster | None = None, *,
            devices: int | None = None, optimizer: str = "adam", microbatches: int = 1,
            timeline: bool = False) -> Emulation:
    """Emulate one training iteration of ``g`` placed by ``assignment``.

    Args:
        g: the graph.
        assignment: ``int[n]`` device of each node index.
        cluster: links between devices (default: flat, 16 GB/s, 25 us).
        devices: number of devices (default: ``max(assignment) + 1``).
        optimizer: sets the parameter copies of the memory model (Adam: 4).
        microbatches: M (see module docstring).
        timeline: also return the memory over time per device.
    """
    a = np.asarray(assignment, dtype=np.int64)
    if a.shape != (g.num_nodes,):
        raise UsageError(f"assignment has shape {a.shape}, the graph has {g.num_nodes} nodes")
    if a.size and a.min() < 0:
        raise UsageError("assignment has a negative device number")
    k = int(a.max()) + 1 if devices is None and a.size else int(devices or 1)
    if a.size and a.max() >= k:
        raise UsageError(f"assignment uses device {int(a.max())} but devices={k}")
    ctx = make_context(g, k, cluster=cluster, optimizer=optimizer, microbatches=microbatches)
    return run(ctx, a, timeline=timeline)


def run(ctx: Context, assignment: np.ndarray, *, timeline: bool = False,
        critical_path: bool = True, contend: bool = False,
        peak_bytes: np.ndarray | None = None) -> Emulation:
    """Emulate with a prepared :class:`Context` (planners call this in their loops).
    ``peak_bytes``: ``ctx.memory(assignment)`` when the caller has it already.

    ``contend``: as the schedule simulator runs it (the search ranks placements so): transfers
    queue for each device's one outgoing and one incoming port instead of never contending,
    and the runtime's fixed cost per piece (:func:`_piece_overheads`) occupies the device
    instead of delaying the messages that start a piece as link latency."""
    g = ctx.g
    n, mbs, k = g.num_nodes, ctx.microbatches, ctx.devices
    a = np.ascontiguousarray(assignment, dtype=np.int64)
    if n == 0:
        z = np.zeros((mbs, 0))
        return Emulation(0.0, 0.0, np.zeros(k), z, z, z, z, np.zeros((0, 3), np.int32),
                         np.zeros(k))
    fstart, fend = np.empty(n * mbs), np.empty(n * mbs)
    if n * mbs >= 2**31 - 1:
        raise UsageError(f"{n} nodes x {mbs} micro-batches is too many tasks to emulate")
    fcause = np.empty(n * mbs, np.int32)
    none = np.zeros(0, np.int64)
    hop = _hops(g, a, ctx)
    prio = priority(ctx, a, hop)
    fdur = np.ascontiguousarray(g.fwd_s, np.float64)
    bdur = np.ascontiguousarray(g.bwd_s, np.float64)
    lat = ctx.lat_s
    if contend:
        fdur, bdur, lat = _piece_overheads(ctx, a, hop, prio)
    schedule_phase(n, mbs, g.pred_ptr, g.succ_ptr, g.succ_idx, g.succ_edge, fdur, a, 0.0,
                   lat, ctx.inv_bw, ctx.edge_bytes, k, fstart, fend, fcause, contend,
                   none, none, none, prio)
    forward_s = float(fend.max())
    bstart, bend = np.empty(n * mbs), np.empty(n * mbs)
    bcause = np.empty(n * mbs, np.int32)
    groups = _gradient_groups(g, a, k, ctx.edge_bytes) if contend else (none, none, none)
    schedule_phase(n, mbs, g.succ_ptr, g.pred_ptr, g.pred_idx, g.pred_edge, bdur, a,
                   forward_s, lat, ctx.inv_bw, ctx.edge_bytes, k, bstart, bend, bcause,
                   contend, *groups, n - 1 - prio)
    makespan = float(bend.max())
    cp = (_trace(fend, fcause, bend, bcause, n) if critical_path
          else np.zeros((0, 3), np.int32))
    # contended: what the simulator's pieces compute, their fixed costs included
    busy = mbs * np.bincount(a, weights=fdur + bdur if contend else ctx.work_s, minlength=k)
    peak = ctx.memory(a) if peak_bytes is None else peak_bytes
    shape = (mbs, n)
    em = Emulation(makespan, forward_s, busy, fstart.reshape(shape), fend.reshape(shape),
                   bstart.reshape(shape), bend.reshape(shape), cp, peak)
    if timeline:
        em = Emulation(**{**em.__dict__, "memory": memory_timeline(ctx, a, em)})
    return em


def _hops(g: Graph, a: np.ndarray, ctx: Context) -> np.ndarray:
    """Each node's hop level under ``a`` as :func:`outcore.plan.pieces.cut` finds it."""
    return hops(g, a, ctx.order, device_sends(g, a))


def priority(ctx: Context, assignment: np.ndarray, hop: np.ndarray | None = None
             ) -> np.ndarray:
    """``int64[n]``, a permutation: the rank of each node in the order the schedule builder
    runs the pieces of ``assignment`` (:func:`outcore.plan.pieces.cut` numbers them by hop
    level, then first topological position), node by node: hop level, then topological
    position. The forward runs the lowest first, the backward the highest. ``hop``: the
    nodes' hop levels, when known."""
    g = ctx.g
    hop = _hops(g, assignment, ctx) if hop is None else hop
    prio = np.empty(g.num_nodes, np.int64)
    prio[np.lexsort((ctx.rank, hop))] = np.arange(g.num_nodes)
    return prio


def _piece_overheads(ctx: Context, a: np.ndarray, hop: np.ndarray, prio: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(forward, backward durations, link latency)`` with the runtime's fixed cost per piece
    and micro-batch (the cluster device's ``fwd_overhead_s``, ``bwd_overhead_s``) on the
    device, as the simulator costs pieces (:func:`outcore.schedule.costs.piece_costs`): added
    to the node a piece runs first (forward: its lowest priority; backward: its highest), or
    with ``host_overlap`` raising the piece to that cost when its work is less. The context's
    latency, which carries half the per-piece cost for the planners, loses that half."""
    g, d = ctx.g, ctx.cluster.device
    fdur = np.array(g.fwd_s, dtype=np.float64)
    bdur = np.array(g.bwd_s, dtype=np.float64)
    if d.fwd_overhead_s + d.bwd_overhead_s <= 0:
        return fdur, bdur, ctx.lat_s
    root = piece_components(g.num_nodes, np.asarray(g.src, np.int64),
                            np.asarray(g.dst, np.int64), a, hop)
    first = np.full(g.num_nodes, g.num_nodes, np.int64)
    np.minimum.at(first, root, prio)
    last = np.full(g.num_nodes, -1, np.int64)
    np.maximum.at(last, root, prio)
    node_at = np.empty(g.num_nodes, np.int64)
    node_at[prio] = np.arange(g.num_nodes)
    roots = np.flatnonzero(root == np.arange(g.num_nodes))
    for dur, over, head in ((fdur, d.fwd_overhead_s, node_at[first[roots]]),
                            (bdur, d.bwd_overhead_s, node_at[last[roots]])):
        if d.host_overlap:
            work = np.bincount(root, weights=dur, minlength=g.num_nodes)[roots]
            dur[head] += np.maximum(over - work, 0.0)
        else:
            dur[head] += over
    off = ~np.eye(ctx.devices, dtype=bool)
    lat = np.where(off, ctx.lat_s - 0.5 * (d.fwd_overhead_s + d.bwd_overhead_s), ctx.lat_s)
    return fdur, bdur, lat


def _gradient_groups(g: Graph, a: np.ndarray, devices: int, edge_bytes: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The backward's gradient groups (see :mod:`outcore.placers._sched_kernel`): per entry
    of the backward's notification CSR (consumer ``w`` notifies producer ``u``), the group of
    ``(u, device of w)`` when that device is not ``u``'s and the edge carries bytes, else -1,
    groups numbered in ``(u, device)`` order; per group its entries and its bytes (the largest
    edge: the gradient of one tensor). Compiled (:func:`_groups_kernel`)."""
    return _groups_kernel(g.pred_ptr, g.pred_idx, np.asarray(g.pred_edge, np.int64),
                          np.ascontiguousarray(a, np.int64), np.asarray(edge_bytes, np.int64),
                          devices)


@njit
def _groups_kernel(pred_ptr, pred_idx, pred_edge, a, edge_bytes, devices):
    n = pred_ptr.shape[0] - 1
    grp = np.full(pred_idx.shape[0], -1, np.int64)
    slot = np.full(n * devices, -1, np.int64)  # group of each (u, device) key; -2: seen
    for w in range(n):
        for k in range(pred_ptr[w], pred_ptr[w + 1]):
            u = pred_idx[k]
            if a[u] != a[w] and edge_bytes[pred_edge[k]] > 0:
                slot[u * devices + a[w]] = -2
    groups = 0
    for key in range(n * devices):  # numbered in key order
        if slot[key] == -2:
            slot[key] = groups
            groups += 1
    count = np.zeros(groups, np.int64)
    nbytes = np.zeros(groups, np.int64)
    for w in range(n):
        for k in range(pred_ptr[w], pred_ptr[w + 1]):
            u = pred_idx[k]
            eb = edge_bytes[pred_edge[k]]
            if a[u] != a[w] and eb > 0:
                b = slot[u * devices + a[w]]
                grp[k] = b
                count[b] += 1
                if eb > nbytes[b]:
                    nbytes[b] = eb
    return grp, count, nbytes


@njit
def _trace(fend, fcause, bend, bcause, n):
    """``int32[m, 3]`` (backward?, micro-batch, node): the chain of causes from a task with
    no cause to the last backward task."""
    total = fend.shape[0]
    tb = 0
    for i in range(total):  # last backward to end; ties: smallest task
        if bend[i] > bend[tb]:
            tb = i
    tf = 0
    for i in range(total):  # the backward was released by the last forward task
        if fend[i] > fend[tf]:
            tf = i
    m = 0
    t = tb
    while t >= 0:
        m += 1
        t = bcause[t]
    t = tf
    while t >= 0:
        m += 1
        t = fcause[t]
    out = np.empty((m, 3), np.int32)  # filled from the end: the first cause comes first
    t = tb
    while t >= 0:
        m -= 1
        out[m, 0] = 1
        out[m, 1] = t // n
        out[m, 2] = t % n
        t = bcause[t]
    t = tf
    while t >= 0:
        m -= 1
        out[m, 0] = 0
        out[m, 1] = t // n
        out[m, 2] = t % n
        t = fcause[t]
    return out


def memory_timeline(ctx: Context, assignment: np.ndarray, em: Emulation
                    ) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per device, allocated bytes as a step function ``(times_s, bytes from that time on)``.

    Static bytes and the transient buffer are counted from time 0; a node's saved activation from
    its forward start to its backward end; a received tensor from its arrival to the end of the
    backward of its last consumer on that device. At equal times frees come before allocations.
    """
    g = ctx.g
    k = ctx.devices
    n = g.num_nodes
    static, _, trans = ctx.memory_parts(assignment)
    times: list[np.ndarray] = []
    devs: list[np.ndarray] = []
    deltas: list[np.ndarray] = []
    for mb in range(ctx.microbatches):
        times += [em.fwd_start_s[mb], em.bwd_end_s[mb]]
        devs += [assignment, assignment]
        sb = g.saved_bytes.astype(np.float64)
        deltas += [sb, -sb]
        du, dv = assignment[g.src], assignment[g.dst]
        cross = np.flatnonzero((du != dv) & (g.edge_bytes > 0))
        if cross.size:
            u, d, eb = g.src[cross], dv[cross], g.edge_bytes[cross].astype(np.float64)
            arrive = em.fwd_end_s[mb][u] + ctx.lat_s[du[cross], d] + eb * ctx.inv_bw[du[cross], d]
            free = em.bwd_end_s[mb][g.dst[cross]]
            key = u * k + d
            order = np.lexsort((eb, key))
            key_s = key[order]
            first = np.ones(key_s.size, bool)
            first[1:] = key_s[1:] != key_s[:-1]
            gid = np.cumsum(first) - 1
            ng = int(gid[-1]) + 1
            g_bytes = np.zeros(ng)
            np.maximum.at(g_bytes, gid, eb[order])
            g_in = np.full(ng, np.inf)
            np.minimum.at(g_in, gid, arrive[order])
            g_out = np.zeros(ng)
            np.maximum.at(g_out, gid, free[order])
            g_dev = key_s[first] % k
            times += [g_in, g_out]
            devs += [g_dev, g_dev]
            deltas += [g_bytes, -g_bytes]
    t = np.concatenate(times)
    d = np.concatenate(devs)
    x = np.concatenate(deltas)
    order = np.lexsort((x, t))  # by time, frees (negative) first
    out = []
    for dev in range(k):
        sel = order[d[order] == dev]
        base = static[dev] + trans[dev]
        tt = np.concatenate(([0.0], t[sel]))
        yy = base + np.concatenate(([0.0], np.cumsum(x[sel])))
        out.append((tt, yy))
    del n
    return tuple(out)
