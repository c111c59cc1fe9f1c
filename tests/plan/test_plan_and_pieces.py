import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from outcore.errors import FormatError, PlanError
from outcore.graph import build
from outcore.plan import align, cut, fingerprint, load, make_plan, save
from outcore.plan.plan import from_dict, to_dict


def chain(n=4):
    return build("chain", fwd_s=[1.0] * n, src=list(range(n - 1)), dst=list(range(1, n)),
                 edge_bytes=[8] * (n - 1), ids=[10 * i for i in range(n)])


def test_plan_round_trip_and_design_fields(tmp_path):
    g = chain()
    p = make_plan(g, np.array([0, 0, 1, 1]), strategy="pipeline", devices=2,
                  memory_bytes=2**30, predicted={"iteration_s": 1.5, "peak_bytes": [1, 2]})
    doc = to_dict(p)
    assert doc["format"] == "outcore-plan/1"
    assert doc["assignment"] == {"0": 0, "10": 0, "20": 1, "30": 1}
    assert doc["predicted"]["iteration_s"] == 1.5
    q = align(load(save(p, tmp_path / "p.json")), g)
    np.testing.assert_array_equal(q.assignment, p.assignment)
    assert q.graph["fingerprint"] == fingerprint(g)
    q.check(g)


def test_plan_errors():
    g = chain()
    with pytest.raises(PlanError, match="outside"):
        make_plan(g, np.array([0, 0, 1, 5]), strategy="x", devices=2, memory_bytes=None)
    with pytest.raises(FormatError, match="is this a graph"):
        from_dict({"format": "outcore-graph/1"})
    other = build("other", fwd_s=[1.0] * 4, src=[0, 0, 0], dst=[1, 2, 3],
                  ids=[0, 10, 20, 30])
    p = make_plan(g, np.zeros(4, dtype=int), strategy="x", devices=1, memory_bytes=None)
    with pytest.raises(PlanError, match="different graph"):
        p.check(other)


def test_pieces_of_a_pipeline():
    P = cut(chain(6), np.array([0, 0, 1, 1, 2, 2]))
    assert [p.nodes for p in P.pieces] == [(0, 1), (2, 3), (4, 5)]
    assert [(t.src, t.dst, t.tensors, t.local) for t in P.transfers] == [
        (0, 1, (1,), False), (1, 2, (3,), False)]


def test_rank_holding_both_sides_of_another_rank_gets_two_pieces():
    # a -> b -> c with a skip a -> c; a, c on device 0, b on device 1
    g = build("skip", fwd_s=[1, 1, 1], src=[0, 1, 0], dst=[1, 2, 2], edge_bytes=[4, 4, 4])
    P = cut(g, np.array([0, 1, 0]))
    assert [(p.device, p.nodes) for p in P.pieces] == [(0, (0,)), (1, (1,)), (0, (2,))]
    kinds = {(t.src, t.dst): t.local for t in P.transfers}
    assert kinds == {(0, 1): False, (0, 2): True, (1, 2): False}


def test_parallel_branches_on_one_device_are_separate_pieces():
    # fork 0 -> {1, 2} -> 3; the branches on device 1 depend on nothing else there
    g = build("fork", fwd_s=[1] * 4, src=[0, 0, 1, 2], dst=[1, 2, 3, 3])
    P = cut(g, np.array([0, 1, 1, 0]))
    assert sorted(p.nodes for p in P.pieces if p.device == 1) == [(1,), (2,)]


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 25), st.integers(1, 4), st.integers(0, 10**6))
def test_piece_graph_is_acyclic_and_covers_every_node(n, k, seed):
    rng = np.random.default_rng(seed)
    pairs = sorted({(int(a), int(b)) for a, b in rng.integers(0, n, (2 * n, 2)) if a < b})
    g = build("r", fwd_s=np.ones(n), src=[a for a, _ in pairs], dst=[b for _, b in pairs])
    a = rng.integers(0, k, n)
    P = cut(g, a)
    covered = sorted(v for p in P.pieces for v in p.nodes)
    assert covered == list(range(n))
    for p in P.pieces:
        assert all(a[v] == p.device for v in p.nodes)
    # piece ids are a topological order of the piece graph
    assert all(t.src < t.dst for t in P.transfers)
    # every crossing edge is carried by exactly the transfer between its pieces
    for s, d in pairs:
        ps, pd = P.piece_of[s], P.piece_of[d]
        if ps != pd:
            t = [t for t in P.transfers if (t.src, t.dst) == (ps, pd)]
            assert len(t) == 1 and s in t[0].tensors
