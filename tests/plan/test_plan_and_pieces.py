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
    assert doc["format"] == "outcore-plan/2"
    assert doc["assignment"] == {"0": 0, "10": 0, "20": 1, "30": 1}
    assert doc["predicted"]["iteration_s"] == 1.5
    q = align(load(save(p, tmp_path / "p.json")), g)
    np.testing.assert_array_equal(q.assignment, p.assignment)
    assert q.graph["fingerprint"] == fingerprint(g)
    q.check(g)


def test_typed_fields_round_trip(tmp_path):
    """Layout, memory policies and the cluster are typed fields, written and read back as such."""
    from outcore.hardware.cluster import make_cluster
    from outcore.plan import Layout, MemoryPolicies
    g = chain()
    cl = make_cluster(4, "1GiB", "10GB/s", "5us", device="a100", host_cores=2)
    pol = MemoryPolicies(np.array([-1, 0, 0, -1]), ("checkpoint",))
    p = make_plan(g, np.array([0, 0, 1, 1]), strategy="pipeline", devices=4,
                  memory_bytes=2**30, layout=Layout.replicate("mast", 2, 2, 2), policies=pol,
                  cluster=cl,
                  notes=("tried pipeline",), devices_used=2, extra={"mine": [1, 2]})
    q = align(load(save(p, tmp_path / "p.json")), g)
    assert q.layout == p.layout and q.layout.copies == 4 and q.layout.maps == ((0, 1), (1, 0))
    np.testing.assert_array_equal(q.policies.group_of, pol.group_of)
    assert q.policies.policies == ("checkpoint",)
    assert q.cluster == cl.with_memory(2**30)
    assert q.notes == ("tried pipeline",) and q.devices_used == 2 and q.extra == {"mine": [1, 2]}


def test_version_1_files_are_still_read():
    """An outcore-plan/1 document (replication, policies and a flat cluster at the top level)."""
    g = chain()
    doc = {"format": "outcore-plan/1", "strategy": "pipeline", "devices": 4,
           "memory_bytes": 1e9, "assignment": {"0": 0, "10": 0, "20": 1, "30": 1},
           "schedule": "gpipe", "microbatches": 2,
           "parallel": {"mode": "mast", "replicas": 2, "dp": 2, "maps": [[0, 1], [1, 0]]},
           "memory_policy": {"groups": [{"policy": "checkpoint", "device": 1, "nodes": 1}],
                             "node_group": {"20": 0}},
           "cluster": {"bandwidth": 5e9, "latency_s": 1e-5, "device": "cpu",
                       "host_is_device": True, "host_cores": 2},
           "notes": ["a"], "devices_used": 2, "custom": 7}
    p = align(from_dict(doc), g)
    assert p.layout.mode == "mast" and p.layout.dp == 2 and p.layout.copies == 4
    assert p.policies.group_of.tolist() == [-1, -1, 0, -1]
    assert p.cluster.intra.bandwidth == 5e9 and p.cluster.host_cores == 2
    assert p.cluster.device.host_is_device and p.cluster.device.memory_bytes == 1e9
    assert p.notes == ("a",) and p.extra == {"custom": 7} and p.schedule == "gpipe"


def test_plans_are_validated_on_load():
    """A plan that puts a node outside its devices is refused when read, naming the device."""
    doc = {"format": "outcore-plan/2", "strategy": "x", "devices": 2,
           "assignment": {"0": 0, "1": 5}}
    with pytest.raises(PlanError, match="device 5"):
        from_dict(doc)
    with pytest.raises(PlanError, match="device -1"):
        from_dict({**doc, "assignment": {"0": 0, "1": -1}})
    with pytest.raises(PlanError, match="schedule"):
        from_dict({**doc, "assignment": {"0": 0, "1": 1}, "schedule": "zigzag"})
    with pytest.raises(FormatError, match="memory policy"):
        from_dict({**doc, "assignment": {"0": 0, "1": 1},
                   "memory_policy": {"groups": [{"policy": "magic"}], "node_group": {}}})


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
    # every crossing edge is carried by the transfer between its pieces, or (a tensor another
    # piece of the consumer's device takes from the producer's device too) handed on by the
    # first such piece, which receives it; a tensor crosses to a device once
    dev = [p.device for p in P.pieces]
    for s, d in pairs:
        ps, pd = P.piece_of[s], P.piece_of[d]
        if ps != pd:
            t = [t for t in P.transfers if t.dst == pd and s in t.tensors]
            assert len(t) == 1
            if t[0].src != ps:  # relayed
                first = t[0].src
                assert t[0].local and dev[first] == dev[pd] != dev[ps] and first < pd
                assert any(u.src == ps and u.dst == first and s in u.tensors
                           for u in P.transfers)
    into = [(s, dev[t.dst]) for t in P.transfers if not t.local for s in t.tensors]
    assert len(into) == len(set(into))


def test_a_weight_node_lives_with_its_consumers():
    """A ``param`` node (an exported graph's weight read) placed apart from its only consumer's
    device moves there; one used on two devices (a tied weight) stays."""
    g = build("w", fwd_s=[1.0] * 5, src=[0, 1, 2, 3, 3], dst=[2, 2, 4, 4, 2],
              edge_bytes=[8] * 5, ops=["input", "param", "linear", "param", "linear"])
    p = make_plan(g, np.array([0, 0, 1, 1, 1]), strategy="manual", devices=2,
                  memory_bytes=None)
    np.testing.assert_array_equal(p.assignment, [0, 1, 1, 1, 1])  # param 1 joins node 2
    p = make_plan(g, np.array([0, 0, 0, 0, 1]), strategy="manual", devices=2,
                  memory_bytes=None)
    np.testing.assert_array_equal(p.assignment, [0, 0, 0, 0, 1])  # param 3 feeds 2 and 4


def test_a_message_departs_after_only_the_work_it_needs():
    """RNN grid of three layers x T steps, layers 0 and 1 on device 0, layer 2 on device 1:
    device 0's time steps are separate pieces (layer 0 of step t with layer 1 of step t), so
    the message of step t leaves after step t, not after every step of layer 0."""
    T = 6
    src, dst = [], []
    for layer in range(3):
        src += [layer * T + t for t in range(T - 1)]  # along time
        dst += [layer * T + t + 1 for t in range(T - 1)]
    for layer in range(2):
        src += [layer * T + t for t in range(T)]  # up the layers
        dst += [(layer + 1) * T + t for t in range(T)]
    g = build("grid", fwd_s=[1.0] * (3 * T), src=src, dst=dst, edge_bytes=[4] * len(src))
    P = cut(g, np.array([0] * (2 * T) + [1] * T))
    assert [p.nodes for p in P.pieces if p.device == 0] == [(t, T + t) for t in range(T)]
    assert [len(P.outputs_of[p.id]) for p in P.pieces if p.device == 0] == [2] * (T - 1) + [1]


def test_work_feeding_no_earlier_message_runs_as_early_as_it_can():
    """Fork on device 0 to a branch on device 1 and a branch kept on device 0, joined on
    device 0: device 0's own branch runs right after the fork's message leaves (while device 1
    works), not after the other branch comes back."""
    # 0 fork -> 1 (device 1) -> 3 join; 0 -> 2 (device 0's branch) -> 3 -> 4 -> 5 (device 1)
    g = build("fork", fwd_s=[1.0] * 6, src=[0, 0, 1, 2, 3, 4], dst=[1, 2, 3, 3, 4, 5],
              edge_bytes=[4] * 6)
    P = cut(g, np.array([0, 1, 0, 0, 0, 1]))
    hop = {v: p.hop for p in P.pieces for v in p.nodes}
    assert hop[2] == hop[0] + 1 < hop[3]


@pytest.mark.parametrize("named", [True, False])
def test_copies_names_are_made_when_read_and_equal_the_plain_list(named):
    """A replicated plan's graph names its nodes ``c<k>/<name>`` copy after copy; the names are
    made per read (four copies of a 1M-node graph: 4M strings a simulation never reads)."""
    import pickle

    from outcore.plan.layout import Layout
    from outcore.plan.replicas import copy_of, copy_prefix, expand, fx_name

    g = build("t", fwd_s=[1.0, 2.0, 3.0], src=[0, 1], dst=[1, 2], ids=[7, 8, 9],
              names=["a", "b", "c"] if named else None)
    lay = Layout.replicate("mp", 1, 1, 2)
    p = make_plan(g, np.zeros(3, np.int64), strategy="t", devices=lay.ranks(1),
                  memory_bytes=None, layout=lay)
    big, _, copies = expand(g, p)
    base = ["a", "b", "c"] if named else ["n7", "n8", "n9"]
    plain = [copy_prefix(c) + name for c in range(copies) for name in base]
    assert copies == 2 and len(big.names) == 6
    assert list(big.names) == plain and big.names == tuple(plain)
    assert big.names[-1] == plain[-1] and big.names[1:4] == tuple(plain[1:4])
    assert [big.name_of(i) for i in range(6)] == plain
    assert [copy_of(n) for n in big.names] == [0, 0, 0, 1, 1, 1]
    assert [fx_name(n) for n in big.names] == base * 2
    assert pickle.loads(pickle.dumps(big.names)) == tuple(plain)
    with pytest.raises(IndexError):
        big.names[6]


def test_fingerprint_is_made_once_and_kept_by_copies_with_the_same_structure():
    from outcore.graph.generators import make

    g = make("rnn", 300)
    fp = fingerprint(g)
    assert g.__dict__["fingerprint"] == fp == fingerprint(g)
    rescaled = g.replace(fwd_s=g.fwd_s * 2)  # costs only: the same structure
    assert rescaled.__dict__.get("fingerprint") == fp
    other = g.replace(dst=g.dst[::-1].copy(), src=g.src[::-1].copy())  # reordered edges
    assert "fingerprint" not in other.__dict__ and fingerprint(other) != fp


def test_a_copied_name_knows_the_name_it_copies():
    from outcore.plan.replicas import Copied

    g = build("t", fwd_s=[1.0, 2.0], src=[0], dst=[1], names=["a", "b"])
    names = Copied(g.name_of, 2, 3, True)
    assert [names.uncopied(i) for i in range(6)] == ["a", "b"] * 3
    assert names[3] == "c1/b"


@pytest.mark.parametrize("family", ["rnn", "nas", "unet"])
def test_copies_adjacency_is_the_one_their_edges_give(family):
    """``expand`` gives the copies the graph's adjacency copy by copy instead of sorting four
    times the edges again: the same arrays (values and types) as built from the copies' edges."""
    from outcore.graph.generators import make
    from outcore.graph.ir import _csr
    from outcore.plan.layout import Layout
    from outcore.plan.replicas import expand

    g = make(family, 400)
    lay = Layout.replicate("mast", 2, 2, 2)
    a = np.arange(g.num_nodes, dtype=np.int64) * 2 // g.num_nodes
    p = make_plan(g, a, strategy="t", devices=lay.ranks(2), memory_bytes=None, layout=lay)
    big, _, copies = expand(g, p)
    assert copies == 4 and big.num_nodes == 4 * g.num_nodes
    for cache, (x, y) in (("_succ", (big.src, big.dst)), ("_pred", (big.dst, big.src))):
        made = big.__dict__[cache]
        for mine, ref in zip(made, _csr(x, y, big.num_nodes)):
            assert mine.dtype == ref.dtype and np.array_equal(mine, ref)
