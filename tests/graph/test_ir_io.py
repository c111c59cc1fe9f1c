import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from outcore.errors import FormatError, GraphError
from outcore.graph import build, from_dict, load, save, to_dict
from outcore.graph.algorithms import (
    critical_path,
    depth_levels,
    find_cycle,
    longest_from_sources,
    longest_to_sinks,
    topological_order,
    weakly_connected_components,
)


def diamond():
    #   0 -> 1 -> 3
    #   0 -> 2 -> 3
    return build("diamond", fwd_s=[1.0, 2.0, 5.0, 1.0], src=[0, 0, 1, 2], dst=[1, 2, 3, 3],
                 edge_bytes=[10, 20, 30, 40], param_bytes=[0, 100, 200, 0])


def test_defaults_follow_design():
    g = diamond()
    np.testing.assert_array_equal(g.bwd_s, 2 * g.fwd_s)
    np.testing.assert_array_equal(g.out_bytes, [20, 30, 40, 0])  # largest outgoing edge
    np.testing.assert_array_equal(g.saved_bytes, g.out_bytes)
    np.testing.assert_array_equal(g.successors(0), [1, 2])
    np.testing.assert_array_equal(g.predecessors(3), [1, 2])


def test_minimal_design_document_is_accepted():
    doc = {"format": "outcore-graph/1", "name": "resnet50", "batch_size": 32,
           "nodes": [{"id": 7, "fwd_s": 0.0012}, {"id": 3, "fwd_s": 0.5, "op": "linear"}],
           "edges": [{"src": 7, "dst": 3, "bytes": 802816}]}
    g = from_dict(doc)
    assert g.num_nodes == 2 and g.batch_size == 32
    assert g.bwd_s.tolist() == [0.0024, 1.0]
    assert g.out_bytes.tolist() == [802816, 0]
    assert g.index_of_id == {7: 0, 3: 1}


def test_round_trip_keeps_everything(tmp_path):
    g = build("t", fwd_s=[1e-3, 2e-3], bwd_s=[5e-3, 1e-3], src=[0], dst=[1], edge_bytes=[64],
              ids=[10, 20], names=["a", "b"], ops=["conv2d", "relu"], modules=["m.a", "m"],
              attrs=[{"shape": [2, 3]}, {"flops": 5}], param_bytes=[4, 0], saved_bytes=[7, 9],
              batch_size=4, meta={"source": "test"})
    path = save(g, tmp_path / "g.json")
    h = load(path)
    for field in ("ids", "fwd_s", "bwd_s", "param_bytes", "out_bytes", "saved_bytes", "src",
                  "dst", "edge_bytes"):
        np.testing.assert_array_equal(getattr(h, field), getattr(g, field), err_msg=field)
    assert h.names == g.names and h.ops == g.ops and h.modules == g.modules
    assert h.attrs == g.attrs and h.meta == g.meta and h.batch_size == 4


@pytest.mark.parametrize("doc,message", [
    ({"format": "outcore-plan/1"}, "is this a plan"),
    ({"format": "outcore-graph/1", "nodes": [{"fwd_s": 1}]}, "integer 'id'"),
    ({"format": "outcore-graph/1", "nodes": [{"id": 1}]}, "no 'fwd_s'"),
    ({"format": "outcore-graph/1", "nodes": [{"id": 1, "fwd_s": -1}]}, "non-negative"),
    ({"format": "outcore-graph/1", "nodes": [{"id": 1, "fwd_s": 1}, {"id": 1, "fwd_s": 1}]},
     "used twice"),
    ({"format": "outcore-graph/1", "nodes": [{"id": 1, "fwd_s": 1}],
      "edges": [{"src": 1, "dst": 2, "bytes": 1}]}, "not a node id"),
    ({"format": "outcore-graph/1", "nodes": [{"id": 1, "fwd_s": 1}, {"id": 2, "fwd_s": 1}],
      "edges": [{"src": 1, "dst": 2, "bytes": 1}, {"src": 2, "dst": 1, "bytes": 1}]},
     "cycle"),
    ({"format": "outcore-graph/1", "nodes": [{"id": 1, "fwd_s": 1}],
      "edges": [{"src": 1, "dst": 1}]}, "needs 'src', 'dst' and 'bytes'"),
    ({"format": "outcore-graph/1", "nodes": [{"id": 1, "fwd_s": "fast"}]}, "finite number"),
])
def test_bad_graphs_fail_with_one_clear_message(doc, message):
    with pytest.raises((GraphError, FormatError), match=message):
        from_dict(doc)


def test_load_reports_file_problems(tmp_path):
    with pytest.raises(FormatError, match="does not exist"):
        load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        load(bad)


def test_algorithms_on_diamond():
    g = diamond()
    assert topological_order(g).tolist() == [0, 1, 2, 3]
    assert depth_levels(g).tolist() == [0, 1, 1, 2]
    w = g.fwd_s
    tl = longest_from_sources(g, w, np.zeros(4))
    assert tl.tolist() == [0.0, 1.0, 1.0, 6.0]
    bl = longest_to_sinks(g, w, np.zeros(4))
    assert bl.tolist() == [7.0, 3.0, 6.0, 1.0]
    length, path = critical_path(g, node_w=w)
    assert length == 7.0 and path == [0, 2, 3]
    # edge weights change the critical path: the 0->1->3 side gets expensive edges
    length, path = critical_path(g, node_w=w, edge_w=np.array([10.0, 0, 10.0, 0]))
    assert length == 24.0 and path == [0, 1, 3]


def test_topological_order_of_unsorted_ids_and_cycle_detection():
    g = build("u", fwd_s=[1, 1, 1], src=[2, 1], dst=[1, 0])
    order = topological_order(g).tolist()
    assert order.index(2) < order.index(1) < order.index(0)
    cyc = build("c", fwd_s=[1, 1, 1], src=[0, 1, 2], dst=[1, 2, 0], check=False)
    assert set(find_cycle(cyc)) == {0, 1, 2}


def test_components():
    g = build("cc", fwd_s=[1] * 5, src=[0, 3], dst=[1, 4])
    assert weakly_connected_components(g).tolist() == [0, 0, 1, 2, 2]


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 30), st.integers(0, 10_000))
def test_random_dags_round_trip_and_order(n, seed):
    rng = np.random.default_rng(seed)
    pairs = {(int(a), int(b)) for a, b in rng.integers(0, n, (2 * n, 2)) if a < b}
    src = [a for a, _ in sorted(pairs)]
    dst = [b for _, b in sorted(pairs)]
    perm = rng.permutation(n)  # store nodes in a shuffled order with shuffled ids
    inv = np.argsort(perm)
    g = build("r", fwd_s=rng.random(n)[perm], src=inv[src], dst=inv[dst],
              edge_bytes=rng.integers(0, 100, len(src)), ids=rng.permutation(10 * n)[:n])
    order = topological_order(g)
    pos = np.empty(n, dtype=int)
    pos[order] = np.arange(n)
    assert (pos[g.src] < pos[g.dst]).all()
    h = from_dict(json.loads(json.dumps(to_dict(g))))
    np.testing.assert_array_equal(h.src, g.src)
    np.testing.assert_allclose(h.fwd_s, g.fwd_s)


def _docs():
    import outcore
    from outcore.graph.generators import make

    yield to_dict(make("rnn", 500))
    yield to_dict(outcore.model_graph("outcore:mlp", costs="estimate:cpu"))  # attrs, modules
    yield {"format": "outcore-graph/1", "nodes": [
        {"id": 9, "fwd_s": 1, "bwd_s": None, "name": None, "extra": [1]},
        {"id": 2, "fwd_s": 0.5, "out_bytes": 7, "saved_bytes": 3, "op": "relu"},
        {"id": 4, "fwd_s": None, "param_bytes": 2**40}],
        "edges": [{"src": 9, "dst": 4, "bytes": 10}, {"src": 2, "dst": 4, "bytes": 0.5}]}
    yield {"format": "outcore-graph/1", "nodes": [], "edges": []}


@pytest.mark.parametrize("doc", list(_docs()), ids=["rnn", "mlp", "mixed", "empty"])
def test_reading_by_columns_equals_reading_entry_by_entry(doc):
    """The fast reading of a well-formed file gives what the checked one-by-one reading gives
    (which also names the entry of a file that is not well formed)."""
    from outcore.graph import io

    fast = io._columns(doc["nodes"], doc["edges"])
    slow = io._entries(doc["nodes"], doc["edges"], "doc")
    assert fast is not None
    for a, b in zip(fast, slow):
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
                assert a[k].dtype == b[k].dtype
        elif isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype
        else:
            assert a == b


@pytest.mark.parametrize("node,edge", [
    ({"id": True, "fwd_s": 1}, None), ({"id": 1.0, "fwd_s": 1}, None),
    ({"id": 1, "fwd_s": float("nan")}, None), ({"id": 1, "fwd_s": 1, "bwd_s": "2"}, None),
    ({"id": 1, "fwd_s": 1}, {"src": 1, "dst": 7, "bytes": 1}),
    ({"id": 1, "fwd_s": 1}, {"src": 1, "dst": 1, "bytes": -1}), ({"id": 5, "fwd_s": 1}, None),
])
def test_entries_the_fast_reading_leaves_to_the_checked_one(node, edge):
    from outcore.graph import io

    assert io._columns([node, {"id": 5, "fwd_s": 1}], [edge] if edge else []) is None
