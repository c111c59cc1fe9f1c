"""Large graphs are condensed: by module depth when paths exist, else into level bands."""

from __future__ import annotations

import numpy as np

from outcore.graph.algorithms import topological_order
from outcore.graph.coarsen import collapse
from outcore.viz.condense import MAX_BANDS, condense, device_shares, module_depth
from tests.viz.graphs import blocks, synthetic


def test_small_graph_is_drawn_as_is():
    g = blocks(2, 3)
    view = condense(g, 400)
    assert view.mode == "nodes" and view.graph is g and view.note == ""


def test_collapse_picks_the_deepest_depth_that_fits():
    g = blocks(6, 8)  # 49 nodes; depth 2 -> x + 6 blocks; depth 1 -> x + 2 stages
    assert module_depth(g) == 3
    view = condense(g, 20)
    assert view.mode == "modules" and view.depth == 2
    assert view.graph.num_nodes == collapse(g, 2).num_nodes == 7
    assert "module depth 2" in view.note
    assert condense(g, 5).depth == 1
    # every original node maps to the block that holds it
    for i in range(g.num_nodes):
        members = view.graph.attr(int(view.group[i]), "members")
        assert int(g.ids[i]) in members


def test_graph_without_modules_becomes_bands():
    g = synthetic(12_000, 40)
    view = condense(g, 400)
    assert view.mode == "bands"
    assert view.graph.num_nodes <= min(400, MAX_BANDS)
    assert int(view.layer.max()) + 1 <= MAX_BANDS
    vg = view.graph
    assert (view.layer[vg.src] < view.layer[vg.dst]).all()  # one device: every edge goes down
    assert np.isclose(vg.fwd_s.sum(), g.fwd_s.sum())
    assert len(topological_order(vg)) == vg.num_nodes


def test_bands_split_by_device():
    g = synthetic(3_000, 20)
    devices = (np.arange(g.num_nodes) * 3) // g.num_nodes
    view = condense(g, 60, devices)
    assert view.graph.num_nodes <= 60
    assert set(view.column.tolist()) == {0, 1, 2}
    assert (view.layer[view.graph.src] <= view.layer[view.graph.dst]).all()
    shares = device_shares(view, g, devices)
    assert all(abs(sum(s for _, s in row) - 1) < 1e-9 for row in shares)
    assert all(len(row) == 1 for row in shares)  # a box is one device's part of a band


def test_device_shares_of_mixed_blocks():
    g = blocks(2, 4)
    devices = np.zeros(g.num_nodes, dtype=np.int64)
    devices[2:] = 1  # block0 (nodes 1-4) is split: one node on device 0, three on 1
    view = condense(g, 4, devices)
    shares = device_shares(view, g, devices)
    split = [row for row in shares if len(row) == 2]
    assert len(split) == 1 and [d for d, _ in split[0]] == [1, 0]  # larger share first
