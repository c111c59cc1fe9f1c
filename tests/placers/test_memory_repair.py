"""ParDNN's memory repair (outcore.placers.pardnn.memory): the consumer counts its greedy
keeps in place stay exact (the repair does not count them again after each relief), and a
repair that reports a fit fits."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.graph.generators import make
from outcore.placers.context import make_context
from outcore.placers.pardnn import memory as pardnn_memory


@pytest.mark.parametrize("family", ["nas", "rnn", "unet", "transformer"])
@pytest.mark.parametrize("share", [1.25, 1.6])
def test_the_counts_relief_keeps_are_the_counts_of_its_assignment(family, share, monkeypatch):
    g = make(family, 800)
    k = 3
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    ctx = make_context(g, k, memory_bytes=share * one / k)
    relieve = pardnn_memory._relieve
    checked = []

    def checking(d, need, limit, a, mem, cnt, *rest):
        moved = relieve(d, need, limit, a, mem, cnt, *rest)
        want = pardnn_memory._consumer_counts(g.src, g.dst, a, g.num_nodes, k)
        np.testing.assert_array_equal(cnt, want)
        checked.append(moved)
        return moved

    monkeypatch.setattr(pardnn_memory, "_relieve", checking)
    # every node on one device: the repair builds a split from nothing, moving many nodes
    a, stats = pardnn_memory.repair_memory(ctx, np.zeros(g.num_nodes, np.int64))
    assert sum(checked) > 10 and stats.moved_nodes > 10
    assert stats.fits == ctx.fits(ctx.memory(a))


def _reference_move(v, d, ctx, a, cnt, umax, mem, trans, limit):
    """The move of ``v`` off ``d`` as the module docstring defines it, device by device."""
    g, k = ctx.g, ctx.devices
    mbs, factor = float(ctx.microbatches), float(ctx.factor)
    preds = [int(u) for u in g.pred_idx[g.pred_ptr[v]:g.pred_ptr[v + 1]]]
    succ_edges = list(zip(g.succ_idx[g.succ_ptr[v]:g.succ_ptr[v + 1]],
                          g.succ_edge[g.succ_ptr[v]:g.succ_ptr[v + 1]]))
    pred_edges = list(zip(g.pred_idx[g.pred_ptr[v]:g.pred_ptr[v + 1]],
                          g.pred_edge[g.pred_ptr[v]:g.pred_ptr[v + 1]]))
    own = factor * g.param_bytes[v] + mbs * g.saved_bytes[v]

    def cost(x, y, eb):
        if x == y or eb <= 0:
            return 0.0
        return 2.0 * (ctx.lat_s[x, y] + eb * ctx.inv_bw[x, y])

    gain = own + sum(mbs * umax[u] for u in preds if a[u] != d and cnt[u, d] == 1)
    gain -= mbs * umax[v] if cnt[v, d] > 0 else 0.0
    if gain <= 0:
        return np.inf, -1, 0.0, gain
    best, best_cost, best_added = -1, 0.0, 0.0
    for x in range(k):
        if x == d:
            continue
        added = own + sum(mbs * umax[u] for u in preds if a[u] != x and cnt[u, x] == 0)
        added -= mbs * umax[v] if cnt[v, x] > 0 else 0.0
        added += max(g.out_bytes[v] - trans[x], 0.0)
        if mem[x] + added > limit:
            continue
        c = sum(cost(x, a[y], ctx.edge_bytes[e]) - cost(d, a[y], ctx.edge_bytes[e])
                for y, e in succ_edges)
        c += sum(cost(a[y], x, ctx.edge_bytes[e]) - cost(a[y], d, ctx.edge_bytes[e])
                 for y, e in pred_edges)
        if best < 0 or c < best_cost - 1e-18 or (abs(c - best_cost) <= 1e-18
                                                 and mem[x] < mem[best]):
            best, best_cost, best_added = x, c, added
    if best < 0:
        return np.inf, -1, 0.0, gain
    return (best_cost + 1e-12) / gain, best, best_added, gain


@pytest.mark.parametrize("family", ["nas", "unet", "rnn"])
def test_each_move_is_the_one_the_definition_picks(family):
    """``_move`` counts every device's bytes in one walk of the inputs: the cost per byte and
    the target, the bytes it adds there and frees are those of the definition, computed
    device by device."""
    g = make(family, 400)
    k = 4
    ctx = make_context(g, k)
    rng = np.random.default_rng(0)
    a = rng.integers(0, k, g.num_nodes).astype(np.int64)
    a[: g.num_nodes // 2] = 0  # long runs on one device, as repairs start from
    cnt = pardnn_memory._consumer_counts(g.src, g.dst, a, g.num_nodes, k)
    umax = np.zeros(g.num_nodes)
    np.maximum.at(umax, g.src, g.edge_bytes.astype(np.float64))
    parts = ctx.memory_parts(a)
    mem, trans = ctx.peak(parts), parts[2].copy()
    limit = float(np.sort(mem)[1]) * 1.05  # some devices can take nodes, others cannot
    scratch = np.empty(k)
    seen_targets = set()
    for v in rng.choice(g.num_nodes, 150, replace=False):
        d = int(a[v])
        key, x, added, gain = pardnn_memory._move(
            int(v), d, limit, a, mem, cnt, umax, trans, float(ctx.factor),
            float(ctx.microbatches), g.param_bytes.astype(np.float64),
            g.saved_bytes.astype(np.float64), g.out_bytes.astype(np.float64), g.succ_ptr,
            g.succ_idx, g.succ_edge, g.pred_ptr, g.pred_idx, g.pred_edge, ctx.edge_bytes,
            ctx.lat_s, ctx.inv_bw, k, 1e-12, scratch)
        want = _reference_move(int(v), d, ctx, a, cnt, umax, mem, trans, limit)
        assert x == want[1]
        assert key == pytest.approx(want[0], rel=1e-9) or key == want[0] == np.inf
        assert (added, gain) == pytest.approx(want[2:], rel=1e-9)
        seen_targets.add(x)
    assert len(seen_targets) >= 3  # moves to several devices, and none (-1), were checked
