"""Contiguous splits: the simple plans every search must beat (no torch).

A contiguous split cuts one topological order of the graph into K consecutive parts. It is what a
user would do by hand, and on chains and long-skip graphs (U-Nets) it is hard to beat; a planner
that returns something slower, or says nothing fits when such a split does, is wrong. This module
makes those splits for several orders and balance criteria, so the search always has them:

* orders: the graph's own topological order; **depth-first** (Kahn's algorithm taking the most
  recently readied node first: a branch is finished before the next starts, so RNN grids are cut
  by layer); **breadth-first** (by level: longest path from a source, so RNN grids are cut by time
  step);
* balance: equal **memory** (training state of the parameters plus the micro-batches' saved
  activations, the memory model of :mod:`outcore.placers.context`) or equal **time** (forward +
  backward);
* device counts: K and the counts ParDNN tries below it
  (:func:`~outcore.placers.stages.device_counts`);
* each cut also once more only where it splits no shared parameter (the weight an unrolled RNN
  layer reads at every time step), with the heaviest part as light as it can be.

Each split is emulated and checked against the memory limit (:func:`result.evaluate`); the
fastest that fits is the strategy's plan.
"""

from __future__ import annotations

import numpy as np

from outcore.graph.algorithms import depth_levels
from outcore.graph.ir import memo
from outcore.placers._jit import njit
from outcore.placers.context import Context
from outcore.placers.feasibility import holds_floor
from outcore.placers.registry import Placement, Placer
from outcore.placers.result import Candidate, best_of, evaluate
from outcore.placers.stages import device_counts

__all__ = ["breadth_first_order", "depth_first_order", "plan", "shared_split", "split"]

# above this many nodes only the graph's own order is tried (each split is one emulation)
LARGE_GRAPH_NODES = 250_000


def _per_structure(ctx: Context, name: str, make) -> np.ndarray:
    """A copy of ``make(ctx)``, made once per graph structure (an order depends on the edges
    alone, and the layout search plans a graph's copies rescaled to each micro-batch size; two
    threads may both make it: the same order)."""
    made = memo(ctx.g.structure, "orders")
    if name not in made:
        made[name] = make(ctx)
    return made[name].copy()


def depth_first_order(ctx: Context) -> np.ndarray:
    """A topological order that finishes the newest ready branch first (LIFO Kahn; ties:
    lowest index). Made once per graph structure."""
    return _per_structure(ctx, "depth-first", _depth_first)


def _depth_first(ctx: Context) -> np.ndarray:
    g = ctx.g
    ptr = np.ascontiguousarray(g.succ_ptr, dtype=np.int64)
    idx = np.ascontiguousarray(g.succ_idx, dtype=np.int64)
    widest = int(np.diff(ptr).max()) if g.num_nodes else 0
    return _lifo_kahn(g.in_degree.astype(np.int64), ptr, idx, max(widest, 1))


@njit
def _lifo_kahn(indeg: np.ndarray, ptr: np.ndarray, idx: np.ndarray, widest: int) -> np.ndarray:
    """Kahn's algorithm with a stack: the newly ready successors of a node go on top, the
    lowest index last (popped first); ``indeg`` is consumed."""
    n = indeg.shape[0]
    stack = np.empty(n, np.int64)
    top = 0
    for v in range(n - 1, -1, -1):  # sources, the lowest on top
        if indeg[v] == 0:
            stack[top] = v
            top += 1
    out = np.empty(n, np.int64)
    ready = np.empty(widest, np.int64)
    k = 0
    while top > 0:
        top -= 1
        v = stack[top]
        out[k] = v
        k += 1
        r = 0
        for j in range(ptr[v], ptr[v + 1]):
            w = idx[j]
            indeg[w] -= 1
            if indeg[w] == 0:
                ready[r] = w
                r += 1
        ready[:r].sort()
        for i in range(r - 1, -1, -1):
            stack[top] = ready[i]
            top += 1
    return out[:k]


def breadth_first_order(ctx: Context) -> np.ndarray:
    """Nodes by level (longest path from a source, in edges), then by topological rank. Made
    once per graph structure."""
    return _per_structure(ctx, "breadth-first", lambda c: np.lexsort(
        (c.rank, depth_levels(c.g, c.order))).astype(np.int64))


def split(order: np.ndarray, weight: np.ndarray, parts: int) -> np.ndarray:
    """Device of every node: ``order`` cut into ``parts`` consecutive runs of near-equal total
    ``weight`` (each node goes to the part holding the middle of its weight)."""
    n = order.size
    a = np.empty(n, np.int64)
    w = np.asarray(weight, dtype=np.float64)[order]
    total = float(w.sum())
    if total <= 0 or parts <= 1:
        a[order] = np.minimum((np.arange(n) * parts) // max(n, 1), parts - 1)
        return a
    mid = np.cumsum(w) - 0.5 * w
    a[order] = np.minimum((mid / total * parts).astype(np.int64), parts - 1)
    return a


def shared_split(ctx: Context, order: np.ndarray, weight: np.ndarray, parts: int
                 ) -> np.ndarray | None:
    """``order`` cut into at most ``parts`` consecutive runs, only where the fewest shared
    parameters have consumers on both sides, with the heaviest run as light as it can be.

    A parameter read by many nodes (the weight of an unrolled RNN layer, read at every time
    step) is a unit the plain cut should not split: cutting mid-layer puts the layer's later
    time steps on the next device, which then waits for the first device's whole layer instead
    of streaming step by step. None when no parameter is shared, or every position splits as
    many (then this is :func:`split`)."""
    g = ctx.g
    shared = g.nodes_with_op("param")
    n = order.size
    if shared.size == 0 or parts <= 1 or n < 2:
        return None
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    e = np.flatnonzero(np.isin(g.src, shared))
    if e.size == 0:
        return None
    first = np.full(n, n, np.int64)
    last = np.full(n, -1, np.int64)
    np.minimum.at(first, g.src[e], pos[g.dst[e]])
    np.maximum.at(last, g.src[e], pos[g.dst[e]])
    many = np.flatnonzero(last > first)
    if many.size == 0:
        return None
    # a cut at c (between positions c - 1 and c) splits a parameter read in (first, last]
    open_ = np.zeros(n + 1, np.int64)
    np.add.at(open_, first[many] + 1, 1)
    np.add.at(open_, last[many] + 1, -1)
    open_ = np.cumsum(open_)[1:n]
    allowed = np.flatnonzero(open_ == open_.min()) + 1
    if allowed.size == n - 1:
        return None
    w = np.asarray(weight, dtype=np.float64)[order]
    prefix = np.concatenate(([0.0], np.cumsum(w)))
    bounds = np.concatenate(([0], allowed, [n]))
    cuts = _min_max_cuts(prefix[bounds], parts)
    a = np.empty(n, np.int64)
    a[order] = np.repeat(np.arange(len(cuts) - 1), np.diff(bounds[cuts]))
    return a


def _min_max_cuts(prefix: np.ndarray, parts: int) -> np.ndarray:
    """Indices into the increasing ``prefix`` sums (first 0, last the total) of the cuts into
    at most ``parts`` runs whose largest sum is least (bisection on that sum, greedy runs)."""
    def greedy(cap: float) -> np.ndarray | None:
        cuts = [0]
        while cuts[-1] < prefix.size - 1 and len(cuts) <= parts:
            j = int(np.searchsorted(prefix, prefix[cuts[-1]] + cap, side="right")) - 1
            if j <= cuts[-1]:
                return None
            cuts.append(j)
        return np.array(cuts) if cuts[-1] == prefix.size - 1 else None

    lo, hi = float(prefix[-1]) / parts, float(prefix[-1])
    best = greedy(hi)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        got = greedy(mid)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
        if hi - lo <= 1e-6 * hi:
            break
    assert best is not None  # one run per cut under the total: greedy(total) always cuts
    return best


def _weights(ctx: Context) -> dict[str, np.ndarray]:
    g = ctx.g
    memory = (g.param_bytes.astype(np.float64) * float(ctx.factor)
              + float(ctx.microbatches) * g.saved_bytes.astype(np.float64))
    return {"memory": memory, "time": ctx.work_s}


def _orders(ctx: Context) -> dict[str, np.ndarray]:
    orders = {"topological": ctx.order}
    if ctx.g.num_nodes <= LARGE_GRAPH_NODES:
        orders["depth-first"] = depth_first_order(ctx)
        orders["breadth-first"] = breadth_first_order(ctx)
    return orders


def trivial_labels(devices: int) -> tuple[str, ...]:
    """Labels of the plain topological order cut into ``devices`` parts by memory and by
    time (:func:`plan` names its splits so)."""
    return tuple(_label("topological", w, devices) for w in ("memory", "time"))


def _label(order: str, weight: str, devices: int) -> str:
    return f"{order} order, equal {weight}, {devices} devices"


def plan(ctx: Context) -> tuple[Candidate | None, list[str], list[Candidate]]:
    """The fastest contiguous split that fits, the notes, and every split tried."""
    cands: list[Candidate] = []
    seen: set[bytes] = set()
    # device counts that cannot hold the graph's memory floor are not split
    counts = [k for k in device_counts(ctx.devices) if k == 1 or holds_floor(ctx, k)]
    for oname, order in _orders(ctx).items():
        for wname, weight in _weights(ctx).items():
            for k in counts:
                for label, a in ((_label(oname, wname, k), split(order, weight, k)),
                                 (_label(oname, wname, k) + ", shared parameters kept whole",
                                  shared_split(ctx, order, weight, k))):
                    if a is None or a.tobytes() in seen:
                        continue
                    seen.add(a.tobytes())
                    cands.append(evaluate(ctx.with_devices(k) if k < ctx.devices else ctx, a,
                                          label))
    best = best_of(cands)
    fitting = sum(c.fits for c in cands)
    notes = [f"{len(cands)} contiguous splits, {fitting} fit"]
    if best is not None:
        notes.append(f"chose {best.label}")
    return best, notes, cands


# contiguous splits the search simulates: the fastest this many by the emulator, and the plain
# topological order cut by memory and by time on all devices
OFFERED = 4


class Contiguous(Placer):
    """The ``contiguous`` placer (module docstring)."""

    name = "contiguous"
    summary = ("the simple plans: one topological order (as given, depth-first or "
               "breadth-first) cut into consecutive parts of equal memory or equal time; the "
               "fastest that fits")
    in_auto = True
    always_simulated = True

    def place(self, ctx: Context, seed: int) -> Placement:
        return Placement(*plan(ctx))

    def offers(self, ctx: Context, placed: Placement) -> list[tuple[Candidate, list[str]]]:
        """The :data:`OFFERED` fastest splits that fit (by the emulator), fastest first, and
        the plain topological order cut by memory and by time on all devices: the trivial
        splits the search must never lose to, whatever the emulator thinks of them (on a
        100k-node RNN grid it ranked the memory cut 5th where the simulator found it the
        fastest)."""
        fitting = sorted((c for c in placed.considered if c.fits), key=lambda c: c.makespan_s)
        plain = trivial_labels(ctx.devices)
        trivial = [c for c in fitting[OFFERED:] if c.label in plain]
        return [(c, placed.notes[:1] + [f"chose {c.label}"])
                for c in fitting[:OFFERED] + trivial]
