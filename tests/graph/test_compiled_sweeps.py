"""The compiled longest-path sweeps and the depth-first order give what plain-Python loops over
the edge lists give."""

from __future__ import annotations

import numpy as np
import pytest

import outcore.graph.algorithms as alg
from outcore.graph.generators import make
from outcore.placers.context import make_context
from outcore.placers.contiguous import depth_first_order


def _reference_dfs(g) -> list[int]:
    """LIFO Kahn, ties by lowest index, as written before it was compiled."""
    indeg = g.in_degree.astype(np.int64).copy()
    stack = sorted((int(v) for v in np.flatnonzero(indeg == 0)), reverse=True)
    out = []
    while stack:
        v = stack.pop()
        out.append(v)
        ready = []
        for w in g.succ_idx[g.succ_ptr[v]:g.succ_ptr[v + 1]].tolist():
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
        stack.extend(sorted(ready, reverse=True))
    return out


def _reference_levels(g, node_w, edge_w):
    """Top and bottom levels by relaxing every edge (src, dst) in topological order."""
    order = alg.topological_order(g).tolist()
    top, bottom = [0.0] * g.num_nodes, list(map(float, node_w))
    by_dst, by_src = {}, {}
    for e, (u, v) in enumerate(zip(g.src.tolist(), g.dst.tolist())):
        by_dst.setdefault(v, []).append((u, e))
        by_src.setdefault(u, []).append((v, e))
    for v in order:
        top[v] = max([top[u] + node_w[u] + edge_w[e] for u, e in by_dst.get(v, [])], default=0.0)
    for v in reversed(order):
        bottom[v] = node_w[v] + max([edge_w[e] + bottom[s] for s, e in by_src.get(v, [])],
                                    default=0.0)
    return np.array(top), np.array(bottom)


@pytest.mark.parametrize("family", ["transformer", "rnn", "unet", "nas", "resnet"])
def test_sweeps_and_orders_match_the_plain_loops(family):
    g = make(family, 800, 3)
    rng = np.random.default_rng(0)
    node_w, edge_w = rng.random(g.num_nodes), rng.random(g.num_edges)
    top, bottom = _reference_levels(g, node_w, edge_w)
    np.testing.assert_allclose(alg.longest_from_sources(g, node_w, edge_w), top, rtol=1e-12)
    np.testing.assert_allclose(alg.longest_to_sinks(g, node_w, edge_w), bottom, rtol=1e-12)
    assert depth_first_order(make_context(g, 2)).tolist() == _reference_dfs(g)
