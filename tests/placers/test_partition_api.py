"""The entry point: argument errors, and properties over random DAGs (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from outcore.errors import InfeasibleError, UsageError
from outcore.graph.ir import build
from outcore.hardware.spec import flat_cluster
from outcore.placers import PartitionResult, partition, strategies
from outcore.placers.emulate import emulate


def small():
    return build("s", fwd_s=[1, 2, 3], src=[0, 0], dst=[1, 2], edge_bytes=[10, 10])


@pytest.mark.parametrize("devices", [0, -2])
def test_fewer_than_one_device_is_a_usage_error(devices):
    with pytest.raises(UsageError, match="devices"):
        partition(small(), devices)


def test_negative_memory_is_a_usage_error():
    with pytest.raises(UsageError, match="memory_bytes"):
        partition(small(), 2, memory_bytes=-5)


def test_unknown_strategy_lists_the_choices():
    with pytest.raises(UsageError, match="pardnn, pipeline"):
        partition(small(), 2, strategy="magic")


def test_strategies_have_one_line_descriptions():
    assert {"pardnn", "pipeline", "round-robin", "chunks", "metis", "heft"} <= set(strategies())
    assert all(d and "\n" not in d for d in strategies().values())


def _striped(in_auto: bool):
    """A toy placer: node i on device i mod K, as a user would write one."""
    from outcore.placers import Placement, Placer
    from outcore.placers.result import evaluate

    class Striped(Placer):
        name = "striped"
        summary = "node i on device i mod K"

        def place(self, ctx, seed):
            cand = evaluate(ctx, np.arange(ctx.g.num_nodes) % ctx.devices, "every K-th node")
            return Placement(cand if cand.fits else None, ["striped the nodes"], [cand])

    Striped.in_auto = in_auto
    return Striped


@pytest.mark.parametrize("in_auto", [False, True])
def test_a_placer_is_one_class_and_its_registration(in_auto):
    """A placer registered by name plans by that name (its placement, its notes, simulated as
    every plan is), is listed with the others, and, when ``in_auto``, is one of the placers
    ``auto`` compares; a name taken already is refused."""
    import outcore
    from outcore.graph.generators import make
    from outcore.placers import auto_placers, register, unregister
    from outcore.placers.result import compact

    g = make("transformer", 300, seed=1)
    register(_striped(in_auto))
    try:
        assert outcore.strategies()["striped"] == "node i on device i mod K"
        assert ("striped" in auto_placers()) == in_auto
        p = outcore.plan(g, 3, None, strategy="striped", microbatches=2)
        assert p.strategy == "striped" and "striped the nodes" in p.notes
        assert np.array_equal(p.assignment, compact(np.arange(g.num_nodes) % 3)[0])
        assert p.predicted["iteration_s"] == pytest.approx(outcore.simulate(p, g).iteration_s)
        auto = outcore.plan(g, 3, None, microbatches=2)
        assert any(n.startswith("striped:") for n in auto.notes) == in_auto
        with pytest.raises(UsageError, match="registered already"):
            register(_striped(in_auto))
    finally:
        unregister("striped")
    assert "striped" not in outcore.strategies()
    with pytest.raises(UsageError, match="unknown strategy 'striped'"):
        outcore.plan(g, 3, None, strategy="striped")


def test_result_fields():
    r = partition(small(), 2)
    assert isinstance(r, PartitionResult) and r.strategy == "pardnn"
    assert r.peak_bytes.shape == (r.devices_used,)
    assert r.lower_bound_s == pytest.approx(max(3.0 + 9.0, 18.0 / 2))  # path 0 -> 2
    with pytest.raises(AttributeError):
        r.strategy = "x"


@st.composite
def dags(draw):
    n = draw(st.integers(1, 14))
    fwd = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0]), min_size=n, max_size=n))
    pairs = [(i, j) for j in range(n) for i in range(j)]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=min(20, len(pairs)))
                  if pairs else st.just([]))
    chosen.sort()
    eb = draw(st.lists(st.sampled_from([0, 10**3, 10**6, 10**8]), min_size=len(chosen),
                       max_size=len(chosen)))
    params = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    saved = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    return build("h", fwd_s=fwd, src=[p[0] for p in chosen], dst=[p[1] for p in chosen],
                 edge_bytes=eb, param_bytes=params, saved_bytes=saved)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=dags(), k=st.integers(1, 4), frac=st.sampled_from([None, 0.3, 0.6, 1.5]),
       strategy=st.sampled_from(["pardnn", "pipeline"]), mbs=st.sampled_from([1, 2]))
def test_planners_place_every_node_fit_memory_and_beat_one_device(g, k, frac, strategy, mbs):
    cl = flat_cluster(k, memory_bytes=1e12, bandwidth=1e9, latency_s=1e-5)
    one = emulate(g, np.zeros(g.num_nodes, np.int64), cl, devices=k, microbatches=mbs)
    mem = None if frac is None else float(one.peak_bytes[0]) * frac
    try:
        r = partition(g, k, memory_bytes=mem, cluster=cl, strategy=strategy, microbatches=mbs)
    except InfeasibleError as e:
        assert mem is not None and mem < one.peak_bytes[0]
        if e.min_devices is not None and e.min_devices <= 16:
            cl2 = flat_cluster(e.min_devices, memory_bytes=1e12, bandwidth=1e9, latency_s=1e-5)
            r2 = partition(g, e.min_devices, memory_bytes=mem, cluster=cl2, strategy=strategy,
                           microbatches=mbs)
            assert (r2.peak_bytes <= mem).all()
        return
    a = r.assignment
    assert a.shape == (g.num_nodes,) and a.min() >= 0 and a.max() < r.devices_used <= k
    assert set(a.tolist()) == set(range(r.devices_used))
    if mem is not None:
        assert (r.peak_bytes <= mem).all()
    em = emulate(g, a, cl, devices=r.devices_used, microbatches=mbs)
    assert r.makespan_s == pytest.approx(em.makespan_s)
    if mem is None or one.peak_bytes[0] <= mem:
        assert r.makespan_s <= one.makespan_s * (1 + 1e-9)
    assert r.lower_bound_s <= r.makespan_s * (1 + 1e-9)
    again = partition(g, k, memory_bytes=mem, cluster=cl, strategy=strategy, microbatches=mbs)
    assert again.assignment.tolist() == a.tolist() and again.makespan_s == r.makespan_s
