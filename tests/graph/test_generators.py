"""Synthetic graph families: size, order, determinism and the structure each family promises."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.errors import UsageError
from outcore.graph.generators import FAMILIES, make, make_nas, make_rnn, make_transformer, make_unet


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("target", [200, 5000])
def test_size_order_and_costs(family, target):
    g = make(family, target, seed=1)
    assert abs(g.num_nodes - target) <= max(0.1 * target, 110)  # within a unit (layer, cell)
    assert (g.src < g.dst).all()  # numbered in a topological order
    assert (g.fwd_s > 0).all() and (g.bwd_s >= g.fwd_s * 0.8).all()
    assert (g.edge_bytes == g.out_bytes[g.src]).all() and (g.out_bytes >= 0).all()
    assert g.param_bytes.sum() > 0 and g.saved_bytes.sum() > 0
    assert len(g.ops) == g.num_nodes
    assert (g.in_degree[1:] + g.out_degree[1:] > 0).all()  # no isolated node


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_deterministic_per_seed(family):
    a, b = make(family, 800, seed=7), make(family, 800, seed=7)
    for field in ("fwd_s", "bwd_s", "param_bytes", "saved_bytes", "src", "dst", "edge_bytes"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    c = make(family, 800, seed=8)
    assert not np.array_equal(a.fwd_s[:min(a.num_nodes, c.num_nodes)],
                              c.fwd_s[:min(a.num_nodes, c.num_nodes)])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_generated_graph_says_its_batch_so_the_search_may_split_it(family):
    """Every generator costs its nodes for a batch and records it: ``--microbatches auto`` and
    the layout search rescale the graph to a micro-batch (they refuse a graph without it)."""
    from outcore.graph.batch import at_microbatch

    g = make(family, 300)
    assert g.batch_size is not None and g.batch_size >= 4
    half = at_microbatch(g, g.batch_size // 2)
    assert half.saved_bytes.sum() == pytest.approx(g.saved_bytes.sum() / 2, rel=0.01)
    assert half.param_bytes.sum() == g.param_bytes.sum()


def test_rnn_is_a_grid_of_layers_by_time_steps_with_shared_weights():
    g = make_rnn(3000, seed=0)
    layers, steps = g.meta["layers"], g.meta["steps"]
    cells = np.flatnonzero(np.array(g.ops) == "lstm_cell")
    assert cells.size == layers * steps
    # an inner cell reads the layer below, its own previous step, and its layer's weights
    assert (g.in_degree[cells].max(), g.in_degree[cells].min()) == (3, 2)
    weights = np.flatnonzero(np.array(g.ops) == "param")
    assert weights.size == layers + 2 and g.out_degree[weights[1]] == steps


def test_transformer_has_parallel_head_branches():
    g = make_transformer(2000, seed=0)
    heads = g.meta["heads"]
    ln = np.flatnonzero(np.array(g.ops) == "layer_norm")
    assert g.out_degree[ln[0]] == 3 * heads  # q, k, v of every head
    cat = np.flatnonzero(np.array(g.ops) == "cat")
    assert g.in_degree[cat[0]] == heads


def test_nas_cells_read_the_two_previous_cells():
    g = make_nas(2000, seed=0)
    cats = np.flatnonzero(np.array(g.ops) == "cat")
    assert cats.size == g.meta["cells"]
    # cell 6 starts after cell 5's output; its two input adapters read cells 4 and 5
    pre = np.flatnonzero(np.isin(g.dst, cats[5] + 1 + np.array([0, 1])))
    assert set(g.src[pre].tolist()) == {int(cats[4]), int(cats[5])}


def test_unet_has_long_skips_across_the_middle():
    g = make_unet(3000, seed=0)
    span = g.dst - g.src
    long_edges = np.flatnonzero(span > g.num_nodes // 4)
    assert long_edges.size >= g.meta["levels"] - 2
    assert all(g.ops[d] == "cat" for d in g.dst[long_edges].tolist())


def test_a_million_node_graph_is_cheap_to_make():
    g = make("unet", 1_000_000, seed=0)
    assert abs(g.num_nodes - 1_000_000) < 1000


def test_bad_family_and_size():
    with pytest.raises(UsageError, match="rnn"):
        make("lstm", 100)
    with pytest.raises(UsageError):
        make_rnn(3)


def test_chain_is_one_path_whose_activations_shrink_as_its_parameters_grow():
    from outcore.graph.generators import make_chain

    g = make_chain(2000, seed=0)
    assert (g.dst == g.src + 1).all() and g.num_edges == g.num_nodes - 1  # one path, no skips
    convs = np.flatnonzero(np.array(g.ops) == "conv2d")
    first, last = convs[: convs.size // 5], convs[-(convs.size // 5):]
    assert g.saved_bytes[first].mean() > 8 * g.saved_bytes[last].mean()
    assert g.param_bytes[last].mean() > 8 * g.param_bytes[first].mean()
