"""Coarsening by cost: pieces too small to pay for their runtime overhead and
messages merge into a neighbour's device; pieces worth their price stay where they are."""

from __future__ import annotations

import numpy as np

from outcore.graph.io import from_dict as graph_from_dict
from outcore.hardware.cluster import make_cluster
from outcore.placers.granularity import merge_small_pieces
from outcore.plan.pieces import cut


def _chain(n: int, fwd_s: float, nbytes: int = 4096):
    return graph_from_dict({"format": "outcore-graph/1", "name": "chain", "nodes": [
        {"id": i, "fwd_s": fwd_s} for i in range(n)],
        "edges": [{"src": i, "dst": i + 1, "bytes": nbytes} for i in range(n - 1)]})


def test_round_robin_chain_of_tiny_layers_collapses():
    g = _chain(16, 1e-6)
    cl = make_cluster(2, device="cpu", bandwidth="1.5GB/s", latency="100us")
    rr = np.arange(16) % 2
    merged = merge_small_pieces(g, rr, cl)
    assert len(cut(g, rr).pieces) == 16
    assert len(cut(g, merged).pieces) < 4


def test_pieces_that_pay_for_themselves_stay():
    g = _chain(8, 5e-3)  # 5 ms forward, 10 ms backward per layer against ~0.4 ms of price
    cl = make_cluster(2, device="cpu", bandwidth="1.5GB/s", latency="100us")
    halves = np.array([0] * 4 + [1] * 4)
    assert np.array_equal(merge_small_pieces(g, halves, cl), halves)
    rr = np.arange(8) % 2
    assert np.array_equal(merge_small_pieces(g, rr, cl), rr)


def test_a_small_piece_joins_the_neighbour_it_talks_to_most():
    # 0 -> 1 -> 2 on devices 0, 1, 2: node 1 is tiny and gets 4x the bytes from 0 than it
    # sends to 2, so it joins device 0
    g = graph_from_dict({"format": "outcore-graph/1", "name": "three", "nodes": [
        {"id": 0, "fwd_s": 1e-2}, {"id": 1, "fwd_s": 1e-7}, {"id": 2, "fwd_s": 1e-2}],
        "edges": [{"src": 0, "dst": 1, "bytes": 4 << 20}, {"src": 1, "dst": 2, "bytes": 1 << 20}]})
    cl = make_cluster(3, device="cpu", bandwidth="1.5GB/s", latency="100us")
    assert merge_small_pieces(g, np.array([0, 1, 2]), cl).tolist() == [0, 0, 2]


def test_the_search_merges_pieces_too_small_to_pay_for_themselves():
    """In ``auto``, a placement whose pieces cost more in overheads and messages than they
    compute is coarsened when the simulator finds it faster, and the plan says so; a named
    planner's placement (here the round-robin baseline) is left as asked."""
    from dataclasses import replace

    import outcore
    from outcore.search import placement as search_mod

    g = _chain(32, 2e-6)
    req = outcore.plan_request(2, bandwidth="1.5GB/s", latency="100us",
                               strategy="round-robin")
    rr = outcore.plan(g, req)
    assert len(cut(g, rr.assignment).pieces) == 32  # the baseline as asked
    # the auto search coarsening that same placement
    coarse = search_mod._coarsened(g, replace(req, strategy="auto"),
                                   _result(rr.assignment), rr, check_fit=True)
    assert coarse.predicted["iteration_s"] < rr.predicted["iteration_s"] / 5
    assert len(cut(g, coarse.assignment).pieces) < 4
    assert any(n.startswith("granularity: moved") for n in coarse.notes)


def _result(assignment):
    from outcore.placers.result import PartitionResult
    return PartitionResult(assignment=assignment, strategy="round-robin", devices_used=2,
                           makespan_s=0.0, peak_bytes=np.zeros(2), lower_bound_s=0.0)


def test_merging_stops_when_its_rounds_stop_reducing_the_small_pieces(monkeypatch):
    """A placement whose merges only make other pieces small (thousands of tiny pieces
    scattered over the devices) would run every round; the merge stops once STALL_ROUNDS rounds
    in a row begin with no fewer small pieces than the best before them. Here every round's
    three lightest pieces are too small, whatever was merged."""
    from outcore.placers import granularity

    rounds = []

    def three_lightest(pieces, cluster, scale):
        rounds.append(len(pieces.pieces))
        price = np.zeros(len(pieces.pieces))
        comp = np.array([len(p.nodes) for p in pieces.pieces], float)  # stands in for work
        price[np.argsort(comp, kind="stable")[:3]] = np.inf
        return price

    monkeypatch.setattr(granularity, "_prices_s", three_lightest)
    g = _chain(200, 1e-6)
    cl = make_cluster(4, device="cpu", bandwidth="1.5GB/s", latency="100us")
    granularity.merge_small_pieces(g, np.arange(200) % 4, cl, max_rounds=64)
    assert len(rounds) == 1 + granularity.STALL_ROUNDS


def test_the_compiled_rounds_merge_as_the_plain_ones():
    """``merge_small_pieces`` (each round one compiled pass) returns what its plain twin
    (``_merge_small_pieces_py``) does, on scattered placements of generated graphs where pieces
    move, settle after swinging back, and stop stalled."""
    from outcore.graph.generators import make
    from outcore.placers import granularity

    rng = np.random.default_rng(0)
    for family, n, k in (("rnn", 800, 4), ("nas", 600, 3), ("transformer", 700, 4),
                         ("unet", 500, 2)):
        g = make(family, n)
        for bw in ("1.5GB/s", "150GB/s"):
            cl = make_cluster(k, device="cpu", bandwidth=bw, latency="100us")
            for a in (rng.integers(0, k, g.num_nodes), np.arange(g.num_nodes) % k,
                      (np.arange(g.num_nodes) // 7) % k):
                for factor in (1.0, 30.0):
                    fast = merge_small_pieces(g, a, cl, factor=factor)
                    plain = granularity._merge_small_pieces_py(g, a, cl, factor=factor)
                    assert np.array_equal(fast, plain), (family, bw, factor)
