"""The compiled longest-path sweeps and the depth-first order give what the plain-Python loops
give (the list-based loops run when numba is absent)."""

from __future__ import annotations

import numpy as np
import pytest

import outcore.graph.algorithms as alg
from outcore.graph.generators import make
from outcore.partition.context import make_context
from outcore.partition.contiguous import depth_first_order


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


@pytest.mark.parametrize("family", ["transformer", "rnn", "unet", "nas", "resnet"])
def test_sweeps_and_orders_match_the_plain_loops(family, monkeypatch):
    g = make(family, 800, 3)
    rng = np.random.default_rng(0)
    node_w, edge_w = rng.random(g.num_nodes), rng.random(g.num_edges)
    fast = (alg.longest_from_sources(g, node_w, edge_w), alg.longest_to_sinks(g, node_w, edge_w))
    monkeypatch.setattr(alg, "HAVE_NUMBA", False)
    plain = (alg.longest_from_sources(g, node_w, edge_w), alg.longest_to_sinks(g, node_w, edge_w))
    np.testing.assert_allclose(fast[0], plain[0], rtol=1e-12)
    np.testing.assert_allclose(fast[1], plain[1], rtol=1e-12)
    assert depth_first_order(make_context(g, 2)).tolist() == _reference_dfs(g)
