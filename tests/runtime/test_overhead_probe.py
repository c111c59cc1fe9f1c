"""The runtime's per-piece cost is probed on the live machine and reaches the plan's cluster
(issue 17)."""

from __future__ import annotations

import math

from outcore.hardware.cluster import from_dict, make_cluster, to_dict
from outcore.hardware.spec import RUNTIME_OVERHEAD_S
from outcore.runtime.overhead import piece_overhead_s


def test_probe_measures_a_positive_backward_call_and_a_bounded_forward():
    fwd, bwd = piece_overhead_s(repeat=3, inner=50)
    assert 0.0 <= fwd < 0.01 and math.isfinite(fwd)
    # one more autograd.backward call always costs something, and far less than 10 ms
    assert 0.0 < bwd < 0.01


def test_measured_overheads_travel_with_the_cluster():
    cl = make_cluster(2, "1GiB", device="cpu", overhead_s=(3e-5, 7e-5))
    assert (cl.device.fwd_overhead_s, cl.device.bwd_overhead_s) == (3e-5, 7e-5)
    back = from_dict(to_dict(cl), devices=2, memory_bytes=2**30)
    assert (back.device.fwd_overhead_s, back.device.bwd_overhead_s) == (3e-5, 7e-5)
    default = make_cluster(2, "1GiB", device="cpu")
    assert (default.device.fwd_overhead_s, default.device.bwd_overhead_s) == RUNTIME_OVERHEAD_S
