"""Baseline placements to compare ParDNN and the pipeline planner against.

* ``round-robin``: node ``i`` of the topological order on device ``i mod K`` (what "round-robin
  by layers" means at node level: maximal spreading, maximal communication).
* ``chunks``: K contiguous chunks of equal node count over the topological order (a pipeline
  split that ignores costs).
* ``metis``: METIS k-way min-cut (``pymetis``) on the undirected graph, vertices weighted by
  forward + backward time, edges by transfer time; balanced on time, blind to memory and to the
  dependency order. Without pymetis installed it falls back to ``chunks`` balanced on time
  (a contiguous min-cut heuristic) and says so in the notes.
* ``heft``: HEFT (Topcuoglu et al. 2002) list scheduling: nodes by decreasing upward rank (bottom
  level with the mean transfer time), each on the device where it finishes earliest; a node's
  duration is forward + backward, since its backward runs on the same device. Devices that would
  exceed the memory limit (static + saved bytes) are skipped while another one has room.

Baselines never move nodes to fit memory; the entry point reports a placement that does not fit.
"""

from __future__ import annotations

import logging

import numpy as np

from outcore.graph.level_kernel import bottom_levels
from outcore.placers._jit import njit
from outcore.placers.context import Context
from outcore.placers.registry import Placement, Placer
from outcore.placers.result import evaluate

log = logging.getLogger(__name__)


def round_robin(ctx: Context) -> np.ndarray:
    """Node at position ``i`` of the topological order on device ``i mod K``."""
    a = np.empty(ctx.g.num_nodes, np.int64)
    a[ctx.order] = np.arange(ctx.g.num_nodes) % ctx.devices
    return a


def equal_chunks(ctx: Context) -> np.ndarray:
    """K contiguous chunks of (nearly) equal node count over the topological order."""
    n = ctx.g.num_nodes
    a = np.empty(n, np.int64)
    a[ctx.order] = (np.arange(n) * ctx.devices) // max(n, 1)
    return a


def time_chunks(ctx: Context) -> np.ndarray:
    """K contiguous chunks of (nearly) equal forward + backward time over the topological order."""
    n = ctx.g.num_nodes
    w = ctx.work_s[ctx.order]
    total = float(w.sum())
    a = np.empty(n, np.int64)
    if total <= 0:
        return equal_chunks(ctx)
    mid = np.cumsum(w) - 0.5 * w
    a[ctx.order] = np.minimum((mid / total * ctx.devices).astype(np.int64), ctx.devices - 1)
    return a


def metis(ctx: Context, seed: int = 0) -> tuple[np.ndarray, str]:
    """METIS k-way partition of the undirected graph; returns (assignment, note)."""
    g = ctx.g
    n, k = g.num_nodes, ctx.devices
    if k == 1 or n <= 1:
        return np.zeros(n, np.int64), "metis: one part"
    try:
        import pymetis
    except ImportError:
        return time_chunks(ctx), ("metis: pymetis is not installed (pip install pymetis); "
                                  "used contiguous chunks balanced on time instead")
    lo = np.minimum(g.src, g.dst)
    hi = np.maximum(g.src, g.dst)
    wt = ctx.comm_s
    key = lo * n + hi
    uniq, inv = np.unique(key, return_inverse=True)
    ew = np.bincount(inv, weights=wt, minlength=uniq.size)
    a_, b_ = uniq // n, uniq % n
    src = np.concatenate((a_, b_))
    dst = np.concatenate((b_, a_))
    ew2 = np.concatenate((ew, ew))
    order = np.lexsort((dst, src))
    src, dst, ew2 = src[order], dst[order], ew2[order]
    xadj = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=xadj[1:])
    scale_e = 1e4 / ew2.max() if ew2.size and ew2.max() > 0 else 1.0
    eweights = np.maximum(1, np.rint(ew2 * scale_e)).astype(np.int64)
    w = ctx.work_s
    scale_v = 1e4 / w.max() if w.max() > 0 else 1.0
    vweights = np.maximum(1, np.rint(w * scale_v)).astype(np.int64)
    opts = pymetis.Options(seed=int(seed))
    adjacency = (pymetis.CSRAdjacency(xadj, dst) if hasattr(pymetis, "CSRAdjacency")
                 else None)
    if adjacency is not None:
        _, parts = pymetis.part_graph(k, adjacency, vweights=vweights, eweights=eweights,
                                      options=opts)
    else:  # pymetis < 2025
        _, parts = pymetis.part_graph(k, xadj=xadj, adjncy=dst, vweights=vweights,
                                      eweights=eweights, options=opts)
    return np.asarray(parts, np.int64), "metis: pymetis k-way, balanced on time"


def heft(ctx: Context) -> np.ndarray:
    """HEFT list scheduling with forward + backward as one unit per node."""
    g = ctx.g
    n, k = g.num_nodes, ctx.devices
    if n == 0:
        return np.zeros(0, np.int64)
    mean_comm = ctx.comm_s * ((k - 1) / k)
    rank_up = bottom_levels(ctx.order, g.succ_ptr, g.succ_idx, g.succ_edge, ctx.work_s, mean_comm,
                            np.full(n, -1, np.int64), np.ones(n, np.bool_))
    prio = np.lexsort((ctx.rank, -rank_up))
    need = g.param_bytes * float(ctx.factor) + ctx.microbatches * g.saved_bytes.astype(np.float64)
    limit = -1.0 if ctx.memory_bytes is None else float(ctx.memory_bytes)
    return _heft(prio, g.pred_ptr, g.pred_idx, g.pred_edge, ctx.work_s, ctx.edge_bytes,
                 ctx.lat_s, ctx.inv_bw, k, need, g.out_bytes.astype(np.float64), limit)


@njit
def _heft(prio, pred_ptr, pred_idx, pred_edge, w, edge_bytes, lat, inv_bw, k, need, out, limit):
    n = prio.shape[0]
    a = np.full(n, -1, np.int64)
    fin = np.zeros(n)
    avail = np.zeros(k)
    used = np.zeros(k)
    trans = np.zeros(k)
    for i in range(n):
        v = prio[i]
        best = -1
        best_eft = 0.0
        roomy = False
        for x in range(k):
            extra = out[v] - trans[x] if out[v] > trans[x] else 0.0
            if limit < 0.0 or used[x] + need[v] + extra <= limit:
                roomy = True
                break
        for x in range(k):
            extra = out[v] - trans[x] if out[v] > trans[x] else 0.0
            if roomy and limit >= 0.0 and used[x] + need[v] + extra > limit:
                continue
            ready = 0.0
            for j in range(pred_ptr[v], pred_ptr[v + 1]):
                u = pred_idx[j]
                t = fin[u]
                eb = edge_bytes[pred_edge[j]]
                if a[u] != x and eb > 0:
                    t += 2.0 * (lat[a[u], x] + eb * inv_bw[a[u], x])
                if t > ready:
                    ready = t
            eft = (avail[x] if avail[x] > ready else ready) + w[v]
            if best < 0 or eft < best_eft:
                best = x
                best_eft = eft
        a[v] = best
        fin[v] = best_eft
        avail[best] = best_eft
        used[best] += need[v]
        if out[v] > trans[best]:
            trans[best] = out[v]
    return a


class _Baseline(Placer):
    """A baseline: one fixed placement, checked against the memory limit, never moved to fit
    it."""

    fixed = True

    def assign(self, ctx: Context, seed: int) -> tuple[np.ndarray, str]:
        """The placement and a note (empty: none)."""
        raise NotImplementedError

    def place(self, ctx: Context, seed: int) -> Placement:
        a, note = self.assign(ctx, seed)
        cand = evaluate(ctx, a, self.name)
        return Placement(cand if cand.fits else None, [note] if note else [], [cand])


class RoundRobin(_Baseline):
    name = "round-robin"
    summary = "baseline: node i of the topological order on device i mod K"

    def assign(self, ctx: Context, seed: int) -> tuple[np.ndarray, str]:
        return round_robin(ctx), ""


class Chunks(_Baseline):
    name = "chunks"
    summary = "baseline: K contiguous chunks of equal node count over the topological order"

    def assign(self, ctx: Context, seed: int) -> tuple[np.ndarray, str]:
        return equal_chunks(ctx), ""


class Metis(_Baseline):
    name = "metis"
    summary = "baseline: METIS k-way min-cut balanced on compute (needs pymetis)"

    def assign(self, ctx: Context, seed: int) -> tuple[np.ndarray, str]:
        return metis(ctx, seed)


class Heft(_Baseline):
    name = "heft"
    summary = "baseline: HEFT list scheduling (upward rank, earliest finish, backward co-located)"

    def assign(self, ctx: Context, seed: int) -> tuple[np.ndarray, str]:
        return heft(ctx), ""
