"""Granularity as a planner decision: merge pieces too small to pay for themselves.

A piece placed apart from its neighbours costs the runtime a fixed time per micro-batch (its
forward and backward overheads, ``DeviceSpec.fwd_overhead_s``/``bwd_overhead_s``) and its
boundary messages (one per transfer and direction, ``latency + bytes / bandwidth`` each). When
its own compute is smaller than that price, running it elsewhere can only lose: the piece moves
to the device of the neighbour it exchanges the most bytes with, and its messages to that
neighbour vanish. This is ParDNN's "merge light nodes into their heaviest neighbour" step
(ParDNN, slicing phase) applied by cost rather than by module depth, repeated until no piece
is too small; memory is not checked here (callers check the result, e.g. ``search.fits``).
"""

from __future__ import annotations

import numpy as np

from outcore.graph.ir import Graph
from outcore.hardware.spec import Cluster
from outcore.placers._jit import njit_borrowing
from outcore.placers._move_kernel import row_marked
from outcore.plan.pieces import cut

__all__ = ["merge_small_pieces"]

# rounds in a row that may start with no fewer small pieces than the best round before the
# merge stops (a placement that scatters thousands of tiny pieces over the devices, as a
# replicated base can be, made 4 to 30 new small pieces for every 15 to 30 it merged, for all
# 64 rounds: 3.7 s on a 10k-node RNN grid)
STALL_ROUNDS = 4


def _prices_s(pieces, cluster: Cluster, scale: float) -> np.ndarray:
    """Per piece, its fixed runtime cost per micro-batch: its overheads and its messages (each
    remote transfer's link time, forward and backward), summed in transfer order."""
    d = cluster.device
    n = pieces.num_pieces
    src, dst = pieces.transfer_pieces
    dev = pieces.device_of
    a, b = dev[src], dev[dst]
    remote = np.flatnonzero(a != b)
    nbytes = pieces.transfer_bytes[remote].astype(np.float64) * scale
    # each end pays its side's link
    sent = cluster.link_times(a[remote], b[remote], nbytes)
    received = cluster.link_times(b[remote], a[remote], nbytes)
    return d.fwd_overhead_s + d.bwd_overhead_s + \
        2.0 * np.bincount(src[remote], weights=sent, minlength=n) + \
        2.0 * np.bincount(dst[remote], weights=received, minlength=n)


def _touching(pieces, p: int) -> list[int]:
    """The transfers into ``p``, then those out of it (ids ascending in each)."""
    (ip, ii), (op, oi) = pieces.inputs_csr, pieces.outputs_csr
    return ii[ip[p]:ip[p + 1]].tolist() + oi[op[p]:op[p + 1]].tolist()


def _best_neighbour(pieces, p: int) -> int | None:
    """The device of the remote neighbour ``p`` exchanges the most bytes with."""
    device, src, dst = pieces.device_of, pieces.transfer_src, pieces.transfer_dst
    dev = int(device[p])
    volume: dict[int, float] = {}
    for tid in _touching(pieces, p):
        other = int(device[dst[tid] if src[tid] == p else src[tid]])
        if other != dev:  # +1: ties by count
            volume[other] = volume.get(other, 0.0) + int(pieces.transfer_bytes[tid]) + 1.0
    return max(volume, key=lambda k: (volume[k], -k)) if volume else None


def merge_small_pieces(g: Graph, assignment: np.ndarray, cluster: Cluster, *,
                       scale: float = 1.0, factor: float = 1.0,
                       max_rounds: int = 64) -> np.ndarray:
    """``assignment`` with every piece whose compute is below ``factor`` times its fixed
    runtime price moved to its heaviest remote neighbour's device.

    Args:
        scale: micro-batch size over the graph's batch (node costs and bytes scale by it).
        factor: how many times its price a piece's compute must be to stay apart.
        max_rounds: re-cuts at most (each round moves a set of non-adjacent pieces).

    A piece whose best neighbour is a device its nodes have left (it moved there, stayed
    small and apart, and would swing back and forth every round) goes back and stays there.
    The rounds stop once :data:`STALL_ROUNDS` in a row begin with no fewer small pieces than
    the best round before them.
    """
    a = np.asarray(assignment, dtype=np.int64).copy()
    k = int(a.max()) + 1 if a.size else 1  # moves only go to devices the placement uses
    left = np.zeros((g.num_nodes, -(-k // _BITS)), np.int64)  # node -> devices it has left
    settled = np.zeros(g.num_nodes, dtype=np.bool_)  # returned to a device it had left: stays
    for pieces, comp, small in _rounds(g, a, cluster, scale, factor, max_rounds):
        (ip, ii), (op, oi) = pieces.inputs_csr, pieces.outputs_csr
        moved = _merge_round(np.argsort(comp, kind="stable"), small, pieces.node_ptr,
                             pieces.node_idx, pieces.device_of, ip, ii, op, oi,
                             pieces.transfer_src, pieces.transfer_dst, pieces.transfer_bytes,
                             a, settled, left, np.zeros(pieces.num_pieces, np.bool_),
                             np.zeros(k))
        if not moved:
            break
    return a


def _rounds(g: Graph, a: np.ndarray, cluster: Cluster, scale: float, factor: float,
            max_rounds: int):
    """Each round's ``(pieces of a, their compute, which are small)``, ``a`` as the caller has
    moved it since; ends after ``max_rounds`` or once :data:`STALL_ROUNDS` rounds in a row
    begin with no fewer small pieces than the best round before them (the caller stops when a
    round moves nothing)."""
    work = (np.asarray(g.fwd_s, dtype=np.float64) + np.asarray(g.bwd_s, dtype=np.float64))
    fewest, stalled = g.num_nodes + 1, 0  # the fewest small pieces a round began with
    for _ in range(max_rounds):
        pieces = cut(g, a)
        comp = np.bincount(pieces.piece_of, weights=work, minlength=pieces.num_pieces) * scale
        small = comp < factor * _prices_s(pieces, cluster, scale)
        if small.sum() < fewest:
            fewest, stalled = int(small.sum()), 0
        else:  # moves that only make other pieces small: a placement of many tiny pieces
            stalled += 1
            if stalled >= STALL_ROUNDS:
                return
        yield pieces, comp, small


_BITS = 62  # devices per int64 word of the "left" sets


@njit_borrowing
def _merge_round(order, small, node_ptr, node_idx, device_of, ip, ii, op, oi, tsrc, tdst, tbytes,
                 a, settled, left, touched, volume):
    """One round of :func:`merge_small_pieces` over the pieces in ``order``: each small piece
    not next to one moved this round, none of whose nodes has settled, moves to the device of
    the remote neighbour it exchanges the most bytes with (+1 per transfer: ties by count; then
    the lowest device). Updates ``a``, ``settled``, ``left`` (bit sets of the devices each node
    has left); ``touched``, ``volume``: zeros, scratch. Returns whether anything moved."""
    moved = False
    for t in range(order.shape[0]):
        p = order[t]
        if touched[p] or not small[p] or row_marked(node_ptr, node_idx, p, settled):
            continue
        dev = device_of[p]
        for side in range(2):  # the transfers into p, then those out of it
            ptr, ids = (ip, ii) if side == 0 else (op, oi)
            for j in range(ptr[p], ptr[p + 1]):
                tid = ids[j]
                other = device_of[tdst[tid]] if tsrc[tid] == p else device_of[tsrc[tid]]
                if other != dev:
                    volume[other] = (volume[other] + float(tbytes[tid])) + 1.0
        best = -1
        for x in range(volume.shape[0]):
            if volume[x] > 0.0 and (best < 0 or volume[x] > volume[best]):
                best = x
        for x in range(volume.shape[0]):
            volume[x] = 0.0
        if best < 0:
            continue
        back = False
        for j in range(node_ptr[p], node_ptr[p + 1]):
            if (left[node_idx[j], best // _BITS] >> (best % _BITS)) & 1:
                back = True
                break
        for j in range(node_ptr[p], node_ptr[p + 1]):
            v = node_idx[j]
            if back:
                settled[v] = True
            else:
                left[v, dev // _BITS] |= 1 << (dev % _BITS)
            a[v] = best
        moved = True
        touched[p] = True
        for side in range(2):
            ptr, ids = (ip, ii) if side == 0 else (op, oi)
            for j in range(ptr[p], ptr[p + 1]):
                touched[tsrc[ids[j]]] = True
                touched[tdst[ids[j]]] = True
    return moved


def _merge_small_pieces_py(g: Graph, assignment: np.ndarray, cluster: Cluster, *,
                           scale: float = 1.0, factor: float = 1.0,
                           max_rounds: int = 64) -> np.ndarray:
    """:func:`merge_small_pieces` one piece at a time in Python: the reference its compiled
    rounds are held to (``tests/placers/test_granularity.py``)."""
    a = np.asarray(assignment, dtype=np.int64).copy()
    left: dict[int, set[int]] = {}  # node -> devices it has left
    settled = np.zeros(g.num_nodes, dtype=bool)  # returned to a device it had left: stays
    for pieces, comp, small in _rounds(g, a, cluster, scale, factor, max_rounds):
        touched: set[int] = set()
        moved = False
        for p in np.argsort(comp, kind="stable").tolist():
            if p in touched or not small[p]:
                continue
            nodes = pieces.nodes_of(p).tolist()
            if settled[nodes].any():
                continue
            dev = _best_neighbour(pieces, p)
            if dev is None:
                continue
            if any(dev in left.get(v, ()) for v in nodes):
                settled[nodes] = True
            else:
                for v in nodes:
                    left.setdefault(v, set()).add(int(pieces.device_of[p]))
            a[nodes] = dev
            moved = True
            touched.add(p)
            for tid in _touching(pieces, p):
                touched.update((int(pieces.transfer_src[tid]), int(pieces.transfer_dst[tid])))
        if not moved:
            break
    return a
