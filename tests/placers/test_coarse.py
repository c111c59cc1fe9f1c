"""The coarsened graph very large graphs are placed on: clusters, costs, and the search on it."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import outcore
from outcore.graph.algorithms import topological_order
from outcore.graph.generators import make
from outcore.placers import coarse
from outcore.placers.coarse import chain_clusters, coarsened
from outcore.placers.context import make_context
from outcore.search import placement
from tests.placers.test_branches import random_graph
from tests.search.test_search import _trivial

FAMILIES = ("rnn", "nas", "transformer", "unet", "resnet", "chain")


def _members(group: np.ndarray, k: int) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(k)]
    for v, c in enumerate(group.tolist()):
        out[c].append(v)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_clusters_are_connected_runs_of_a_topological_order(family):
    g = make(family, 3000)
    cap = 7
    group, k, _ = chain_clusters(g, cap)
    assert group.shape == (g.num_nodes,) and k == int(group.max()) + 1
    sizes = np.bincount(group)
    assert sizes.max() <= cap and sizes.min() >= 1
    # numbered in a topological order of the coarse graph: every edge between clusters goes up
    cross = group[g.src] != group[g.dst]
    assert (group[g.src][cross] < group[g.dst][cross]).all()
    # a cluster is a run in which every node but the first reads an earlier member: walking a
    # topological order of the graph, each cluster's members form one connected piece
    order = topological_order(g)
    rank = np.empty(g.num_nodes, np.int64)
    rank[order] = np.arange(g.num_nodes)
    for members in _members(group, k):
        if len(members) == 1:
            continue
        first = min(members, key=lambda v: rank[v])
        inside = set(members)
        for v in members:
            if v != first:
                assert any(int(u) in inside for u in g.predecessors(v)), (family, members)
    assert k < g.num_nodes / 2, f"{family}: {k} clusters of {g.num_nodes} nodes"


def _reference_edges(g, group):
    """Per cluster pair, each producer's largest edge into the consuming cluster, summed."""
    largest: dict[tuple[int, int], float] = {}
    for s, d, b in zip(g.src.tolist(), g.dst.tolist(), g.edge_bytes.tolist()):
        a, c = int(group[s]), int(group[d])
        if a != c:
            largest[(s, c)] = max(largest.get((s, c), 0), b)
    pairs: dict[tuple[int, int], float] = {}
    for (s, c), b in largest.items():
        key = (int(group[s]), c)
        pairs[key] = pairs.get(key, 0) + b
    return pairs


@pytest.mark.parametrize("family", ["rnn", "nas", "transformer", "random"])
def test_coarse_costs_are_the_members_sums(family):
    g = random_graph(3, 1500, 4000) if family == "random" else make(family, 2000)
    co = coarsened(g, above=100, target=300)
    assert co is not None, family
    cg, group = co.graph, co.group
    for field in ("fwd_s", "bwd_s", "param_bytes", "saved_bytes"):
        assert np.isclose(getattr(cg, field).sum(), getattr(g, field).sum(), rtol=1e-12), field
    out = np.zeros(cg.num_nodes)
    np.maximum.at(out, group, g.out_bytes)
    assert np.array_equal(cg.out_bytes, out.astype(np.int64))
    got = {(int(a), int(b)): int(e) for a, b, e in zip(cg.src, cg.dst, cg.edge_bytes)}
    assert got == _reference_edges(g, group)
    topological_order(cg)  # acyclic (raises on a cycle)
    if g.ops is not None:  # parameter reads stay nodes of their own, with their op
        for v in g.param_nodes.tolist():
            c = int(group[v])
            if np.count_nonzero(group == c) == 1:
                assert cg.ops[c] == "param"


def test_small_graphs_and_graphs_that_do_not_shrink_are_not_coarsened():
    g = make("rnn", 2000)
    assert coarsened(g) is None  # below COARSEN_ABOVE
    # a graph of independent nodes has no runs to merge
    flat = outcore.graph.ir.build("flat", fwd_s=np.ones(400))
    assert coarsened(flat, above=10, target=50) is None


def test_a_rescaled_copy_shares_the_clusters_and_the_coarse_structure():
    g = make("nas", 2000)
    a = coarsened(g, above=100, target=300)
    h = g.replace(fwd_s=g.fwd_s * 2, saved_bytes=g.saved_bytes * 3)
    b = coarsened(h, above=100, target=300)
    assert b.group is a.group
    assert b.graph.structure is a.graph.structure
    assert np.allclose(b.graph.fwd_s, a.graph.fwd_s * 2)
    assert np.allclose(b.graph.saved_bytes, a.graph.saved_bytes * 3, atol=1)
    assert coarsened(h, above=100, target=300) is b  # made once per graph


def test_projection_and_back():
    g = make("rnn", 2000)
    co = coarsened(g, above=100, target=300)
    ca = np.arange(co.graph.num_nodes) % 3
    fine = ca[co.group]
    assert np.array_equal(co.on_clusters(fine), ca)
    fine[0] = (fine[0] + 1) % 3
    if np.count_nonzero(co.group == co.group[0]) > 1:
        assert co.on_clusters(fine) is None  # a cluster split over devices


@pytest.mark.parametrize("family", ["rnn", "nas", "unet"])
def test_the_search_places_a_large_graph_coarsened_and_judges_it_in_full(family, monkeypatch):
    from outcore.sim.simulate import simulate

    logging.disable(logging.WARNING)
    g = make(family, 2500)
    monkeypatch.setattr(coarse, "COARSEN_ABOVE", 1000)
    monkeypatch.setattr(coarse, "TARGET_NODES", 400)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    req = outcore.plan_request(4, 1.25 * one / 4, bandwidth="16GB/s")
    p = outcore.plan(g, req)
    assert p.assignment.shape == (g.num_nodes,)
    assert any("coarsened to" in n for n in p.notes), p.notes
    again = simulate(p, g)  # the plan's figures are the full graph's
    assert again.iteration_s == pytest.approx(p.predicted["iteration_s"], rel=1e-9)
    assert max(again.peak_bytes) <= req.memory_bytes
    # and it does not lose to the trivial split (the plain order cut into equal memory)
    trivial = outcore.simulate(_trivial(g, 4, req), g)
    if trivial.fits:
        assert p.predicted["iteration_s"] <= trivial.iteration_s * (1 + 1e-9), p.notes


def test_the_layout_search_on_a_coarsened_graph(monkeypatch):
    """With the layouts open every micro-batch size's rescaled copy is placed coarsened with
    one set of clusters, and the chosen plan's figures are its full graph's."""
    from outcore.graph.batch import at_microbatch
    from outcore.sim.simulate import simulate

    logging.disable(logging.WARNING)
    g = make("nas", 2500)
    monkeypatch.setattr(coarse, "COARSEN_ABOVE", 1000)
    monkeypatch.setattr(coarse, "TARGET_NODES", 400)
    made: dict[int, coarse.Coarse] = {}
    original = coarse.coarsened

    def counted(graph, **kw):
        out = original(graph, **kw)
        if out is not None:
            made[id(graph)] = out
        return out

    monkeypatch.setattr(coarse, "coarsened", counted)
    monkeypatch.setattr(placement, "coarsened", counted)  # where the search looks it up
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    req = outcore.plan_request(4, 1.25 * one / 4, bandwidth="16GB/s", search_layout=True)
    p = outcore.plan(g, req)
    assert len(made) >= 2, "several micro-batch sizes placed coarsened"
    groups = {id(c.group) for c in made.values()}
    structures = {id(c.graph.structure) for c in made.values()}
    assert len(groups) == 1 and len(structures) == 1
    chosen = next(r for r in p.extra["candidates"] if r["outcome"] == "chosen")
    again = simulate(p, at_microbatch(g, chosen["samples"], req.cluster.device.launch_s))
    assert again.iteration_s == pytest.approx(p.predicted["iteration_s"], rel=1e-9)
