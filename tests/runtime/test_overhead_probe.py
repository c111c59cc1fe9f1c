"""The runtime's per-piece cost is probed on the live machine and reaches the plan's cluster
."""

from __future__ import annotations

import math

from outcore.hardware.cluster import from_dict, make_cluster, to_dict
from outcore.hardware.spec import RUNTIME_OVERHEAD_S
from outcore.runtime.overhead import piece_overhead_s


def test_probe_measures_a_positive_backward_call_and_a_bounded_forward():
    # one more autograd.backward call always costs something, and far less than 10 ms; the
    # probe is a difference of best times, which a busy machine (the suite runs two test
    # processes) can cut to nothing once: three probes, one of them must see it
    probes = [piece_overhead_s(repeat=3, inner=50) for _ in range(3)]
    for fwd, bwd in probes:
        assert 0.0 <= fwd < 0.01 and math.isfinite(fwd)
        assert 0.0 <= bwd < 0.01
    assert max(bwd for _, bwd in probes) > 0.0


def test_measured_overheads_travel_with_the_cluster():
    cl = make_cluster(2, "1GiB", device="cpu", overhead_s=(3e-5, 7e-5))
    assert (cl.device.fwd_overhead_s, cl.device.bwd_overhead_s) == (3e-5, 7e-5)
    back = from_dict(to_dict(cl), devices=2, memory_bytes=2**30)
    assert (back.device.fwd_overhead_s, back.device.bwd_overhead_s) == (3e-5, 7e-5)
    default = make_cluster(2, "1GiB", device="cpu")
    assert (default.device.fwd_overhead_s, default.device.bwd_overhead_s) == RUNTIME_OVERHEAD_S


def test_the_cold_start_probe_is_bounded_and_travels_with_the_cluster():
    """The re-warming after a wait is measured (non-negative, far below the ~1 ms step it is
    measured on) and kept through the plan file's cluster record."""
    from outcore.runtime.overhead import cold_start_s
    extra = cold_start_s(rounds=6, idle_s=1e-3)
    assert math.isfinite(extra) and 0.0 <= extra < 5e-3
    cl = make_cluster(2, "1GiB", device="cpu", cold_start_s=8e-5)
    assert cl.device.cold_start_s == 8e-5
    assert from_dict(to_dict(cl), devices=2, memory_bytes=2**30).device.cold_start_s == 8e-5
    assert make_cluster(2, "1GiB", device="cpu").device.cold_start_s == 0.0
