"""The pipeline planner and the baselines on hand-checked graphs."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from outcore.errors import InfeasibleError
from outcore.graph.ir import build
from outcore.placers import partition
from outcore.placers.context import make_context
from outcore.placers.stages import fewest_stages, least_memory, stage_bounds


def chain(fwd, **kw):
    n = len(fwd)
    kw.setdefault("edge_bytes", [0] * (n - 1))
    return build("chain", fwd_s=fwd, src=list(range(n - 1)), dst=list(range(1, n)), **kw)


def test_stages_balance_the_bottleneck_with_uneven_sizes():
    # work (forward + backward) per node: 3 3 3 18 3 3 3; the heavy node gets its own stage
    g = chain([1, 1, 1, 6, 1, 1, 1])
    bounds = stage_bounds(make_context(g, 3), 3)
    assert bounds.tolist() == [3, 4, 7]


@pytest.mark.parametrize("family", ["rnn", "nas", "unet", "transformer"])
@pytest.mark.parametrize("share", [None, 1.3])
def test_stage_bounds_shortcuts_find_the_split_plain_bisection_finds(family, share):
    """``stage_bounds`` drops to each split's slowest stage and probes just under its best:
    the split a plain bisection to 1e-9 finds, in fewer greedy runs."""
    from outcore.graph.generators import make
    from outcore.placers.stages import _arrays, _greedy

    g = make(family, 600)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, np.int64)).max())
    for k in (2, 3, 4):
        for inflight, mode in (("1f1b", 0), ("all", 1)):
            ctx = make_context(g, k, memory_bytes=None if share is None else share * one / k,
                               microbatches=2)
            arrs, limit = _arrays(ctx), -1.0 if share is None else float(ctx.memory_bytes)
            out, seen, slowest = np.zeros(k, np.int64), np.full(g.num_nodes, -1), np.zeros(1)

            def fits(t):
                return _greedy(t, k, mode, limit, 2, *arrs, out, seen, slowest)

            hi = float(arrs[2].sum() + 2.0 * arrs[3].max()) * (1 + 1e-9) + 1e-12
            got = stage_bounds(ctx, k, inflight=inflight)
            if fits(hi) < 0:
                assert got is None
                continue
            lo = 0.0
            for _ in range(64):  # the bisection as it was before the shortcuts
                mid = 0.5 * (lo + hi)
                lo, hi = (lo, mid) if fits(mid) >= 0 else (mid, hi)
                if hi - lo <= 1e-9 * hi:
                    break
            used = fits(hi)
            assert got.tolist() == out[:used].tolist()


def test_pipeline_memory_counts_1f1b_micro_batches_in_flight():
    # saved 100 bytes per node; with 4 micro-batches stage 0 of 2 keeps 2, stage 1 keeps 1
    g = chain([1, 1, 1, 1], saved_bytes=[100] * 4, out_bytes=[0] * 4)
    r = partition(g, 2, strategy="pipeline", memory_bytes=300, microbatches=4)
    assert r.assignment.tolist() == [0, 1, 1, 1]
    assert r.peak_bytes.tolist() == [200, 300]
    r2 = partition(g, 2, strategy="pipeline", memory_bytes=400, microbatches=4)
    assert r2.assignment.tolist() == [0, 0, 1, 1] and r2.peak_bytes.tolist() == [400, 200]


def test_pipeline_uses_fewer_stages_when_that_is_faster():
    g = chain([1, 1, 1, 1], edge_bytes=[10**9] * 3)
    r = partition(g, 4, strategy="pipeline")
    assert r.devices_used == 1 and r.makespan_s == pytest.approx(12.0)


def test_fewest_stages_and_least_memory():
    g = chain([1] * 6, param_bytes=[100] * 6, saved_bytes=[0] * 6, out_bytes=[0] * 6)
    ctx = make_context(g, 2, memory_bytes=800)  # 400 bytes per node with Adam
    assert fewest_stages(ctx) == 3
    assert least_memory(ctx, 2) == pytest.approx(1200, abs=2)
    assert stage_bounds(make_context(g, 2, memory_bytes=800), 2) is None


def test_round_robin_and_chunks_are_exact():
    g = chain([1] * 7)
    rr = partition(g, 3, strategy="round-robin")
    assert rr.assignment.tolist() == [0, 1, 2, 0, 1, 2, 0]
    ch = partition(g, 3, strategy="chunks")
    assert ch.assignment.tolist() == [0, 0, 0, 1, 1, 2, 2]


def test_heft_spreads_independent_work_and_respects_memory():
    g = build("two", fwd_s=[1, 1, 1, 1], src=[0, 2], dst=[1, 3], edge_bytes=[8, 8])
    r = partition(g, 2, strategy="heft")
    assert r.makespan_s == pytest.approx(6.0) and r.devices_used == 2
    g2 = g.replace(param_bytes=np.array([100, 100, 100, 100]))
    # two nodes of a chain on one device: 2 x 400 params + 8 saved + 8 transient = 816 bytes
    r2 = partition(g2, 2, strategy="heft", memory_bytes=816)
    assert (r2.peak_bytes <= 816).all() and r2.makespan_s == pytest.approx(6.0)


def test_baseline_that_does_not_fit_raises_with_the_fix():
    g = chain([1] * 4, param_bytes=[100, 100, 100, 100], saved_bytes=[0] * 4, out_bytes=[0] * 4)
    with pytest.raises(InfeasibleError) as info:
        partition(g, 2, strategy="round-robin", memory_bytes=700)  # 400 B per node: 1 each
    assert info.value.min_devices == 4 and "strategy 'pardnn'" in str(info.value)


@pytest.mark.skipif(importlib.util.find_spec("pymetis") is None, reason="pymetis not installed")
def test_metis_cuts_between_two_clusters():
    # two 4-node cliques joined by one light edge: METIS cuts that edge
    src, dst, eb = [], [], []
    for base in (0, 4):
        for i in range(4):
            for j in range(i + 1, 4):
                src.append(base + i)
                dst.append(base + j)
                eb.append(10**6)
    src.append(3)
    dst.append(4)
    eb.append(1)
    g = build("cliques", fwd_s=[1.0] * 8, src=src, dst=dst, edge_bytes=eb)
    r = partition(g, 2, strategy="metis", seed=1)
    assert len(set(r.assignment[:4].tolist())) == 1 and len(set(r.assignment[4:].tolist())) == 1
    assert r.assignment[0] != r.assignment[4]
