import numpy as np
import pytest

from outcore.errors import UsageError
from outcore.graph import build, collapse
from outcore.graph.algorithms import topological_order
from outcore.graph.coarsen import block_key, groups


def layered():
    # x -> a.p -> a.q -> b -> c.r -> out ; skip a.p -> c.r ; root-level op "add" between b and c
    names = ["x", "a_p", "a_q", "b", "add", "c_r", "output"]
    modules = ["", "a.p", "a.q", "b", "", "c.r", ""]
    ops = ["input", "linear", "relu", "linear", "add", "linear", "output"]
    src = [0, 1, 2, 3, 1, 4, 5]
    dst = [1, 2, 3, 4, 4, 5, 6]
    return build("m", fwd_s=[0, 1, 2, 3, 0.5, 4, 0], src=src, dst=dst,
                 edge_bytes=[8, 16, 16, 32, 16, 32, 4], param_bytes=[0, 10, 0, 20, 0, 30, 0],
                 saved_bytes=[0, 1, 2, 3, 4, 5, 0], names=names, modules=modules, ops=ops,
                 meta={"module_types": {"a": "Block", "c": "Head"}})


def test_block_keys():
    assert block_key("layer1.0.conv1", 1) == "layer1"
    assert block_key("layer1.0.conv1", 2) == "layer1.0"
    assert block_key("fc", 1) == "fc"
    assert block_key("fc", 3) is None  # a leaf shallower than the depth stays its own node
    assert block_key("", 1) is None
    assert block_key("", 0) == ""


def test_depth_one_blocks_costs_and_edges():
    c = collapse(layered(), 1)
    assert list(c.names) == ["x", "a", "b", "add", "c", "output"]
    assert c.ops[1] == "Block" and c.ops[4] == "Head"
    np.testing.assert_allclose(c.fwd_s, [0, 3, 3, 0.5, 4, 0])
    np.testing.assert_array_equal(c.param_bytes, [0, 10, 20, 0, 30, 0])
    np.testing.assert_array_equal(c.saved_bytes, [0, 3, 3, 4, 5, 0])
    edges = {(c.names[s], c.names[d]): b for s, d, b in
             zip(c.src.tolist(), c.dst.tolist(), c.edge_bytes.tolist())}
    # a sends a.q's output to b and a.p's output (the skip) to add: two tensors, two edges
    assert edges == {("x", "a"): 8, ("a", "b"): 16, ("a", "add"): 16, ("b", "add"): 32,
                     ("add", "c"): 32, ("c", "output"): 4}
    assert c.out_bytes[1] == 32  # two distinct tensors leave block a
    assert c.attrs[1]["members"] == [1, 2]


def test_depth_zero_is_whole_model_and_none_is_identity():
    g = layered()
    c = collapse(g, 0)
    assert list(c.names) == ["x", "m", "output"]
    assert c.fwd_s.sum() == pytest.approx(g.fwd_s.sum())
    assert collapse(g, None) is g
    with pytest.raises(UsageError):
        collapse(g, -1)


def test_a_module_called_twice_gives_two_blocks_and_stays_acyclic():
    # shared.lin called, then "mid", then shared.lin again
    g = build("s", fwd_s=[0, 1, 1, 1, 0], src=[0, 1, 2, 3], dst=[1, 2, 3, 4],
              names=["x", "lin", "mid", "lin_1", "output"],
              modules=["", "shared.lin", "mid", "shared.lin", ""],
              ops=["input", "linear", "tanh", "linear", "output"])
    c = collapse(g, 1)
    assert list(c.names) == ["x", "shared", "mid", "shared#2", "output"]
    assert topological_order(c).size == c.num_nodes


def test_groups_cover_every_node_once():
    g = layered()
    for depth in range(4):
        group, names = groups(g, depth)
        assert group.min() == 0 and group.max() == len(names) - 1
