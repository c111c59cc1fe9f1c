"""Tensor-parallel costs against hand-computed numbers (pure: no torch)."""

from __future__ import annotations

import pytest

from outcore.cost.tensor import (
    Collective,
    collective_s,
    depth_collectives,
    depth_peak_bytes,
    phase_s,
    split_compute_s,
    split_state_bytes,
    style_collectives,
)
from outcore.errors import UsageError
from outcore.hardware.spec import LinkSpec

MiB = 1 << 20
LINK = LinkSpec(bandwidth=1e9, latency_s=0.0)  # 1 GB/s, no latency: times are bytes / 1e9


def test_compute_and_memory_divide():
    assert split_compute_s(0.8, 1.6, 4) == (0.2, 0.4)
    # a 1024 x 4096 fp32 Linear (16 MiB) with Adam (4 copies) on tp=4: 16 MiB each
    assert split_state_bytes(16 * MiB, tp=4, factor=4.0) == 16 * MiB
    # ... and sharded over a depth of 2 as well: 8 MiB resident
    assert split_state_bytes(16 * MiB, tp=4, depth=2) == 8 * MiB
    # while it runs: + its 4 MiB shard of weights gathered whole + 4 MiB of gradient
    assert depth_peak_bytes(16 * MiB, tp=4, depth=2) == 16 * MiB
    assert depth_peak_bytes(16 * MiB, tp=4, depth=1) == 16 * MiB


def test_megatron_pair_is_one_all_reduce_each_way():
    col = style_collectives("colwise", in_bytes=1000, out_bytes=4000, tp=2)
    row = style_collectives("rowwise", in_bytes=4000, out_bytes=1000, tp=2)
    assert col == (Collective(kind="all_reduce", nbytes=1000, ranks=2, phase="bwd",
                              what="input gradient"),)
    assert row == (Collective(kind="all_reduce", nbytes=1000, ranks=2, phase="fwd",
                              what="output"),)


def test_alone_and_embedding_styles():
    kinds = lambda cs: [(c.kind, c.phase, c.nbytes) for c in cs]  # noqa: E731
    assert kinds(style_collectives("colwise_gather", in_bytes=10, out_bytes=40, tp=4)) == \
        [("all_gather", "fwd", 40), ("all_reduce", "bwd", 10)]
    assert kinds(style_collectives("rowwise_alone", in_bytes=10, out_bytes=40, tp=4)) == \
        [("all_reduce", "fwd", 40), ("all_gather", "bwd", 10)]
    assert kinds(style_collectives("vocab", in_bytes=8, out_bytes=64, tp=4)) == \
        [("all_reduce", "fwd", 64)]
    assert style_collectives("whole", in_bytes=1, out_bytes=1, tp=4) == ()
    assert style_collectives("colwise", in_bytes=1, out_bytes=1, tp=1) == ()
    with pytest.raises(UsageError, match="unknown split style"):
        style_collectives("diagonal", in_bytes=1, out_bytes=1, tp=2)


def test_depth_collectives_and_times():
    cs = depth_collectives(8_000_000, 4, tp=1)
    assert [(c.kind, c.phase) for c in cs] == [("all_gather", "fwd"), ("all_gather", "bwd"),
                                               ("reduce_scatter", "bwd")]
    # ring all-gather of 8 MB over 4 ranks: 3 steps of 2 MB at 1 GB/s = 6 ms
    assert collective_s(cs[0], LINK) == pytest.approx(6e-3)
    assert phase_s(cs, "fwd", LINK) == pytest.approx(6e-3)
    assert phase_s(cs, "bwd", LINK) == pytest.approx(12e-3)
    # all-reduce of 8 MB over 4 ranks: ring 2 x 3 x 2 MB = 12 ms (= halving-doubling here)
    ar = Collective(kind="all_reduce", nbytes=8_000_000, ranks=4, phase="fwd")
    assert collective_s(ar, LINK) == pytest.approx(12e-3)
    assert depth_collectives(8_000_000, 1) == ()
    with pytest.raises(UsageError, match="depth must be a positive integer"):
        depth_collectives(10, 0)


def test_layout_node_costs_divide_split_nodes_and_pair_regions():
    import numpy as np

    from outcore.cost.tensor import layout_node_costs
    from outcore.graph.ir import build
    from outcore.graph.tensor_pairs import find_layout

    # x -> fc1 (4 -> 8) -> relu -> fc2 (8 -> 4) -> out (4 -> 3, 60 B: stays whole)
    lin = lambda i, o: {"config": {"in_features": i, "out_features": o}}  # noqa: E731
    g = build("mlp", fwd_s=[0, 4e-3, 1e-3, 4e-3, 2e-3], src=[0, 1, 2, 3], dst=[1, 2, 3, 4],
              param_bytes=[0, 160, 0, 144, 60], out_bytes=[64, 128, 128, 64, 48],
              ops=["input", "linear", "relu", "linear", "linear"],
              modules=["", "fc1", "act", "fc2", "out"],
              attrs=[{}, lin(4, 8), {}, lin(8, 4), lin(4, 3)],
              meta={"module_types": {"fc1": "Linear", "fc2": "Linear", "out": "Linear",
                                     "act": "ReLU"}})
    lay = find_layout(g, 2, min_split_bytes=100)
    assert [(p.columns, p.rows) for p in lay.pairs] == [(("fc1",), ("fc2",))]
    assert lay.split("out").style == "whole"
    c = layout_node_costs(g, lay)
    np.testing.assert_allclose(c.fwd_s, [0, 2e-3, 0.5e-3, 2e-3, 2e-3])
    np.testing.assert_allclose(c.bwd_s, 2 * c.fwd_s)
    assert c.param_bytes.tolist() == [0, 80, 0, 72, 60]
    # fc1: all-reduce of its 64-byte input's gradient (bwd); fc2: of its 64-byte output (fwd)
    assert [(x.kind, x.phase, x.nbytes) for x in c.collectives[1]] == [("all_reduce", "bwd", 64)]
    assert [(x.kind, x.phase, x.nbytes) for x in c.collectives[3]] == [("all_reduce", "fwd", 64)]
    assert 4 not in c.collectives
    # and sharded over a depth of 2: every parameter halves again, plus FSDP's collectives
    d = layout_node_costs(g, lay, depth=2)
    assert d.param_bytes.tolist() == [0, 40, 0, 36, 30]
    assert [x.kind for x in d.collectives[1]] == ["all_reduce", "all_gather", "all_gather",
                                                  "reduce_scatter"]
