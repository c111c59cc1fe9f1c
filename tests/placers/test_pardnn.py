"""ParDNN on small hand-checked graphs, including the cases that crash the reference code."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.errors import InfeasibleError
from outcore.graph.ir import build
from outcore.hardware.spec import flat_cluster
from outcore.placers import partition
from outcore.placers.context import make_context
from outcore.placers.emulate import emulate
from outcore.placers.pardnn.mapping import map_secondaries
from outcore.placers.pardnn.slicing import slice_graph

FAST = dict(bandwidth=1e12, latency_s=0.0)


def chain(n, fwd=1.0, **kw):
    return build("chain", fwd_s=[fwd] * n, src=list(range(n - 1)), dst=list(range(1, n)),
                 edge_bytes=[8] * (n - 1), **kw)


def two_chains():
    """0 -> 1 and 2 -> 3, independent; each node 1 s forward, 2 s backward."""
    return build("two", fwd_s=[1, 1, 1, 1], src=[0, 2], dst=[1, 3], edge_bytes=[8, 8])


def test_slicing_takes_successive_critical_paths():
    # a -> b (5) -> d and a -> c (1) -> d, plus an isolated heavy node e
    g = build("d", fwd_s=[1, 5, 1, 1, 3], src=[0, 0, 1, 2], dst=[1, 2, 3, 3],
              edge_bytes=[0] * 4)
    sl = slice_graph(make_context(g, 3), 3)
    # primary 0: the critical path a, b, d (21 s with backward); primary 1: the heaviest of what
    # is left (e: 9 s); primary 2: c
    assert sl.part.tolist() == [0, 0, 2, 0, 1]
    assert sl.primaries == 3 and sl.num_secondaries == 0


def test_secondaries_are_linear_paths_mapped_to_idle_devices():
    # two long parallel branches between a source and a sink; K = 2
    n_branch = 4
    fwd = [1.0] + [2.0] * (2 * n_branch) + [1.0]
    src, dst = [], []
    for b in range(2):
        ids = [1 + b * n_branch + i for i in range(n_branch)]
        src += [0] + ids[:-1] + [ids[-1]]
        dst += ids + [2 * n_branch + 1]
    g = build("fork", fwd_s=fwd, src=src, dst=dst, edge_bytes=[1] * len(src))
    ctx = make_context(g, 2, cluster=flat_cluster(2, memory_bytes=1e9, **FAST))
    sl = slice_graph(ctx, 2)
    a = map_secondaries(ctx, sl)
    # one branch with the source and sink, the other branch whole on the other device
    assert sorted(np.bincount(a).tolist()) == [n_branch, n_branch + 2]
    assert len(set(a[1:1 + n_branch].tolist())) == 1
    assert len(set(a[1 + n_branch:1 + 2 * n_branch].tolist())) == 1


def test_chain_with_more_devices_than_paths_uses_one_device():
    g = chain(5)
    r = partition(g, 4, cluster=flat_cluster(4, memory_bytes=1e9))
    assert r.devices_used == 1 and r.assignment.tolist() == [0] * 5
    assert r.makespan_s == pytest.approx(15.0)  # 5 x (1 + 2), nothing to overlap


def test_independent_chains_go_to_separate_devices():
    r = partition(two_chains(), 2)
    assert r.devices_used == 2
    assert r.assignment[0] == r.assignment[1] != r.assignment[2] == r.assignment[3]
    assert r.makespan_s == pytest.approx(6.0)  # forward 2 s in parallel, backward 4 s


def test_single_node_and_more_devices_than_nodes():
    g = build("one", fwd_s=[2.0])
    r = partition(g, 3)
    assert r.devices_used == 1 and r.makespan_s == 6.0 and r.peak_bytes.shape == (1,)
    g3 = two_chains()
    r3 = partition(g3, 8)
    assert r3.devices_used <= 4 and r3.assignment.max() < r3.devices_used


def test_zero_cost_nodes_and_zero_byte_edges_are_placed():
    g = build("z", fwd_s=[0, 0, 1, 0], bwd_s=[0, 0, 1, 0], src=[0, 0, 1, 2], dst=[1, 2, 3, 3],
              edge_bytes=[0, 0, 0, 0])
    r = partition(g, 2)
    assert r.assignment.shape == (4,) and r.makespan_s == pytest.approx(2.0)


def test_link_slower_than_one_gigabyte_per_second_keeps_fractions():
    g = two_chains().replace(edge_bytes=np.array([10**8, 10**8]))
    cl = flat_cluster(2, memory_bytes=1e12, bandwidth=0.4e9, latency_s=1e-5)
    r = partition(g, 2, cluster=cl)
    em = emulate(g, r.assignment, cl, devices=2)
    assert r.makespan_s == pytest.approx(em.makespan_s)
    assert r.makespan_s == pytest.approx(6.0)  # the chains stay whole: no transfer at all


def test_communication_heavy_graph_stays_on_one_device():
    g = build("fork", fwd_s=[1, 1, 1, 1], src=[0, 0, 1, 2], dst=[1, 2, 3, 3],
              edge_bytes=[10**9] * 4)
    cl = flat_cluster(2, memory_bytes=1e12, bandwidth=1e8, latency_s=1e-3)  # 10 s per edge
    r = partition(g, 2, cluster=cl)
    assert r.devices_used == 1 and r.makespan_s == pytest.approx(12.0)
    assert any("1 device" in note for note in r.notes)


def test_memory_limit_forces_a_split_that_fits():
    # four 100-byte parameter nodes: 400 bytes each with Adam; 800 bytes per device
    g = chain(4, param_bytes=[100] * 4).replace(edge_bytes=np.zeros(3, np.int64),
                                                out_bytes=np.zeros(4, np.int64),
                                                saved_bytes=np.zeros(4, np.int64))
    r = partition(g, 2, memory_bytes=800)
    assert r.devices_used == 2 and (r.peak_bytes <= 800).all()
    assert sorted(np.bincount(r.assignment).tolist()) == [2, 2]


def test_infeasible_names_the_smallest_device_count_and_memory():
    g = chain(4, param_bytes=[100] * 4).replace(edge_bytes=np.zeros(3, np.int64),
                                                out_bytes=np.zeros(4, np.int64),
                                                saved_bytes=np.zeros(4, np.int64))
    with pytest.raises(InfeasibleError) as info:
        partition(g, 1, memory_bytes=800)
    e = info.value
    assert e.min_devices == 2 and e.min_memory_bytes == pytest.approx(1600, abs=2)
    assert "use 2 devices" in str(e) and "\n" not in str(e)
    with pytest.raises(InfeasibleError) as info:
        partition(g, 3, memory_bytes=300)  # one node alone needs 400 bytes
    assert info.value.min_devices is None and "no number of devices" in str(info.value)


def test_result_is_deterministic_and_never_slower_than_one_device():
    g = build("mix", fwd_s=[1, 3, 2, 2, 1, 1], src=[0, 0, 0, 1, 2, 3, 4],
              dst=[1, 2, 3, 4, 4, 5, 5], edge_bytes=[10**6] * 7,
              param_bytes=[10, 20, 30, 40, 50, 60])
    cl = flat_cluster(3, memory_bytes=1e9, bandwidth=1e9, latency_s=1e-4)
    r1 = partition(g, 3, cluster=cl)
    r2 = partition(g, 3, cluster=cl)
    assert r1.assignment.tolist() == r2.assignment.tolist() and r1.notes == r2.notes
    one = emulate(g, np.zeros(6, np.int64), cl, devices=3).makespan_s
    assert r1.makespan_s <= one
    assert r1.lower_bound_s <= r1.makespan_s


def test_device_counts_below_the_memory_floor_are_not_tried():
    """Under a limit that 2 devices cannot hold (1.25x the fair share of 4), ParDNN and the
    contiguous splits try only 4 devices (and the 1-device reference), and still fit."""
    from outcore.graph.generators import make
    from outcore.placers import placements
    g = make("transformer", 600, seed=1)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    r = partition(g, 4, memory_bytes=1.25 * one / 4, strategy="pardnn")
    assert any("K=2: not tried" in n for n in r.notes)
    assert not any("K=2: step 1" in n for n in r.notes)
    assert r.peak_bytes.max() <= 1.25 * one / 4
    offered = placements(g, 4, strategy="contiguous", memory_bytes=1.25 * one / 4)
    labels = [c.notes[-1] for c in offered]
    assert labels and not any(", 2 devices" in label for label in labels)
    # without the limit both device counts are tried
    free = partition(g, 4, strategy="pardnn")
    assert any("K=2: step 1" in n for n in free.notes)
