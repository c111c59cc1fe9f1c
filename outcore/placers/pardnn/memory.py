"""ParDNN step 2: fit the memory limit by moving the nodes that cost least per byte freed.

Qararyah et al. 2021, section 4.2: emulate the schedule, model each device's memory over time,
and at every overflow move nodes off the device, choosing them as a 0-1 *min-knapsack*: minimise
the added communication subject to the freed bytes covering the overflow, solved greedily by cost
per byte. Re-emulate and repeat until every device fits.

In outcore's execution model the memory timeline of every device peaks at the end of the forward
(:mod:`outcore.placers.context`), so the overflow and the bytes a move frees are exact sums and
need no timeline. The greedy is *lazy*: a node's cost per byte is recomputed when it reaches the
top of the heap (moving a neighbour changes it), and the neighbours of each moved node are pushed
again, so freed regions grow contiguously instead of scattering. For node ``v`` leaving device
``d`` for device ``x``:

* bytes freed on ``d``: ``factor * param(v) + M * saved(v)``, plus every tensor ``d`` received
  only for ``v``, minus ``v``'s output if ``d`` keeps a consumer of it (``d`` must now receive it);
* bytes added on ``x``: the same static and saved bytes, plus tensors ``x`` must now receive for
  ``v``, minus ``v``'s output if ``x`` was receiving it, plus growth of ``x``'s transient buffer;
* cost: change of forward + backward communication seconds; ``x`` is the device with the lowest
  cost among those that stay within the limit (ties: most free memory, then lowest index).

Tensor sizes in this bookkeeping are each producer's largest outgoing edge (an upper bound);
after each pass the exact model is recomputed. The reference prototype's second heuristic (moving
whole forwarding paths) has no counterpart: PyTorch does not forward buffers between ops.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from outcore.graph.heap import heap_pop as _pop, heap_push as _push
from outcore.placers._jit import njit, njit_borrowing
from outcore.placers._move_kernel import edge_cost
from outcore.placers.context import Context

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RepairStats:
    passes: int
    moved_nodes: int
    fits: bool


def repair_memory(ctx: Context, assign: np.ndarray, *, max_passes: int | None = None
                  ) -> tuple[np.ndarray, RepairStats]:
    """Move nodes until every device fits ``ctx.memory_bytes``; return (assignment, stats).

    ``stats.fits`` is False when the greedy found no way to fit (the caller tries other plans).
    """
    a = np.ascontiguousarray(assign, dtype=np.int64).copy()
    limit = ctx.memory_bytes
    if limit is None:
        return a, RepairStats(0, 0, True)
    g = ctx.g
    k = ctx.devices
    passes = max_passes if max_passes is not None else 2 * k + 4
    umax = np.zeros(g.num_nodes)
    if g.num_edges:
        np.maximum.at(umax, g.src, g.edge_bytes.astype(np.float64))
    original = a.copy()
    done = 0
    parts = ctx.memory_parts(a)  # of the current assignment
    cnt = _consumer_counts(g.src, g.dst, a, g.num_nodes, k)  # _relieve keeps it so
    for _ in range(passes):
        mem = ctx.peak(parts)
        over = mem - limit
        if (over <= 0).all():
            break
        done += 1
        trans = parts[2]
        progress = False
        for d in np.argsort(-over, kind="stable").tolist():
            if over[d] <= 0:
                break
            moved = _relieve(d, float(over[d]), float(limit), a, mem.copy(), cnt, trans.copy(),
                             umax, float(ctx.factor), float(ctx.microbatches),
                             g.param_bytes.astype(np.float64), g.saved_bytes.astype(np.float64),
                             g.out_bytes.astype(np.float64), g.succ_ptr, g.succ_idx, g.succ_edge,
                             g.pred_ptr, g.pred_idx, g.pred_edge, ctx.edge_bytes, ctx.lat_s,
                             ctx.inv_bw, k)
            progress |= moved > 0
            parts = ctx.memory_parts(a)
            mem = ctx.peak(parts)
            trans = parts[2]
        if not progress:
            break
    fits = ctx.fits(ctx.peak(parts))
    moved_nodes = int((a != original).sum())
    log.debug("memory repair: %d passes, %d nodes moved, fits=%s", done, moved_nodes, fits)
    return a, RepairStats(done, moved_nodes, fits)


def _consumer_counts(src: np.ndarray, dst: np.ndarray, a: np.ndarray, n: int, k: int
                     ) -> np.ndarray:
    """``int32[n, k]``: how many out-edges of each node end on each device."""
    if not src.size:
        return np.zeros((n, k), np.int32)
    return np.bincount(src * k + a[dst], minlength=n * k).astype(np.int32).reshape(n, k)


@njit_borrowing
def _move(v, d, limit, a, mem, cnt, umax, trans, factor, mbs, param, saved, out, succ_ptr,
          succ_idx, succ_edge, pred_ptr, pred_idx, pred_edge, edge_bytes, lat, inv_bw, k, eps,
          add):
    """``(cost per byte freed, target, bytes added there, bytes freed on d)`` of the best
    move of ``v`` off ``d``, as the module docstring defines them (the cost is inf and the
    target -1 when the move frees nothing or fits nowhere). One walk of ``v``'s inputs counts
    the bytes of every device (``add``: scratch ``float[k]``)."""
    base = factor * param[v] + mbs * saved[v]
    gain = base
    for x in range(k):
        add[x] = base
    for j in range(pred_ptr[v], pred_ptr[v + 1]):
        u = pred_idx[j]
        au = a[u]
        w = mbs * umax[u]
        if au != d and cnt[u, d] == 1:
            gain += w
        for x in range(k):
            if au != x and cnt[u, x] == 0:
                add[x] += w
    if cnt[v, d] > 0:
        gain -= mbs * umax[v]
    if gain <= 0:
        return np.inf, -1, 0.0, gain
    best = -1
    best_cost = 0.0
    best_add = 0.0
    for x in range(k):
        if x == d:
            continue
        b = add[x]
        if cnt[v, x] > 0:
            b -= mbs * umax[v]
        if out[v] > trans[x]:
            b += out[v] - trans[x]
        if mem[x] + b > limit:
            continue
        cost = 0.0
        for j in range(succ_ptr[v], succ_ptr[v + 1]):
            y = a[succ_idx[j]]
            eb = edge_bytes[succ_edge[j]]
            cost += edge_cost(x, y, eb, lat, inv_bw) - edge_cost(d, y, eb, lat, inv_bw)
        for j in range(pred_ptr[v], pred_ptr[v + 1]):
            y = a[pred_idx[j]]
            eb = edge_bytes[pred_edge[j]]
            cost += edge_cost(y, x, eb, lat, inv_bw) - edge_cost(y, d, eb, lat, inv_bw)
        if (best < 0 or cost < best_cost
                or (cost == best_cost and limit - mem[x] > limit - mem[best])):
            best = x
            best_cost = cost
            best_add = b
    if best < 0:
        return np.inf, -1, 0.0, gain
    return (best_cost + eps) / gain, best, best_add, gain


# a node with more edges than this whose move's cost is already queued is not costed again
# each time a neighbour moves (the weight an unrolled RNN layer reads at every time step: one
# costing walks all its edges); its cost is checked again when it comes out of the queue
WIDE = 64


@njit
def _relieve(d, need, limit, a, mem, cnt, trans, umax, factor, mbs, param, saved, out, succ_ptr,
             succ_idx, succ_edge, pred_ptr, pred_idx, pred_edge, edge_bytes, lat, inv_bw, k):
    """Greedy min-knapsack on device ``d``: move nodes until ``need`` bytes are freed (the
    cheapest per byte first; a move re-costs its neighbours, except :data:`WIDE` ones).

    Updates ``a`` and ``cnt`` (exactly: each moved node's in-edges change device) and the
    scratch ``mem`` and ``trans`` in place; returns nodes moved.
    """
    n = a.shape[0]
    cap = 1
    for v in range(n):
        if a[v] == d:
            cap += 1 + (succ_ptr[v + 1] - succ_ptr[v]) + (pred_ptr[v + 1] - pred_ptr[v])
    keys = np.empty(cap, np.float64)
    items = np.empty(cap, np.int64)
    queued = np.zeros(n, np.int32)  # entries of each node in the heap
    add = np.empty(k, np.float64)  # scratch of _move
    size = 0
    eps = 1e-12
    for v in range(n):
        if a[v] != d:
            continue
        key = _move(v, d, limit, a, mem, cnt, umax, trans, factor, mbs, param, saved, out,
                    succ_ptr, succ_idx, succ_edge, pred_ptr, pred_idx, pred_edge, edge_bytes,
                    lat, inv_bw, k, eps, add)[0]
        if key < np.inf:
            size = _push(keys, items, size, key, v)
            queued[v] += 1
    freed = 0.0
    moved = 0
    while size > 0 and freed < need:
        key = keys[0]
        v = items[0]
        size = _pop(keys, items, size)
        queued[v] -= 1
        if a[v] != d:
            continue
        now, x, added, gain = _move(v, d, limit, a, mem, cnt, umax, trans, factor, mbs, param,
                                    saved, out, succ_ptr, succ_idx, succ_edge, pred_ptr,
                                    pred_idx, pred_edge, edge_bytes, lat, inv_bw, k, eps, add)
        if now == np.inf:
            continue
        if now > key + 1e-18 + 1e-9 * abs(key) and size < cap:
            size = _push(keys, items, size, now, v)
            queued[v] += 1
            continue
        a[v] = x
        for j in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[j]
            cnt[u, d] -= 1
            cnt[u, x] += 1
        mem[d] -= gain
        mem[x] += added
        if out[v] > trans[x]:
            trans[x] = out[v]
        freed += gain
        moved += 1
        for side in range(2):
            j0 = succ_ptr[v] if side == 0 else pred_ptr[v]
            j1 = succ_ptr[v + 1] if side == 0 else pred_ptr[v + 1]
            for j in range(j0, j1):
                y = succ_idx[j] if side == 0 else pred_idx[j]
                if a[y] != d or size >= cap:
                    continue
                if queued[y] > 0 and (succ_ptr[y + 1] - succ_ptr[y] + pred_ptr[y + 1]
                                      - pred_ptr[y]) > WIDE:
                    continue  # its key is re-checked when it is popped
                ky = _move(y, d, limit, a, mem, cnt, umax, trans, factor, mbs, param, saved,
                           out, succ_ptr, succ_idx, succ_edge, pred_ptr, pred_idx, pred_edge,
                           edge_bytes, lat, inv_bw, k, eps, add)[0]
                if ky < np.inf:
                    size = _push(keys, items, size, ky, y)
                    queued[y] += 1
    return moved
