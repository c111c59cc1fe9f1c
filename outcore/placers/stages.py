"""The ``pipeline`` strategy: contiguous stages over a topological order, balanced on time.

Stage ``s`` of ``S`` holds the nodes at positions ``b[s-1] .. b[s]-1`` of the program order; the
partition minimises the *bottleneck* stage (the steady-state time of a 1F1B pipeline per
micro-batch), as torchgpipe's ``balance.blockpartition`` does, by binary search on the bottleneck
``T`` with a greedy that gives each stage the longest prefix that fits ``T`` and the memory limit.
Stage sizes come out uneven wherever that is faster (heavy layers get short stages).

Stage time = forward + backward work of its nodes + the transfers at its two boundaries (bytes
crossing the cut before and after it, forward tensors and gradients, mean link), not overlapped
with compute. Stage memory = the model of :mod:`outcore.placers.context` with 1F1B's micro-batches
in flight: stage ``s`` of ``S`` keeps activations of up to ``min(M, S - s)`` micro-batches (the
first stage the most). The greedy uses ``S = K`` for the in-flight counts, an upper bound when
fewer stages are used; received tensors are counted at their producer's largest output.
"""

from __future__ import annotations

import numpy as np

from outcore.graph.ir import memo
from outcore.placers._jit import njit_borrowing
from outcore.placers.context import Context

# :func:`stage_bounds` probes just under its best bottleneck once the bisection's interval is
# within this fraction of it
PROBE_WITHIN = 1e-3


def device_counts(k: int) -> list[int]:
    """Device counts ParDNN tries for a request of ``k``: k, then powers of two below, then 1."""
    ks = {k, 1}
    c = 2
    while c < k:
        ks.add(c)
        c *= 2
    return sorted(ks, reverse=True)


def cut_comm_s(ctx: Context) -> np.ndarray:
    """``float64[n]``: forward + backward transfer seconds of the cut after each position."""
    g = ctx.g
    n = g.num_nodes
    if n == 0 or g.num_edges == 0 or ctx.devices < 2:
        return np.zeros(max(n, 0))
    rank = ctx.rank
    diff = np.zeros(n + 1)
    eb = g.edge_bytes.astype(np.float64)
    np.add.at(diff, rank[g.src], eb)
    np.add.at(diff, rank[g.dst], -eb)
    crossing = np.cumsum(diff)[:n]
    off = ~np.eye(ctx.devices, dtype=bool)
    lat = float(ctx.lat_s[off].mean())
    inv = float(ctx.inv_bw[off].mean())
    return np.where(crossing > 0.5, 2.0 * (lat + crossing * inv), 0.0)


def _arrays(ctx: Context) -> tuple:
    g = ctx.g
    umax = np.zeros(g.num_nodes)
    if g.num_edges:
        np.maximum.at(umax, g.src, g.edge_bytes.astype(np.float64))
    return (ctx.order, ctx.rank, ctx.work_s * ctx.microbatches, cut_comm_s(ctx),
            g.param_bytes * float(ctx.factor), g.saved_bytes.astype(np.float64),
            g.out_bytes.astype(np.float64), umax, g.pred_ptr, g.pred_idx)


def stage_bounds(ctx: Context, stages: int, *, inflight: str = "1f1b") -> np.ndarray | None:
    """End positions (exclusive) of at most ``stages`` stages with the least bottleneck.

    ``inflight`` is ``"1f1b"`` (stage s keeps min(M, S - s) micro-batches) or ``"all"`` (every
    stage keeps M, the GPipe/ParDNN model). Returns None when no split fits the memory limit.
    Remembered per graph for the same context (devices, limit, micro-batches, links): the
    planners ask for the same splits (pardnn's and subgraph's seeds, the pipeline planner's,
    subgraph's stages: 27 calls, 21 distinct, in a 50k-node NAS graph's layout search).
    """
    key = (stages, inflight, ctx.devices, ctx.memory_bytes, ctx.microbatches, ctx.factor,
           ctx.lat_s.tobytes(), ctx.inv_bw.tobytes())
    made = memo(ctx.g, "stage bounds")
    if key not in made:  # (two threads may both find it: the same split)
        made[key] = _stage_bounds(ctx, stages, inflight)
    return None if made[key] is None else made[key].copy()


def _stage_bounds(ctx: Context, stages: int, inflight: str) -> np.ndarray | None:
    n = ctx.g.num_nodes
    if n == 0:
        return np.zeros(0, np.int64)
    arrs = _arrays(ctx)
    limit = -1.0 if ctx.memory_bytes is None else float(ctx.memory_bytes)
    mode = 0 if inflight == "1f1b" else 1
    out = np.zeros(stages, np.int64)
    seen = np.full(n, -1, np.int64)
    slowest = np.zeros(1)
    hi = float(arrs[2].sum() + 2.0 * (arrs[3].max() if n else 0.0)) * (1 + 1e-9) + 1e-12
    if _greedy(hi, stages, mode, limit, ctx.microbatches, *arrs, out, seen, slowest) < 0:
        return None
    # Bisection on the bottleneck, with two shortcuts (the same split, in fewer greedy runs):
    # the split found under a bottleneck is found again under its own slowest stage's time
    # (the greedy makes the same cuts), so the upper end drops to that time; and once the
    # interval is within PROBE_WITHIN, the next run probes just under the best time found,
    # which ends the search when it fails (the greedy's stage times are discrete). No split
    # beats the mean stage's work or the heaviest node.
    hi = slowest[0]
    lo = min(hi, max(float(arrs[2].sum()) / stages, float(arrs[2].max()))) * (1 - 1e-12)
    probed = False
    for _ in range(128):
        if hi - lo <= 1e-9 * hi:
            break
        probe = not probed and hi - lo <= PROBE_WITHIN * hi  # (after a probe that found a
        mid = hi * (1 - 1e-9) if probe else 0.5 * (lo + hi)  # faster split, bisect once)
        if _greedy(mid, stages, mode, limit, ctx.microbatches, *arrs, out, seen, slowest) >= 0:
            hi = slowest[0]
        else:
            lo = mid
        probed = probe
    used = _greedy(hi, stages, mode, limit, ctx.microbatches, *arrs, out, seen, slowest)
    return out[:used].copy()


def assignment_from_bounds(ctx: Context, bounds: np.ndarray) -> np.ndarray:
    """Device of each node: stage number of its position."""
    a = np.empty(ctx.g.num_nodes, np.int64)
    a[ctx.order] = np.searchsorted(bounds, np.arange(ctx.g.num_nodes), side="right")
    return a


def inflight_1f1b(ctx: Context, stages: int) -> np.ndarray:
    """Micro-batches in flight per stage under 1F1B: ``min(M, S - s)``."""
    return np.minimum(ctx.microbatches, stages - np.arange(stages)).astype(np.float64)


def fewest_stages(ctx: Context, *, inflight: str = "all", cap: int | None = None) -> int | None:
    """Smallest number of contiguous stages that fit the memory limit (None: none does).

    Ignores time (a memory-only greedy, optimal for contiguous splits when every stage keeps
    the same micro-batches in flight). ``cap`` bounds the search (default: number of nodes).
    """
    n = ctx.g.num_nodes
    cap = n if cap is None else min(cap, n)
    if ctx.memory_bytes is None or n == 0:
        return 1
    arrs = _arrays(ctx)
    out = np.zeros(max(cap, 1), np.int64)
    seen = np.full(n, -1, np.int64)
    slowest = np.zeros(1)
    limit = float(ctx.memory_bytes)
    if inflight == "all":
        used = _greedy(np.inf, cap, 1, limit, ctx.microbatches, *arrs, out, seen, slowest)
        return used if used >= 0 else None
    # 1F1B: in-flight counts depend on S; find the first S whose greedy fits
    s = 1
    while s <= cap:
        if _greedy(np.inf, s, 0, limit, ctx.microbatches, *arrs, out, seen, slowest) >= 0:
            return s
        s = s + 1 if s < 64 else s * 2
    return None


@njit_borrowing
def _greedy(bottleneck, stages, mode, limit, mbs, order, rank, w, ct, static, saved, out_bytes,
            umax, pred_ptr, pred_idx, bounds, seen, slowest):
    """Cut ``order`` into at most ``stages`` stages of time <= ``bottleneck`` that fit ``limit``.

    Returns the number of stages used, or -1; ``slowest[0]``: the time of its slowest stage.
    ``seen`` is scratch (per-producer stage marks).
    """
    n = order.shape[0]
    for i in range(n):
        seen[i] = -1
    i = 0
    s = 0
    slowest[0] = 0.0
    while i < n:
        if s >= stages:
            return -1
        flight = mbs
        if mode == 0 and stages - s < mbs:
            flight = stages - s
        cin = ct[i - 1] if i > 0 else 0.0
        work = 0.0
        st = 0.0
        act = 0.0
        tr = 0.0
        best = -1
        best_s = 0.0
        j = i
        while j < n:
            v = order[j]
            work += w[v]
            if work + cin > bottleneck:
                break
            st += static[v]
            act += saved[v]
            if out_bytes[v] > tr:
                tr = out_bytes[v]
            for k in range(pred_ptr[v], pred_ptr[v + 1]):
                u = pred_idx[k]
                if rank[u] < i and seen[u] != s:
                    seen[u] = s
                    act += umax[u]
            if limit >= 0.0 and st + flight * act + tr > limit:
                break
            cout = ct[j] if j < n - 1 else 0.0
            if work + cin + cout <= bottleneck:
                best = j
                best_s = work + cin + cout
            j += 1
        if best < 0:
            return -1
        if best_s > slowest[0]:
            slowest[0] = best_s
        bounds[s] = best + 1
        i = best + 1
        s += 1
    return s


def least_memory(ctx: Context, stages: int, *, inflight: str = "all") -> float | None:
    """Smallest per-device limit under which ``stages`` contiguous stages fit (bytes).

    Binary search on the limit with the memory-only greedy; None for an empty graph.
    """
    n = ctx.g.num_nodes
    if n == 0:
        return None
    arrs = _arrays(ctx)
    out = np.zeros(max(stages, 1), np.int64)
    seen = np.full(n, -1, np.int64)
    slowest = np.zeros(1)
    mode = 0 if inflight == "1f1b" else 1
    m = float(ctx.microbatches)
    hi = float(arrs[4].sum() + m * (arrs[5].sum() + arrs[7].sum()) + arrs[6].max()) + 1.0
    lo = 0.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if _greedy(np.inf, stages, mode, mid, ctx.microbatches, *arrs, out, seen, slowest) >= 0:
            hi = mid
        else:
            lo = mid
        if hi - lo <= max(1.0, 1e-6 * hi):
            break
    return hi
