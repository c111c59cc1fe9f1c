"""The compiled event loop (outcore.sim.compiled) returns the reference engine's timeline
(outcore.sim.engine._Engine): the same events in the same order, the same memory curves and
iteration time, exactly, over schedules, placements, links, shared host cores, GEMS replicas
and data parallelism (per piece, fused, bucketed)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import outcore
from outcore.graph import jit
from outcore.graph.generators import make
from outcore.graph.jit import HAVE_NUMBA
from outcore.plan import make_plan
from outcore.sim import simulate
from outcore.sim.compiled import simulate_compiled
from outcore.trace import EventColumns

engine = importlib.import_module("outcore.sim.engine")
sim_module = importlib.import_module("outcore.sim.simulate")

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="the compiled loop needs numba")


@pytest.fixture
def compared(monkeypatch):
    """Every simulation runs on both loops, the new one compiled (not as Python, as a small
    schedule would on a cold cache); the list collects whether they agreed."""
    monkeypatch.setattr(jit, "MODE", "always")
    seen: list[bool] = []

    def both(s, costs, cluster, options=engine.SimOptions()):
        ref = engine._Engine(s, costs, cluster, options).run()
        new = simulate_compiled(s, costs, cluster, options)
        assert isinstance(new.events, EventColumns)
        seen.append(ref.iteration_s == new.iteration_s and ref.events == new.events
                    and len(ref.memory) == len(new.memory)
                    and all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                            for a, b in zip(ref.memory, new.memory))
                    and np.array_equal(ref.busy_s(), new.busy_s())
                    and np.array_equal(ref.comm_bytes(), new.comm_bytes()))
        return ref

    monkeypatch.setattr(sim_module, "simulate_schedule", both)
    yield seen
    assert importlib.import_module("outcore.sim._engine_kernel").run_events.overloads


@pytest.mark.parametrize("family", ["rnn", "nas", "unet"])
def test_the_compiled_loop_returns_the_reference_timeline(family, compared):
    rng = np.random.default_rng(5)
    g = make(family, 300)
    split = np.minimum(np.arange(g.num_nodes) * 3 // g.num_nodes, 2)
    for mb, schedule in ((1, "1f1b"), (4, "1f1b"), (3, "gpipe")):
        for a in (split, rng.integers(0, 3, g.num_nodes)):
            for cl in ({"bandwidth": "16GB/s"}, {"device": "a100", "bandwidth": "300GB/s"},
                       {"bandwidth": "16GB/s", "host_cores": 2}):
                req = outcore.plan_request(3, None, **cl)
                p = make_plan(g, a, strategy="m", devices=3, memory_bytes=None,
                              microbatches=mb, schedule=schedule, cluster=req.cluster)
                simulate(p, g, checked=False)
    for parallel, extra in (("mast", {}), ("master", {}), ("mp", {"dp": 2})):
        p = outcore.plan(g, outcore.plan_request(4, None, parallel=parallel,
                                                 bandwidth="16GB/s", **extra))
        simulate(p, g, checked=False)
        simulate(p, g, checked=False, dp=2)
        simulate(p, g, checked=False, dp=2, dp_fused=True)
        simulate(p, g, checked=False, dp=2, dp_bucket_bytes=1e5)
    assert len(compared) >= 30 and all(compared)


def test_a_changed_rule_is_caught(compared, monkeypatch):
    """The comparison can fail: the reference posting its receives one action ahead instead
    of the runtime's three holds their buffers later, and the memory curves differ."""
    g = make("nas", 300)
    split = np.minimum(np.arange(g.num_nodes) * 2 // g.num_nodes, 1)
    req = outcore.plan_request(2, None, bandwidth="16GB/s")
    p = make_plan(g, split, strategy="m", devices=2, memory_bytes=None, microbatches=2,
                  cluster=req.cluster)
    simulate(p, g, checked=False)
    real = engine.post_positions
    monkeypatch.setattr(engine, "post_positions", lambda s: [
        np.maximum(np.arange(len(places)) - 1, 0) for places in real(s)])
    simulate(p, g, checked=False)
    assert compared == [True, False]


def test_a_compiled_timeline_pickles_and_copies_as_its_events():
    import copy
    import pickle

    g = make("nas", 200)
    split = np.minimum(np.arange(g.num_nodes) * 2 // g.num_nodes, 1)
    req = outcore.plan_request(2, None, bandwidth="16GB/s")
    p = make_plan(g, split, strategy="m", devices=2, memory_bytes=None, cluster=req.cluster)
    tl = simulate(p, g, checked=False).timeline
    assert isinstance(tl.events, EventColumns)
    for other in (pickle.loads(pickle.dumps(tl)), copy.deepcopy(tl)):
        assert other.events == tl.events and len(other.events) == len(tl.events) > 0
        assert np.array_equal(other.busy_s(), tl.busy_s())
