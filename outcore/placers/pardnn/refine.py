"""ParDNN step 1c, *refinement*: path swapping and node switching on the emulated critical path.

Qararyah et al. 2021, section 4.1 ("Refinement"): after mapping, (a) *path swapping* moves a
secondary path to the device that holds its neighbours when the device has idle time in the
path's window, removing its communication, and (b) *node switching* moves nodes at the device
changes of the critical path of a simulated schedule to the other side of the change.

Here the schedule is the emulator's (:mod:`outcore.placers.emulate`), and every batch of moves
is checked by emulating again: a round keeps its moves only if the makespan drops (and the plan
still fits the memory limit). Rounds alternate as in the authors' prototype: first all
non-conflicting moves with a positive communication gain, then only the best one once a batch
fails. Candidates:

* path moves: every secondary path lying on one device, towards the device that saves it most
  communication, when that device's load in the path's window plus the path fits the window;
* critical-path moves: at each device change ``u -> v`` of the critical path, ``u`` to ``v``'s
  device, ``v`` to ``u``'s, and the critical-path runs ending at ``u`` / starting at ``v``
  likewise (bounded to half a device's share of nodes, and to the first 256 device changes).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from outcore.graph.level_kernel import bottom_levels, top_levels
from outcore.placers._jit import njit_borrowing
from outcore.placers._move_kernel import cluster_moves, cp_switch_gains, row_marked, set_move_delta
from outcore.placers.context import Context
from outcore.placers.emulate import Emulation, run

log = logging.getLogger(__name__)

MAX_RUN_MOVES = 256  # device changes of the critical path whose runs are considered per round
# a round's moves are kept when they shorten the emulated iteration by more than this fraction
MIN_GAIN = 1e-4


@dataclass(frozen=True)
class RefineStats:
    rounds: int
    accepted: int
    moved_nodes: int
    start_s: float
    end_s: float


def refine(ctx: Context, assign: np.ndarray, sec_ptr: np.ndarray, sec_nodes: np.ndarray, *,
           rounds: int, em: Emulation | None = None
           ) -> tuple[np.ndarray, Emulation, RefineStats]:
    """Improve ``assign`` by path and node moves; return (assignment, its emulation, stats).

    Only moves that keep the plan within ``ctx.memory_bytes`` are kept (when the input fits).
    """
    a = np.ascontiguousarray(assign, dtype=np.int64).copy()
    em = run(ctx, a) if em is None else em
    start = em.makespan_s
    fits = ctx.fits(ctx.memory(a))
    mode_all = True
    accepted = moved = done = 0
    for _ in range(rounds):
        done += 1
        cptr, cnodes, ctarget, cgain = _candidates(ctx, a, em, sec_ptr, sec_nodes, mode_all)
        if cgain.size == 0:
            break
        order = np.lexsort((cnodes[cptr[:-1]], -cgain))
        b = a.copy()
        _apply(order, cptr, cnodes, ctarget, b, np.zeros(a.size, np.bool_),
               1 if not mode_all else cgain.size)
        if fits and not ctx.fits(ctx.memory(b)):
            if mode_all:
                mode_all = False
                continue
            break
        em2 = run(ctx, b)
        if em2.makespan_s < em.makespan_s * (1.0 - MIN_GAIN):
            moved += int((b != a).sum())
            a, em = b, em2
            accepted += 1
        elif mode_all:
            mode_all = False
        else:
            break
    log.debug("refinement: %d rounds, %d accepted, %.6g s -> %.6g s", done, accepted, start,
              em.makespan_s)
    return a, em, RefineStats(done, accepted, moved, start, em.makespan_s)


def _candidates(ctx: Context, a: np.ndarray, em: Emulation, sec_ptr: np.ndarray,
                sec_nodes: np.ndarray, with_paths: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Candidate moves as a CSR of node sets, each with a target device and a gain > 0 (s)."""
    g = ctx.g
    sizes: list[np.ndarray] = []
    members: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    gains: list[np.ndarray] = []
    if with_paths and sec_ptr.size > 1:
        target, gain = cluster_moves(sec_ptr, sec_nodes, a, ctx.devices, g.succ_ptr, g.succ_idx,
                                     g.succ_edge, g.pred_ptr, g.pred_idx, g.pred_edge,
                                     ctx.edge_bytes, ctx.lat_s, ctx.inv_bw)
        ok = np.flatnonzero(target >= 0)
        if ok.size:
            ok = ok[_fits_window(ctx, a, sec_ptr, sec_nodes, ok, target[ok])]
        if ok.size:
            size = sec_ptr[ok + 1] - sec_ptr[ok]
            sizes.append(size)
            members.append(sec_nodes[_ranges(sec_ptr[ok], size)])
            targets.append(target[ok])
            gains.append(gain[ok])
    cp_sizes, cp_members, cp_targets, cp_gains = _cp_candidates(ctx, a, em)
    if cp_sizes.size:
        sizes.append(cp_sizes)
        members.append(cp_members)
        targets.append(cp_targets)
        gains.append(cp_gains)
    if not sizes:
        z = np.zeros(0, np.int64)
        return np.zeros(1, np.int64), z, z, np.zeros(0)
    ptr = np.concatenate(([0], np.cumsum(np.concatenate(sizes)))).astype(np.int64)
    return (ptr, np.concatenate(members).astype(np.int64),
            np.concatenate(targets).astype(np.int64), np.concatenate(gains))


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + k)`` for each start ``s`` and size ``k``."""
    total = int(sizes.sum())
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(sizes)[:-1])), sizes)
    return offsets + np.arange(total, dtype=np.int64)


def _cp_candidates(ctx: Context, a: np.ndarray, em: Emulation
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Node switching at the critical path: gap-aware moves of critical nodes, and moves of
    the critical runs on either side of each device change that save communication.

    Returns ``(sizes, members, targets, gains)``: move ``i`` moves the next ``sizes[i]`` nodes of
    ``members`` to ``targets[i]``.
    """
    z = np.zeros(0, np.int64)
    if em.critical_path.shape[0] < 1 or ctx.devices < 2:
        return z, z, z, np.zeros(0)
    moves = _node_switches(ctx, a, em) + _run_moves(ctx, a, em)
    if not moves:
        return z, z, z, np.zeros(0)
    sizes, sets, targets, gains = zip(*moves)
    return (np.concatenate(sizes), np.concatenate(sets).astype(np.int64),
            np.concatenate(targets).astype(np.int64), np.concatenate(gains))


Move = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # sizes, members, targets, gains


def _node_switches(ctx: Context, a: np.ndarray, em: Emulation) -> list[Move]:
    """Gap-aware moves of single critical nodes (gains of a node in both phases add)."""
    g, cp, mbs = ctx.g, em.critical_path, ctx.microbatches
    dev_task = np.tile(a, mbs)
    fptr, fst, fen = _intervals(dev_task, em.fwd_start_s.ravel(), em.fwd_end_s.ravel(),
                                ctx.devices)
    bptr, bst, ben = _intervals(dev_task, em.bwd_start_s.ravel(), em.bwd_end_s.ravel(),
                                ctx.devices)
    fdur = np.ascontiguousarray(g.fwd_s, np.float64)
    bdur = np.ascontiguousarray(g.bwd_s, np.float64)
    found_node, found_target, found_gain = [], [], []
    for mb in np.unique(cp[:, 1]).tolist():
        rows = cp[cp[:, 1] == mb]
        node, target, gain = cp_switch_gains(
            np.ascontiguousarray(rows[:, 0]), np.ascontiguousarray(rows[:, 2]), a, ctx.devices,
            em.forward_s, em.fwd_start_s[mb], em.fwd_end_s[mb], em.bwd_start_s[mb],
            em.bwd_end_s[mb], fdur, bdur, fptr, fst, fen, bptr, bst, ben, g.succ_ptr,
            g.succ_idx, g.succ_edge, g.pred_ptr, g.pred_idx, g.pred_edge, ctx.edge_bytes,
            ctx.lat_s, ctx.inv_bw)
        ok = (target >= 0) & (gain > 0)
        found_node.append(node[ok])
        found_target.append(target[ok])
        found_gain.append(gain[ok])
    if not found_node:
        return []
    key = np.concatenate(found_node) * ctx.devices + np.concatenate(found_target)
    uniq, inv = np.unique(key, return_inverse=True)
    total = np.bincount(inv, weights=np.concatenate(found_gain), minlength=uniq.size)
    return [(np.ones(uniq.size, np.int64), uniq // ctx.devices, uniq % ctx.devices, total)]


def _run_moves(ctx: Context, a: np.ndarray, em: Emulation) -> list[Move]:
    """Moves of the critical runs on either side of each device change that save
    communication (a run: consecutive critical tasks of one phase on one device)."""
    g, cp, mbs = ctx.g, em.critical_path, ctx.microbatches
    nodes = cp[:, 2].astype(np.int64)
    dev = a[nodes]
    phase = cp[:, 0]
    change = np.flatnonzero((dev[1:] != dev[:-1]) & (phase[1:] == phase[:-1]))
    run_id = np.concatenate(([0], np.cumsum((dev[1:] != dev[:-1]) | (phase[1:] != phase[:-1]))))
    run_start = np.flatnonzero(np.concatenate(([True], run_id[1:] != run_id[:-1])))
    run_end = np.concatenate((run_start[1:], [nodes.size]))
    cap = max(1, g.num_nodes // (2 * ctx.devices))
    mark = np.zeros(g.num_nodes, np.bool_)
    seen: set[tuple[int, int, int]] = set()
    out: list[Move] = []

    def consider(members: np.ndarray, target: int) -> None:
        if mbs > 1:  # a node appears once per micro-batch
            members = np.unique(members)
        key = (int(members[0]), int(members.size), target)
        if key in seen or members.size > cap or members.size < 2:
            return
        seen.add(key)
        delta = set_move_delta(members, target, a, mark, g.succ_ptr, g.succ_idx, g.succ_edge,
                               g.pred_ptr, g.pred_idx, g.pred_edge, ctx.edge_bytes, ctx.lat_s,
                               ctx.inv_bw)
        if delta < -1e-15:
            out.append((np.array([members.size], np.int64), members,
                        np.array([target], np.int64), np.array([-delta])))

    for i in change.tolist()[:MAX_RUN_MOVES]:
        du, dv = int(dev[i]), int(dev[i + 1])
        ru, rv = run_id[i], run_id[i + 1]
        consider(nodes[run_start[ru]:run_end[ru]], dv)
        consider(nodes[run_start[rv]:run_end[rv]], du)
    return out


def _intervals(dev_task: np.ndarray, start: np.ndarray, end: np.ndarray, k: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tasks grouped by device and sorted by start: (device CSR pointers, starts, ends)."""
    order = np.lexsort((start, dev_task))
    ptr = np.zeros(k + 1, np.int64)
    np.cumsum(np.bincount(dev_task, minlength=k), out=ptr[1:])
    return ptr, np.ascontiguousarray(start[order]), np.ascontiguousarray(end[order])


def _fits_window(ctx: Context, a: np.ndarray, ptr: np.ndarray, nodes: np.ndarray,
                 clusters: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Mask of the path moves whose target has idle time for the path in its window."""
    g = ctx.g
    n = g.num_nodes
    w = ctx.work_s
    active = np.ones(n, np.bool_)
    tl = top_levels(ctx.order, g.pred_ptr, g.pred_idx, g.pred_edge, w, ctx.comm_s, a, active)
    bl = bottom_levels(ctx.order, g.succ_ptr, g.succ_idx, g.succ_edge, w, ctx.comm_s, a, active)
    length = float((tl + bl).max())
    buckets = int(min(max(n // 4, 1), 1 << 16))
    scale = buckets / length if length > 0 else 0.0
    node_bucket = np.minimum((tl * scale).astype(np.int64), buckets - 1)
    load = np.zeros((ctx.devices, buckets + 1))
    np.add.at(load, (a, node_bucket + 1), w)
    np.cumsum(load, axis=1, out=load)
    heads = nodes[ptr[clusters]]
    tails = nodes[ptr[clusters + 1] - 1]
    cw = np.add.reduceat(w[nodes], ptr[:-1])[clusters] if nodes.size else np.zeros(0)
    lo = tl[heads]
    hi = np.maximum(length - bl[tails] + w[tails], lo)
    b_lo = np.minimum((lo * scale).astype(np.int64), buckets - 1)
    b_hi = np.minimum((hi * scale).astype(np.int64), buckets - 1)
    in_window = load[targets, b_hi + 1] - load[targets, b_lo]
    return in_window + cw <= (hi - lo) + 1e-12


@njit_borrowing
def _apply(order, ptr, nodes, target, assign, used, limit):
    """Apply candidate moves in ``order`` whose node sets are disjoint; at most ``limit``."""
    count = 0
    for i in range(order.shape[0]):
        if count >= limit:
            break
        c = order[i]
        if row_marked(ptr, nodes, c, used):
            continue
        for j in range(ptr[c], ptr[c + 1]):
            used[nodes[j]] = True
            assign[nodes[j]] = target[c]
        count += 1
    return count
