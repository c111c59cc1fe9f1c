"""ParDNN step 1a, *slicing*: primary and secondary clusters along critical paths.

Qararyah et al. 2021, section 4.1 ("Graph slicing"): the graph is cut into K *primary* clusters,
the successive critical paths of the graph (the first is the longest source-to-sink path; each
next one is the longest path of what remains), and many small *secondary* clusters, linear paths
through the rest, which step 1b maps onto the primaries.

Weights: a node weighs its forward + backward time (a node and its backward are one unit of
placement in PyTorch); an edge weighs the transfer of its tensor and of its gradient
(:attr:`outcore.placers.context.Context.comm_s`).

Departures from the reference code (``shared/notes/pardnn-algorithm.md`` 1.1), all deliberate:
a zero-weight node is clustered like any other (the reference leaves it unassigned and crashes);
graphs with fewer than K paths yield fewer primaries (the reference crashes); a secondary walk
follows the heaviest *unclustered* child, so secondaries are maximal linear paths (the
reference stops at the first clustered heaviest child, leaving 1.4-1.8-node clusters); heads are
taken in (weighted level desc, top level asc, index asc) order, so ties never depend on input
order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from outcore.graph.level_kernel import bottom_levels, top_levels
from outcore.placers._jit import njit
from outcore.placers.context import Context


@dataclass(frozen=True, eq=False)
class Slices:
    """The result of slicing.

    Attributes:
        part: ``int64[n]`` primary cluster of each node, -1 for nodes in secondaries.
        primaries: number of primary clusters (<= K; fewer when the graph has fewer paths).
        sec_of: ``int64[n]`` secondary cluster of each node, -1 for primary nodes.
        sec_ptr, sec_nodes: CSR of secondary clusters; each lists its path from head to tail.
            Clusters are numbered in extraction order (most critical first).
        tl_s, bl_s: clustered top and bottom levels after the primaries (seconds).
    """

    part: np.ndarray
    primaries: int
    sec_of: np.ndarray
    sec_ptr: np.ndarray
    sec_nodes: np.ndarray
    tl_s: np.ndarray
    bl_s: np.ndarray

    @property
    def num_secondaries(self) -> int:
        return int(self.sec_ptr.shape[0] - 1)


def slice_graph(ctx: Context, k: int) -> Slices:
    """Slice ``ctx.g`` into at most ``k`` primary clusters and secondary paths (section 4.1)."""
    g = ctx.g
    n = g.num_nodes
    order = ctx.order
    w = ctx.work_s
    ecost = ctx.comm_s
    part, nprim = _primaries(k, order, g.succ_ptr, g.succ_idx, g.succ_edge, w, ecost)
    active = np.ones(n, np.bool_)
    tl = top_levels(order, g.pred_ptr, g.pred_idx, g.pred_edge, w, ecost, part, active)
    bl = bottom_levels(order, g.succ_ptr, g.succ_idx, g.succ_edge, w, ecost, part, active)
    free = np.flatnonzero(part < 0)
    prio = free[np.lexsort((free, tl[free], -(tl[free] + bl[free])))]
    sec_of, sec_nodes, sec_ptr = _secondaries(prio, g.succ_ptr, g.succ_idx, g.succ_edge, ecost,
                                              bl, part)
    return Slices(part, int(nprim), sec_of, sec_ptr, sec_nodes, tl, bl)


@njit
def _primaries(k, order, succ_ptr, succ_idx, succ_edge, w, ecost):
    """Extract up to ``k`` successive critical paths; return (part, number extracted)."""
    n = order.shape[0]
    part = np.full(n, -1, np.int64)
    active = np.ones(n, np.bool_)
    left = n
    nprim = 0
    for p in range(k):
        if left == 0:
            break
        # bottom levels of the remaining (unclustered) graph; every edge between two
        # remaining nodes counts its communication ("unclustered" levels)
        bl = bottom_levels(order, succ_ptr, succ_idx, succ_edge, w, ecost, part, active)
        head = -1
        best = -1.0
        for i in range(n):  # heaviest remaining path head; ties: earliest in program order
            v = order[i]
            if active[v] and bl[v] > best:
                best = bl[v]
                head = v
        v = head
        while v >= 0:
            part[v] = p
            active[v] = False
            left -= 1
            nxt = -1
            nbest = -1.0
            for e in range(succ_ptr[v], succ_ptr[v + 1]):
                s = succ_idx[e]
                if active[s]:
                    val = ecost[succ_edge[e]] + bl[s]
                    if val > nbest or (val == nbest and s < nxt):
                        nbest = val
                        nxt = s
            v = nxt
        nprim += 1
    return part, nprim


@njit
def _secondaries(prio, succ_ptr, succ_idx, succ_edge, ecost, bl, part):
    """Walk linear paths from heads taken in ``prio`` order through unclustered nodes."""
    n = part.shape[0]
    m_total = prio.shape[0]
    sec_of = np.full(n, -1, np.int64)
    nodes = np.empty(m_total, np.int64)
    ptr = np.zeros(m_total + 1, np.int64)
    nsec = 0
    m = 0
    for i in range(m_total):
        v = prio[i]
        if sec_of[v] >= 0:
            continue
        ptr[nsec] = m
        while v >= 0:
            sec_of[v] = nsec
            nodes[m] = v
            m += 1
            nxt = -1
            nbest = -1.0
            for e in range(succ_ptr[v], succ_ptr[v + 1]):
                s = succ_idx[e]
                if part[s] < 0 and sec_of[s] < 0:
                    val = ecost[succ_edge[e]] + bl[s]
                    if val > nbest or (val == nbest and s < nxt):
                        nbest = val
                        nxt = s
            v = nxt
        nsec += 1
    ptr[nsec] = m
    return sec_of, nodes, ptr[:nsec + 1].copy()
