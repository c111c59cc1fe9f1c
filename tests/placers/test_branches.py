"""Fork-join regions: post-dominators against brute force, branches on hand-made DAGs and models."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from outcore.graph.generators import make_nas, make_rnn, make_transformer
from outcore.graph.ir import build
from outcore.placers.subgraph.branches import (
    VIRTUAL,
    find_branches,
    fork_join_regions,
    post_dominators,
)


def dag(n, edges, fwd=None, **kw):
    fwd = [1.0] * n if fwd is None else fwd
    return build("t", fwd_s=fwd, src=[e[0] for e in edges], dst=[e[1] for e in edges],
                 edge_bytes=[8] * len(edges), **kw)


def random_graph(seed, n, edges):
    """A random DAG: ``edges`` draws of a node pair, each edge from the lower index."""
    rng = np.random.default_rng(seed)
    pairs = sorted({tuple(sorted(rng.integers(0, n, 2).tolist())) for _ in range(edges)})
    src, dst = zip(*[p for p in pairs if p[0] != p[1]])
    return build("random", fwd_s=rng.uniform(0, 1e-3, n), src=src, dst=dst)


def as_sets(region):
    return [sorted(b.tolist()) for b in region.branches]


def only(regions):
    assert len(regions) == 1, [(r.fork, r.join, as_sets(r)) for r in regions]
    return regions[0]


# ------------------------------------------------------------------ hand-made DAGs
def test_diamond_has_one_region_with_two_branches():
    g = dag(4, [(0, 1), (0, 2), (1, 3), (2, 3)])
    assert post_dominators(g).tolist() == [3, 3, 3, VIRTUAL]
    r = only(find_branches(g).regions)
    assert (r.fork, r.join) == (0, 3)
    assert as_sets(r) == [[1], [2]]
    assert r.work_s.tolist() == [3.0, 3.0]  # forward 1 s + backward 2 s each
    assert r.saving_s == 3.0


def test_a_weight_read_by_two_branches_does_not_fork():
    # 0: a weight read by 2 and 3; 1: the activation that forks them; 4: the join
    edges = [(0, 2), (0, 3), (1, 2), (1, 3), (2, 4), (3, 4)]
    g = dag(5, edges, ops=["param", "input", "linear", "linear", "add"])
    r = only(find_branches(g).regions)
    assert (r.fork, r.join) == (1, 4)
    assert as_sets(r) == [[2], [3], [0]]  # the weight runs beside them, a side branch
    # the same graph with node 0 an activation: both forks give the region
    regions, _ = fork_join_regions(dag(5, edges))
    assert {(q.fork, q.join) for q in regions} == {(0, 4), (1, 4)}


def test_four_way_fork_join_with_chains():
    # 0 -> {1..4}; branch i is the chain i -> i + 4 -> 9
    edges = [(0, i) for i in range(1, 5)] + [(i, i + 4) for i in range(1, 5)] \
        + [(i + 4, 9) for i in range(1, 5)]
    r = only(find_branches(dag(10, edges)).regions)
    assert (r.fork, r.join) == (0, 9)
    assert as_sets(r) == [[1, 5], [2, 6], [3, 7], [4, 8]]


def test_branches_that_meet_before_the_join_are_one_branch():
    # 0 -> 1, 2, 3; 1 and 2 both feed 4; 3 alone; 4 and 3 -> 5
    g = dag(6, [(0, 1), (0, 2), (0, 3), (1, 4), (2, 4), (3, 5), (4, 5)])
    cands, _ = fork_join_regions(g)
    outer = [r for r in cands if r.join == 5]
    assert [as_sets(r) for r in outer] == [[[1, 2, 4], [3]]]
    # 1 and 2 also form a region of their own, joined at 4 (it does not post-dominate 0)
    inner = [r for r in cands if r.join == 4]
    assert [(r.fork, as_sets(r)) for r in inner] == [(0, [[1], [2]])]


def test_residual_block_skip_branch_is_empty_so_no_region():
    # x=0 -> conv 1 -> bn 2 -> add 3 ; x -> add (identity skip) ; add -> 4
    g = dag(5, [(0, 1), (1, 2), (2, 3), (0, 3), (3, 4)])
    assert post_dominators(g)[0] == 3
    cands, truncated = fork_join_regions(g)
    assert cands == () and not truncated
    assert find_branches(g).regions == ()


def test_chain_has_no_region():
    g = dag(6, [(i, i + 1) for i in range(5)])
    assert post_dominators(g).tolist() == [1, 2, 3, 4, 5, VIRTUAL]
    assert find_branches(g).candidates == ()


def test_parallel_edges_are_not_a_fork():
    g = build("multi", fwd_s=[1, 1, 1], src=[0, 0, 1], dst=[1, 1, 2], edge_bytes=[8, 8, 8])
    assert find_branches(g).candidates == ()


def test_nested_regions_choose_the_larger_parallel_saving():
    # outer: 0 -> {A, B} -> 9; A holds an inner fork 1 -> {2, 3} -> 4 -> 5; B = 6 -> 7 -> 8
    edges = [(0, 1), (1, 2), (1, 3), (2, 4), (3, 4), (4, 5), (5, 9),
             (0, 6), (6, 7), (7, 8), (8, 9)]
    # inner branches heavy, outer B light: the inner 2-way split saves more
    heavy_inner = [0.1, 0.1, 10, 10, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    br = find_branches(dag(10, edges, fwd=heavy_inner))
    assert sorted((r.fork, r.join) for r in br.candidates) == [(0, 9), (1, 4)]
    r = only(br.regions)
    assert (r.fork, r.join) == (1, 4) and as_sets(r) == [[2], [3]]
    # B heavy: the outer split saves more and is chosen (the inner one lies inside it)
    heavy_outer = [0.1, 0.1, 1, 1, 0.1, 0.1, 10, 10, 10, 0.1]
    r = only(find_branches(dag(10, edges, fwd=heavy_outer)).regions)
    assert (r.fork, r.join) == (0, 9)
    assert as_sets(r) == [[1, 2, 3, 4, 5], [6, 7, 8]]


def test_equal_savings_keep_the_outer_region():
    # without costs every split saves "nodes"; the outer region covers the inner one
    edges = [(0, 1), (1, 2), (1, 3), (2, 4), (3, 4), (0, 5), (5, 6), (4, 6)]
    g = dag(7, edges, fwd=[0.0] * 7)
    r = only(find_branches(g).regions)
    assert (r.fork, r.join) == (0, 6)


def test_multiple_sources_and_sinks_use_virtual_fork_and_join():
    # inputs 0 and 1, each a chain (0 -> 2, 1 -> 3), fused at 4, which feeds two outputs 5, 6
    g = dag(7, [(0, 2), (1, 3), (2, 4), (3, 4), (4, 5), (4, 6)])
    assert post_dominators(g).tolist() == [2, 3, 4, 4, VIRTUAL, VIRTUAL, VIRTUAL]
    regions = find_branches(g).regions
    assert [(r.fork, r.join, as_sets(r)) for r in regions] == [
        (VIRTUAL, 4, [[0, 2], [1, 3]]), (4, VIRTUAL, [[5], [6]])]


def test_constants_that_feed_one_branch_are_attached_to_it():
    # fork 0 -> {1, 2} -> 3; a constant 4 (a source) feeds only node 2
    g = dag(5, [(0, 1), (0, 2), (1, 3), (2, 3), (4, 2)])
    r = only(find_branches(g).regions)
    assert (r.fork, r.join) == (0, 3)
    assert as_sets(r) == [[1], [2]]
    assert [f.tolist() for f in r.feeders] == [[], [4]]
    assert r.work_s.tolist() == [3.0, 6.0]


def test_ops_on_a_cells_other_input_become_a_side_branch():
    # a two-input cell (AmoebaNet/NAS): cell outputs 0 -> 1; pre0 = 2 reads 0, pre1 = 3 reads 1;
    # the fork 3 feeds ops 4 and 5; pre0 feeds op 7; 4, 5, 7 -> concat 6; 1 also feeds the next
    # cell (8), so the region is the cell's
    edges = [(0, 1), (0, 2), (1, 3), (3, 4), (3, 5), (4, 6), (5, 6), (2, 7), (7, 6), (6, 8),
             (1, 8)]
    r = only(find_branches(dag(9, edges)).regions)
    assert (r.fork, r.join) == (3, 6)
    assert as_sets(r) == [[4], [5], [2, 7]] and r.side == 1
    assert r.work_s.tolist() == [3.0, 3.0, 6.0]
    # if pre0 feeds op 4 only, it hangs off that branch alone: a feeder, not a side branch
    edges = [(0, 1), (0, 2), (1, 3), (3, 4), (3, 5), (4, 6), (5, 6), (2, 4), (6, 7), (1, 7)]
    r = only(find_branches(dag(8, edges)).regions)
    assert (r.fork, r.join) == (3, 6)
    assert as_sets(r) == [[4], [5]] and r.side == 0
    assert [f.tolist() for f in r.feeders] == [[2], []]


def test_two_branches_with_a_shared_node_are_merged():
    # both successors of 0 reach 3 before the join 4: one branch, no region
    g = dag(5, [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (1, 4)])
    assert all(r.join != 4 for r in find_branches(g).candidates)


def test_budget_stops_the_search_and_says_so(caplog):
    g = make_rnn(300).replace(name="rnn-budget")
    with caplog.at_level(logging.WARNING, logger="outcore.placers.subgraph.branches"):
        cands, truncated = fork_join_regions(g, max_visits=50)
        # the layout search rescales a graph several times: the warning comes once
        fork_join_regions(g.replace(fwd_s=g.fwd_s * 0.5), max_visits=50)
    assert truncated
    assert [r.levelno for r in caplog.records if "reached its budget" in r.getMessage()] == [
        logging.WARNING]
    full, stopped = fork_join_regions(g)
    assert not stopped and len(cands) <= len(full)


# ------------------------------------------------------------------ synthetic models
def test_synthetic_transformer_heads_are_the_branches_of_each_layer():
    g = make_transformer(600, seed=1)
    heads, layers = g.meta["heads"], g.meta["layers"]
    br = find_branches(g)
    assert len(br.regions) == layers
    for r in br.regions:
        assert g.op_of(r.fork) == "layer_norm" and g.op_of(r.join) == "cat"
        assert r.num_branches == heads
        assert all(b.size == 6 for b in r.branches)  # q, k, v, scores, softmax, context


def test_synthetic_nas_cells_give_regions_inside_cells():
    g = make_nas(200, seed=3)
    br = find_branches(g)
    assert br.regions and not br.truncated
    for r in br.regions:
        assert r.num_branches >= 2
        span = np.concatenate([r.interior, [x for x in (r.fork, r.join) if x >= 0]])
        assert span.max() - span.min() < 2 * 18  # within a cell and its neighbour


def test_ten_thousand_node_graph_is_fast():
    import time

    g = make_transformer(10_000)
    t = time.perf_counter()
    br = find_branches(g)
    assert time.perf_counter() - t < 10.0  # plain Python in tests; ~0.2 s compiled
    assert len(br.regions) == g.meta["layers"]


# ------------------------------------------------------------------ captured models
@pytest.fixture(scope="module")
def zoo():
    pytest.importorskip("torch")
    from outcore.cost.analytical import estimate
    from outcore.graph.capture import capture
    from outcore.zoo import resolve_model

    out = {}
    for name, kw in (("outcore:transformer:layers=2,heads=4", {"batch_size": 2}),
                     ("outcore:amoebanet", {}), ("outcore:mlp", {}), ("outcore:diamond", {})):
        s = resolve_model(name, **kw)
        out[name.split(":")[1]] = estimate(capture(s.build(), s.example_inputs), "a100")
    return out


def test_zoo_transformer_heads_between_ln1_and_concat(zoo):
    g = zoo["transformer"]
    regions = find_branches(g).regions
    assert [(g.name_of(r.fork), g.name_of(r.join)) for r in regions] == [
        ("blocks_0_ln1", "cat"), ("blocks_1_ln1", "cat_1")]
    for layer, r in enumerate(regions):
        assert r.num_branches == 4
        for h, b in enumerate(r.branches):
            mods = {g.module_of(i) for i in b.tolist()}
            assert all(m.startswith(f"blocks.{layer}.heads.{h}") for m in mods)
            assert {g.name_of(i) for i in b.tolist()} >= {
                f"blocks_{layer}_heads_{h}_{p}" for p in "qkv"}
        # the causal mask is a constant that feeds one head only: attached to it
        assert [[g.name_of(i) for i in f.tolist()] for f in r.feeders] == [
            [f"blocks_{layer}_heads_{h}_mask"] for h in range(4)]


def test_zoo_amoebanet_one_region_per_cell(zoo):
    g = zoo["amoebanet"]
    regions = find_branches(g).regions
    cells = sorted({g.module_of(i).split(".")[1] for i in range(g.num_nodes)
                    if g.module_of(i).startswith("cells.")}, key=int)
    assert len(regions) == len(cells)
    for r, c in zip(regions, cells):
        assert r.num_branches >= 2
        assert g.module_of(r.fork).startswith(f"cells.{c}.pre")
        assert g.op_of(r.join) == "cat"
        mods = {g.module_of(int(i)) for b in r.branches for i in b}
        assert all(m == f"cells.{c}" or m.startswith(f"cells.{c}.") for m in mods)


def test_zoo_chain_and_diamond(zoo):
    assert find_branches(zoo["mlp"]).candidates == ()
    g = zoo["diamond"]
    r = only(find_branches(g).regions)
    # tanh also feeds the head through a skip; left and right meet at the add
    assert (g.name_of(r.fork), g.name_of(r.join)) == ("tanh", "add")
    assert [[g.name_of(i) for i in b.tolist()] for b in r.branches] == [
        ["left_0", "left_1", "left_2"], ["right_0", "right_1"]]


# ------------------------------------------------------------------ properties
@st.composite
def dags(draw, max_nodes=12):
    n = draw(st.integers(1, max_nodes))
    pairs = [(i, j) for j in range(n) for i in range(j)]
    chosen = sorted(draw(st.lists(st.sampled_from(pairs), unique=True,
                                  max_size=min(22, len(pairs)))) if pairs else [])
    perm = draw(st.permutations(range(n)))  # node indices need not be a topological order
    fwd = draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 5.0]), min_size=n, max_size=n))
    return dag(n, [(perm[a], perm[b]) for a, b in chosen], fwd=[fwd[perm[i]] for i in range(n)])


def _succ(g, n):
    out = {v: set(g.successors(v).tolist()) for v in range(n)}
    out[n] = set(np.flatnonzero(g.in_degree == 0).tolist())  # virtual source
    for v in range(n):
        if not out[v]:
            out[v] = {n + 1}  # virtual sink
    out[n + 1] = set()
    return out


def _reaches_exit(succ, v, removed):
    seen, stack = {v}, [v]
    while stack:
        u = stack.pop()
        if u == removed:
            continue
        if not succ[u]:
            return True
        for w in succ[u]:
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return False


def _brute_ipdom(g):
    """Post-dominators by definition: d pdoms v iff v cannot reach the exit without d."""
    n = g.num_nodes
    succ = _succ(g, n)
    out = []
    for v in range(n):
        strict = [d for d in range(n) if d != v and not _reaches_exit(succ, v, d)]
        # the immediate one is post-dominated by every other strict post-dominator
        imm = [d for d in strict
               if all(e == d or not _reaches_exit(succ, d, e) for e in strict)]
        assert len(imm) <= 1
        out.append(imm[0] if imm else VIRTUAL)
    return out


def _brute_branches(g, fork, join):
    """Weakly connected components of the nodes reachable before ``join`` from the successors
    of ``fork`` that ``join`` post-dominates."""
    n = g.num_nodes
    succ = _succ(g, n)
    f = n if fork == VIRTUAL else fork
    j = n + 1 if join == VIRTUAL else join
    inside, stack = set(), [s for s in succ[f] if s != j and not _reaches_exit(succ, s, j)]
    while stack:
        u = stack.pop()
        if u in inside or u == j or u >= n:
            continue
        inside.add(u)
        stack.extend(succ[u])
    label = {v: v for v in inside}

    def find(x):
        while label[x] != x:
            x = label[x]
        return x

    for u in inside:
        for w in succ[u]:
            if w in inside:
                a, b = find(u), find(w)
                label[max(a, b)] = min(a, b)
    comps: dict[int, list[int]] = {}
    for v in sorted(inside):
        comps.setdefault(find(v), []).append(v)
    return sorted(comps.values())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=dags())
def test_post_dominators_match_the_definition(g):
    assert post_dominators(g).tolist() == _brute_ipdom(g)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=dags())
def test_regions_match_brute_force_and_every_ipdom_region_is_found(g):
    n = g.num_nodes
    cands, truncated = fork_join_regions(g)
    assert not truncated
    found = {(r.fork, r.join): r for r in cands}
    assert len(found) == len(cands)
    for (f, j), r in found.items():
        assert sorted(as_sets(r)) == _brute_branches(g, f, j)
        assert r.num_branches >= 2
    # completeness for the immediate post-dominator of every fork
    ipdom = _brute_ipdom(g)
    forks = [(v, ipdom[v]) for v in range(n) if len(set(g.successors(v).tolist())) >= 2]
    if np.count_nonzero(g.in_degree == 0) >= 2:
        srcs = np.flatnonzero(g.in_degree == 0).tolist()
        common = set.intersection(*[{d for d in range(n) if not _reaches_exit(
            _succ(g, n), s, d) or d == s} for s in srcs])
        # the virtual source's join: the common post-dominator nearest the sources
        near = [d for d in common if all(e == d or not _reaches_exit(_succ(g, n), d, e)
                                         for e in common)]
        forks.append((VIRTUAL, near[0] if near else VIRTUAL))
    for f, j in forks:
        comps = _brute_branches(g, f, j)
        assert (len(comps) >= 2) == ((f, j) in found), (f, j, comps)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=dags())
def test_chosen_regions_are_disjoint_and_deterministic(g):
    br = find_branches(g)
    seen = np.zeros(g.num_nodes, bool)
    for r in br.regions:
        nodes = np.concatenate(list(r.branches) + list(r.feeders))
        assert not seen[nodes].any()
        seen[nodes] = True
        assert r.work_s.shape == (r.num_branches,)
    ends = [e for r in br.regions for e in (r.fork, r.join) if e >= 0]
    assert not seen[ends].any()
    again = find_branches(g)
    assert [(r.fork, r.join, as_sets(r)) for r in again.regions] == \
        [(r.fork, r.join, as_sets(r)) for r in br.regions]


def test_row_sums_add_as_numpy_does():
    """A branch's work summed in the compiled walk is numpy's sum to the last bit (its
    pairwise summation: blocks of 8 accumulators, halves past 128 values)."""
    from outcore.placers.subgraph._kernel import row_sums

    rng = np.random.default_rng(5)
    w = rng.standard_normal(5000) * 10.0 ** rng.uniform(-6, 6, 5000)
    sizes = [0, 1, 7, 8, 9, 127, 128, 129, 300, 1000, 2049]
    rows = [rng.choice(5000, size=s, replace=False) for s in sizes]
    extra = [rng.choice(5000, size=s, replace=False) for s in reversed(sizes)]
    def ptr(xs):
        return np.concatenate([[0], np.cumsum([x.size for x in xs])]).astype(np.int64)
    got = row_sums(w, ptr(rows), np.concatenate(rows).astype(np.int64), ptr(extra),
                    np.concatenate(extra).astype(np.int64))
    want = [float(w[a].sum() + w[b].sum()) for a, b in zip(rows, extra)]
    assert got.tolist() == want


def _same_regions(a, b):
    assert [(r.fork, r.join, r.side, len(r.branches)) for r in a] == \
        [(r.fork, r.join, r.side, len(r.branches)) for r in b]
    for x, y in zip(a, b):
        assert all(np.array_equal(p, q) for p, q in zip(x.branches + x.feeders,
                                                        y.branches + y.feeders))
        assert np.array_equal(x.work_s, y.work_s)  # to the last bit


@pytest.mark.parametrize("graph", ["nas0", "nas1", "transformer", "rnn", "random3", "random5"])
def test_the_choice_on_columns_is_the_reference_choice(graph):
    """``find_branches`` chooses on columns (``region_sets``: the choice in compiled loops, the
    feeders in one compiled walk, numpy's summation for the work) what ``select_regions``
    chooses on region objects with the plain feeder walk (``attach_feeders``): branches,
    feeders, side branches and work, to the last bit (AmoebaNet-like cells have a side branch
    each); on a rescaled copy of the graph too (the feeders are remembered per shape, the work
    is not)."""
    from outcore.placers.subgraph import branches as B

    if graph.startswith("random"):
        g = random_graph(int(graph[-1]), 300 if graph == "random3" else 400,
                         700 if graph == "random3" else 900)
    elif graph.startswith("nas"):
        g = make_nas(1500, seed=int(graph[-1]))
    else:
        g = {"transformer": make_transformer, "rnn": make_rnn}[graph](1500)
    for h in (g, g.replace(fwd_s=g.fwd_s * 0.3, bwd_s=g.bwd_s * 1.7)):
        br = find_branches(h)
        assert br.regions or graph == "rnn"
        _same_regions(br.regions, B.select_regions(h, B.fork_join_regions(h)[0]))
        assert br.branch_nodes == sum(b.size + f.size for r in br.regions
                                      for b, f in zip(r.branches, r.feeders))
    if graph == "nas0":
        assert sum(r.side for r in br.regions) > 0  # the case the side components exercise


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_the_choice_on_columns_is_the_reference_choice_on_any_dag(g):
    from outcore.placers.subgraph import branches as B

    _same_regions(find_branches(g).regions, B.select_regions(g, B.fork_join_regions(g)[0]))
