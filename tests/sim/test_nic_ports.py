"""Network ports per node: data-parallel all-reduces of a node's ranks share one port, or each
uses its own (a DGX/HGX A100 has one NIC per GPU) — by hand."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from outcore.errors import UsageError
from outcore.graph import build as gbuild
from outcore.hardware.cluster import from_dict, to_dict
from outcore.hardware.spec import Cluster, DeviceSpec, LinkSpec
from outcore.plan import make_plan
from outcore.sim import simulate

CL = Cluster(DeviceSpec("d", 1e12, 1e12, 1e20), nodes=2, devices_per_node=2,
             intra=LinkSpec(1e12, 0.0), inter=LinkSpec(1e9, 0.0))


def dp_spans(r):
    return sorted((e.rank, e.start_s, e.end_s) for e in r.timeline.events
                  if e.kind == "allreduce")


def test_ports_overlap_when_both_are_ready_together():
    # both stages' backwards end together (B of stage 1 takes 0 s): with one port the second
    # all-reduce waits for the first; with a port per device both run at once
    g = gbuild("ab", fwd_s=[1.0, 1.0], bwd_s=[0.0, 0.0], src=[0], dst=[1], edge_bytes=[0],
               param_bytes=[1e9, 1e9], out_bytes=[0, 0], saved_bytes=[0, 0], batch_size=1)
    p = make_plan(g, np.array([0, 1]), strategy="manual", devices=2, memory_bytes=None,
                  microbatches=1, schedule="1f1b")
    one = simulate(p, g, cluster=CL, dp=2)
    per_gpu = simulate(p, g, cluster=replace(CL, nics_per_node=2), dp=2)
    assert dp_spans(one) == [(0, 2.0, 4.0), (1, 2.0, 3.0)]
    assert dp_spans(per_gpu) == [(0, 2.0, 3.0), (1, 2.0, 3.0)]
    assert (one.iteration_s, per_gpu.iteration_s) == pytest.approx((4.0, 3.0))


def test_port_of_slots_and_json():
    cl = Cluster(DeviceSpec("d", 1e9, 1e12, 1e12), nodes=2, devices_per_node=8,
                 nics_per_node=4)
    assert [cl.port_of(d) for d in (0, 1, 2, 7, 8, 15)] == \
        [(0, 0), (0, 0), (0, 1), (0, 3), (1, 0), (1, 3)]
    # slots of 2 tensor-parallel ranks: 4 per node, each with the ports of its two ranks
    s = cl.slots(2)
    assert (s.devices_per_node, s.nics_per_node) == (4, 2)
    assert cl.slots(8).nics_per_node == 1 and cl.slots(16).nics_per_node == 1
    back = from_dict(to_dict(cl), devices=16, memory_bytes=None)
    assert back.nics_per_node == 4
    assert from_dict({k: v for k, v in to_dict(cl).items() if k != "nics_per_node"},
                     devices=16, memory_bytes=None).nics_per_node == 1
    with pytest.raises(UsageError, match="network port"):
        replace(cl, nics_per_node=0)
