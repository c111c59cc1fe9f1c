"""All-reduce cost models and the data-parallel layout on a cluster, against hand-computed
figures."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.errors import UsageError
from outcore.graph import build as gbuild
from outcore.hardware.cluster import from_dict as _cluster_from_dict
from outcore.hardware.collectives import (
    Phases,
    allreduce_s,
    dp_allreduce,
    flat_ring_allreduce,
    hierarchical_allreduce,
    peer_layout,
    rhd_allreduce_s,
    ring_allreduce_s,
    ring_reduce_scatter_s,
)
from outcore.hardware.spec import Cluster, DeviceSpec, LinkSpec
from outcore.plan import make_plan
from outcore.sim import simulate

LINK = LinkSpec(bandwidth=1e9, latency_s=1e-5)


def test_ring_reduce_scatter_is_half_the_all_reduce():
    assert ring_reduce_scatter_s(8e9, 8, LINK) == pytest.approx(7 * (1e-5 + 1.0))
    assert ring_allreduce_s(8e9, 8, LINK) == pytest.approx(2 * ring_reduce_scatter_s(8e9, 8, LINK))
    assert ring_reduce_scatter_s(8e9, 1, LINK) == 0


def test_rabenseifner_power_of_two():
    # 2 lg 8 alpha + 2 * 7/8 * 8 GB / 1 GB/s
    assert rhd_allreduce_s(8e9, 8, LINK) == pytest.approx(6e-5 + 14.0)


def test_rabenseifner_folds_extra_processes():
    # p = 6 -> p' = 4: 2 lg 4 alpha + 2 * 3/4 * 8 s, plus 2 (alpha + 8 s) for the 2 extras
    assert rhd_allreduce_s(8e9, 6, LINK) == pytest.approx(4e-5 + 12.0 + 2e-5 + 16.0)
    assert rhd_allreduce_s(8e9, 1, LINK) == 0


def test_auto_picks_the_faster():
    # large message on 8: rhd pays 6 latencies, ring 14; same bandwidth term
    assert allreduce_s(8e9, 8, LINK, "auto") == pytest.approx(rhd_allreduce_s(8e9, 8, LINK))
    # 6 processes: rhd's fold-in costs 16 s more than ring's 2 * 5/6 * 8 s
    assert allreduce_s(8e9, 6, LINK, "auto") == pytest.approx(ring_allreduce_s(8e9, 6, LINK))
    with pytest.raises(UsageError):
        allreduce_s(1.0, 2, LINK, "butterfly")


def test_peer_layout():
    # groups of 4 ranks, 8 devices per node, 4 copies: copies 0,1 on node 0, copies 2,3 on node 1
    assert peer_layout(1, 4, 4, 8) == (2, 2)
    # groups of 8 ranks over nodes of 4: rank 5 of copies 0..2 on devices 5, 13, 21
    assert peer_layout(5, 8, 3, 4) == (1, 3)
    # every copy in one node
    assert peer_layout(0, 1, 4, 4) == (4, 1)


def test_hierarchical_by_hand():
    intra, inter = LinkSpec(10e9, 0.0), LinkSpec(1e9, 0.0)
    ph = hierarchical_allreduce(1.2e9, 2, 2, intra, inter, "ring", node=0)
    # reduce-scatter in the node: 1 step of 0.6 GB at 10 GB/s; ring over 2 nodes of the whole
    # 1.2 GB through the port: 2 * 1 * 0.6 GB at 1 GB/s; all-gather as the reduce-scatter
    assert (ph.intra_s, ph.inter_s, ph.after_s) == pytest.approx((0.06, 1.2, 0.06))
    assert ph.node == 0 and ph.total_s == pytest.approx(1.32)
    # one node: no inter-node phase, no port
    one = hierarchical_allreduce(1.2e9, 4, 1, intra, inter)
    assert one.inter_s == 0 and one.node is None
    assert one.total_s == pytest.approx(2 * 3 * 0.3e9 / 10e9)


def test_flat_ring_runs_at_the_inter_node_link():
    intra, inter = LinkSpec(10e9, 0.0), LinkSpec(1e9, 0.0)
    ph = flat_ring_allreduce(4e9, 4, 2, intra, inter, node=1)
    assert ph == Phases(0.0, 2 * 3 * 1e9 / 1e9, 0.0, 1)
    assert flat_ring_allreduce(4e9, 4, 1, intra, inter).total_s == pytest.approx(0.6)


def test_dp_allreduce_falls_back_to_one_link_on_a_small_cluster():
    cl = Cluster(DeviceSpec("d", 1e9, 1e12, 1e12), nodes=2, devices_per_node=2,
                 intra=LinkSpec(10e9, 0.0), inter=LinkSpec(1e9, 0.0))
    # 4 ranks x dp 4 do not fit 4 devices: flat ring over the inter-node link, no port
    ph = dp_allreduce(cl, 4, 4, 0, 4e9)
    assert ph == Phases(2 * 3 * 1e9 / 1e9)
    assert dp_allreduce(cl, 4, 1, 0, 4e9) == Phases()
    with pytest.raises(UsageError):
        dp_allreduce(cl, 1, 4, 0, 4e9, collective="tree")


def _two_stage_dp(devices_per_node: int, nodes: int, collective: str = "auto"):
    # stage 0 then stage 1, one micro-batch: F 1 s, B 2 s each; 3 GB of parameters per stage;
    # zero-byte activations; a free optimizer step
    g = gbuild("two", fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0], src=[0], dst=[1], edge_bytes=[0],
               param_bytes=[3e9, 3e9], out_bytes=[0, 0], saved_bytes=[0, 0], batch_size=1)
    p = make_plan(g, np.array([0, 1]), strategy="manual", devices=2, memory_bytes=None,
                  microbatches=1, schedule="1f1b")
    cl = Cluster(DeviceSpec("d", 1e12, 1e12, 1e20), nodes=nodes,
                 devices_per_node=devices_per_node, intra=LinkSpec(1e12, 0.0),
                 inter=LinkSpec(1e9, 0.0))
    return simulate(p, g, cluster=cl, dp=2, collective=collective)


def dp_spans(r):
    return sorted((e.rank, e.start_s, e.end_s) for e in r.timeline.events
                  if e.kind == "allreduce")


def test_group_in_one_node_shares_the_network_port():
    # 2 nodes x 2 devices: copy 0 = node 0, copy 1 = node 1. Each stage's gradients go over
    # 2 nodes: 2 * 1 * 1.5 GB at 1 GB/s = 3 s. Stage 1's backward ends at 4, stage 0's at 6,
    # but node 0's port is busy with stage 1's all-reduce until 7.
    r = _two_stage_dp(devices_per_node=2, nodes=2)
    assert dp_spans(r) == [(0, 6.0, 10.0), (1, 4.0, 7.0)]
    assert r.iteration_s == pytest.approx(10.0)
    assert _two_stage_dp(2, 2, "ring").iteration_s == pytest.approx(10.0)


def test_group_across_nodes_has_a_port_per_stage():
    # 4 nodes x 1 device: each stage on its own node, no sharing: 6 + 3 s
    r = _two_stage_dp(devices_per_node=1, nodes=4)
    assert dp_spans(r) == [(0, 6.0, 9.0), (1, 4.0, 7.0)]
    assert r.iteration_s == pytest.approx(9.0)


def test_copies_inside_one_node_use_the_device_link():
    # 1 node x 4 devices: both copies in the node, all-reduce over the 1 TB/s device link
    r = _two_stage_dp(devices_per_node=4, nodes=1)
    assert r.iteration_s == pytest.approx(6.0 + 2 * 1.5e9 / 1e12)


def _one_piece_dp(bandwidth: float, bucket: float):
    # one piece: F 1 s, B 2 s (from 1 to 3), 4 GB of gradients, dp 4 over a flat link
    g = gbuild("one", fwd_s=[1.0], bwd_s=[2.0], param_bytes=[4e9], out_bytes=[0],
               saved_bytes=[0], batch_size=1)
    p = make_plan(g, np.array([0]), strategy="manual", devices=1, memory_bytes=None,
                  cluster=flat_cluster_doc(
                      {"bandwidth": bandwidth, "latency_s": 0.0, "mem_bandwidth": 1e20}, 1))
    return simulate(p, g, dp=4, dp_bucket_bytes=bucket)


def test_buckets_overlap_the_backward():
    # 1 GB buckets: the first is ready a quarter into the backward (at 1.5 s); the whole
    # 4 GB ring takes 2 * 3 * 1 GB / 1 GB/s = 6 s: ends at 7.5 instead of 3 + 6
    assert _one_piece_dp(1e9, 0.0).iteration_s == pytest.approx(9.0)
    assert _one_piece_dp(1e9, 1e9).iteration_s == pytest.approx(7.5)
    # a fast link: the all-reduce keeps up; only the last bucket (6 * 0.25 GB / 100 GB/s)
    # is left after the backward
    assert _one_piece_dp(100e9, 1e9).iteration_s == pytest.approx(3.0 + 0.015)


def test_fused_all_reduce_waits_for_the_whole_backward():
    # two pieces on one rank (stage 0 twice: a-b-c with b elsewhere), dp 2 over one node pair
    # rank 0 runs piece a (B ends at 5 - see below) and piece c; fused: one 2 GB all-reduce
    # after rank 0's last backward instead of one per piece
    g = gbuild("aba", fwd_s=[1.0, 1.0, 1.0], bwd_s=[1.0, 1.0, 1.0], src=[0, 1], dst=[1, 2],
               edge_bytes=[0, 0], param_bytes=[1e9, 0, 1e9], out_bytes=[0, 0, 0],
               saved_bytes=[0, 0, 0], batch_size=1)
    p = make_plan(g, np.array([0, 1, 0]), strategy="manual", devices=2, memory_bytes=None,
                  microbatches=1, schedule="1f1b")
    cl = Cluster(DeviceSpec("d", 1e12, 1e12, 1e20), nodes=2, devices_per_node=2,
                 intra=LinkSpec(1e12, 0.0), inter=LinkSpec(1e9, 0.0))
    # F: a 0-1, b 1-2, c 2-3; B: c 3-4, b 4-5, a 5-6. Ring over 2 nodes: S / 1 GB/s.
    per_piece = simulate(p, g, cluster=cl, dp=2)
    assert dp_spans(per_piece) == [(0, 4.0, 5.0), (0, 6.0, 7.0)]
    fused = simulate(p, g, cluster=cl, dp=2, dp_fused=True)
    assert dp_spans(fused) == [(0, 6.0, 8.0)]
    assert (per_piece.iteration_s, fused.iteration_s) == pytest.approx((7.0, 8.0))


def test_replica_and_data_parallel_all_reduces_take_turns():
    # a parameter used on both ranks (as MAST replicas hold one stage on two devices): the
    # shared-parameter all-reduce and the data-parallel one share each rank's collective
    # stream. F 1 s, B 2 s; rank 0's backward ends at 6. Its data-parallel all-reduce of 2 GB
    # over 2 nodes (2 s at 1 GB/s) runs 6-8, then the 2-rank ring of the shared 2 GB (2 s)
    # runs 8-10.
    g = gbuild("tied", fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0], src=[0], dst=[1], edge_bytes=[0],
               param_bytes=[2e9, 0], out_bytes=[0, 0], saved_bytes=[0, 0], batch_size=1,
               attrs=[{"params": ["w"]}, {"shared_params": ["w"]}])
    p = make_plan(g, np.array([0, 1]), strategy="manual", devices=2, memory_bytes=None,
                  microbatches=1, schedule="1f1b")
    cl = Cluster(DeviceSpec("d", 1e12, 1e12, 1e20), nodes=2, devices_per_node=2,
                 intra=LinkSpec(1e9, 0.0), inter=LinkSpec(1e9, 0.0))
    r = simulate(p, g, cluster=cl, dp=2)
    spans = sorted((e.rank, e.label, e.start_s, e.end_s) for e in r.timeline.events
                   if e.kind == "allreduce")
    assert spans == [(0, "AR0", 8.0, 10.0), (0, "DP0", 6.0, 8.0), (1, "AR0", 8.0, 10.0)]
    assert r.iteration_s == pytest.approx(10.0)


def flat_cluster_doc(doc, devices):
    """A flat cluster from a plan's (outcore-plan/1) cluster record."""
    return _cluster_from_dict(doc, devices=devices, memory_bytes=None)
