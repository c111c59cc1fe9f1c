"""Contiguous splits: a shared parameter (an unrolled RNN layer's weight) is not cut through."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import outcore
from outcore.graph.generators import make
from outcore.placers import contiguous
from outcore.placers.context import make_context
from outcore.plan import make_plan


def _layer_of_cells(g) -> np.ndarray:
    """Layer of each LSTM cell of the ``rnn`` generator's grid (-1 for other nodes)."""
    layers, steps = g.meta["layers"], g.meta["steps"]
    unit = layers + 3
    out = np.full(g.num_nodes, -1)
    base = layers + 2 + unit * np.arange(steps)
    for layer in range(layers):
        out[base + 1 + layer] = layer
    return out


def test_a_shared_weight_is_not_cut_through():
    g = make("rnn", 3000)
    ctx = make_context(g, 4)
    order = contiguous.depth_first_order(ctx)
    layer = _layer_of_cells(g)
    plain = contiguous.split(order, ctx.work_s, 4)
    kept = contiguous.shared_split(ctx, order, ctx.work_s, 4)
    cells = layer >= 0
    devices_per_layer = [np.unique(kept[cells & (layer == i)]).size for i in range(layer.max() + 1)]
    assert devices_per_layer == [1] * (layer.max() + 1)
    assert any(np.unique(plain[cells & (layer == i)]).size > 1 for i in range(layer.max() + 1))
    assert np.unique(kept).size > 1
    # simulated, the layer-wise split streams time steps from device to device
    times = [outcore.simulate(make_plan(g, a, strategy="contiguous", devices=4,
                                        memory_bytes=None), g).iteration_s
             for a in (plain, kept)]
    assert times[1] < 0.8 * times[0]


def test_no_shared_parameter_means_the_plain_split():
    g = make("transformer", 600)
    ctx = make_context(g, 4)
    assert contiguous.shared_split(ctx, ctx.order, ctx.work_s, 4) is None


@pytest.mark.parametrize("seed", range(20))
def test_min_max_cuts_are_optimal(seed):
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.1, 5.0, int(rng.integers(3, 9)))
    prefix = np.concatenate(([0.0], np.cumsum(w)))
    parts = int(rng.integers(1, 5))
    cuts = contiguous._min_max_cuts(prefix, parts)
    assert cuts[0] == 0 and cuts[-1] == w.size and len(cuts) - 1 <= parts
    got = np.diff(prefix[cuts]).max()
    best = min(max(np.diff(prefix[[0, *c, w.size]]))
               for r in range(min(parts, w.size))
               for c in itertools.combinations(range(1, w.size), r))
    assert got <= best * (1 + 1e-5)


def test_splits_that_do_not_fit_are_not_emulated_until_asked(monkeypatch):
    """A planner times only what it ranks: the splits over the memory limit keep their peak
    and are emulated only when something asks for their time (then as an eager run would)."""
    import importlib

    from outcore.placers.result import listed

    result = importlib.import_module("outcore.placers.result")
    g = make("unet", 1500)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    ctx = make_context(g, 4, memory_bytes=0.3 * one)
    runs = []
    real = result.run
    monkeypatch.setattr(result, "run", lambda c, a, **kw: runs.append(a) or real(c, a, **kw))
    best, notes, cands = contiguous.plan(ctx)
    over = [c for c in cands if not c.fits]
    fitting = sum(c.fits for c in cands)
    assert best is not None and len(over) >= 2 and fitting
    assert len(runs) <= fitting and not any(c.emulated for c in over)  # only those that fit
    assert listed(over[1:]).count("does not fit (") == len(over) - 1  # by their peaks
    c, before = over[0], len(runs)
    eager = real(c._ctx, c.assignment).makespan_s
    assert c.makespan_s == eager and c.emulated and len(runs) == before + 1


@pytest.mark.parametrize("seed", range(4))
def test_compact_numbers_devices_by_their_first_node(seed):
    """``compact`` reads each run of one device once; it renumbers as the definition does
    (devices in order of their first node) and ``devices_used`` counts the same devices."""
    from outcore.placers.result import compact, devices_used

    rng = np.random.default_rng(seed)
    runs = rng.integers(0, 9, 40)
    for a in (np.repeat(runs, rng.integers(1, 50, runs.size)), rng.integers(0, 9, 300),
              np.array([4]), np.array([2, 2, 0, 2, 1, 0])):
        new, old = compact(a)
        first = [int(np.flatnonzero(a == d)[0]) for d in np.unique(a)]
        want_old = np.unique(a)[np.argsort(first)]
        np.testing.assert_array_equal(old, want_old)
        np.testing.assert_array_equal(want_old[new], a)
        assert devices_used(a) == len(set(a.tolist()))
