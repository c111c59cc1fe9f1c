"""Invariants of the layered layout, checked on the layout function itself."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.viz.layout import (
    _isotonic,
    assign_layers,
    count_crossings,
    layered_layout,
    reduce_crossings,
    route_edges,
)
from tests.viz.graphs import blocks, diamond, synthetic

GRAPHS = {"diamond": diamond(), "blocks": blocks(4, 5), "synthetic": synthetic(150, 12)}


def _layout(g, widths=None):
    w = np.full(g.num_nodes, 0.8) if widths is None else widths
    return layered_layout(g.num_nodes, g.src, g.dst, w)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_edge_goes_down(name):
    g = GRAPHS[name]
    lay = _layout(g)
    assert (lay.layer[g.dst] > lay.layer[g.src]).all()
    assert (lay.layer[lay.vedges[:, 1]] == lay.layer[lay.vedges[:, 0]] + 1).all()
    for e, route in enumerate(lay.routes):
        assert route[0] == g.src[e] and route[-1] == g.dst[e]
        assert np.array_equal(np.diff(lay.layer[list(route)]), np.ones(len(route) - 1))
    assert lay.flat == ()


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_positions_distinct_and_ordered(name):
    g = GRAPHS[name]
    widths = np.random.default_rng(1).uniform(0.5, 2.0, g.num_nodes)
    lay = _layout(g, widths)
    keys = set(zip(lay.layer.tolist(), lay.pos.tolist()))
    assert len(keys) == lay.layer.size  # no two vertices share a slot
    points = set(zip(np.round(lay.x, 6).tolist(), np.round(lay.y, 6).tolist()))
    assert len(points) == lay.layer.size  # nor a position
    for i, members in enumerate(lay.layers):
        members = list(members)
        assert (lay.layer[members] == i).all()
        assert lay.pos[members].tolist() == list(range(len(members)))
        x, w = lay.x[members], lay.width[members]
        gaps = (x[1:] - w[1:] / 2) - (x[:-1] + w[:-1] / 2)
        assert (gaps >= -1e-9).all(), "boxes of one layer overlap"
        assert np.allclose(lay.y[members], lay.y[members[0]])
    assert (np.diff([lay.y[m[0]] for m in lay.layers]) > lay.node_height).all()
    assert (lay.x - lay.width / 2).min() >= -1e-9


def test_crossing_reduction_finds_a_better_order():
    # a->z, b->y, c->x drawn in the order [a b c] over [x y z]: 3 crossings; [z y x] has none.
    vedges = np.array([[0, 5], [1, 4], [2, 3]])
    start = [[0, 1, 2], [3, 4, 5]]
    assert count_crossings(start, vedges) == 3
    best, crossings = reduce_crossings(start, vedges)
    assert crossings == count_crossings(best, vedges) == 0
    assert start == [[0, 1, 2], [3, 4, 5]]  # input untouched


def test_crossing_reduction_never_worse():
    g = synthetic(120, 10, seed=3)
    layer = assign_layers(g.num_nodes, g.src, g.dst)
    vlayer, _, _, vedges = route_edges(layer, g.src, g.dst)
    start = [[] for _ in range(int(vlayer.max()) + 1)]
    for v in range(vlayer.size):  # index order, no heuristic
        start[vlayer[v]].append(v)
    before = count_crossings(start, vedges)
    best, after = reduce_crossings(start, vedges)
    assert after <= before
    assert sorted(v for lay in best for v in lay) == list(range(vlayer.size))


def test_long_edges_share_one_dummy_chain():
    # node 0 feeds nodes at layers 1, 3 and 5 (chain 1->2->3->4->5): one chain of 4 dummies
    src = [0, 1, 2, 3, 4, 0, 0]
    dst = [1, 2, 3, 4, 5, 3, 5]
    layer = assign_layers(6, np.array(src), np.array(dst))
    assert layer.tolist() == [0, 1, 2, 3, 4, 5]
    vlayer, routes, flat, _ = route_edges(layer, np.array(src), np.array(dst))
    assert vlayer.size == 6 + 4
    assert routes[6][:3] == routes[5][:3]  # the skip to 5 follows the skip to 3
    assert flat == []


def test_sources_sit_above_their_first_consumer():
    # 0 -> 1 -> 2 -> 3 and a parameter-like source 4 read by 3 only
    layer = assign_layers(5, np.array([0, 1, 2, 4]), np.array([1, 2, 3, 3]))
    assert layer.tolist() == [0, 1, 2, 3, 2]


def test_given_layers_make_flat_edges():
    lay = layered_layout(3, np.array([0, 1, 0]), np.array([1, 2, 2]), np.ones(3),
                         layer=np.array([0, 0, 1]))
    assert lay.flat == (0,)
    assert lay.routes[0] == () and lay.routes[1] == (1, 2)


def test_isotonic_keeps_separation_and_targets():
    x = _isotonic(np.array([0.0, 0.1, 5.0]), np.ones(3), np.array([1.0, 1.0]))
    assert np.all(np.diff(x) >= 1.0 - 1e-12)
    assert x[2] == pytest.approx(5.0)
    assert x[0] + x[1] == pytest.approx(0.1)  # the clash is split evenly around the targets


def test_a_tall_drawing_is_folded_into_columns_and_a_short_one_is_not():
    """A 150-layer chain is cut into side-by-side columns of consecutive layers (about as tall
    as the page is wide), each column keeping its layers' order; a short graph stays as is."""
    from outcore.viz.layout import folded
    n = 150
    src, dst = np.arange(n - 1), np.arange(1, n)
    lay = layered_layout(n, src, dst, np.full(n, 1.5))
    assert lay.height_in > 20 * lay.width_in
    out = folded(lay)
    assert out.height_in < 3 * out.width_in and out.height_in < lay.height_in / 3
    cols = np.round((out.x - lay.x) / (out.x - lay.x).max() * 100)
    assert (np.diff(cols[:n]) >= 0).all()  # consecutive layers, column after column
    for c in np.unique(cols):
        ys = out.y[:n][cols[:n] == c]
        assert (np.diff(ys) > 0).all() and ys.min() >= 0
    short = layered_layout(5, np.arange(4), np.arange(1, 5), np.full(5, 1.5))
    assert folded(short) is short
