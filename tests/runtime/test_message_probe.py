"""The per-message probes: the same-host link's host time per call and its one-way
latency are positive and plausible on this machine."""

from __future__ import annotations

from outcore.runtime.overhead import message_overhead_s, samehost_latency_s


def test_message_host_time_is_microseconds():
    send_s, recv_s = message_overhead_s(repeat=3, inner=50)
    assert 0 < send_s < 1e-3 and 0 < recv_s < 1e-3, (send_s, recv_s)


def test_a_large_message_costs_the_host_more_than_a_small_one():
    """A megabyte is copied through each end's calls (at tens of GB/s at most: >= 20 us more
    than a small message takes)."""
    small = message_overhead_s(repeat=1, inner=60)
    large = message_overhead_s(repeat=1, inner=60, nbytes=1 << 20)
    assert large[0] + large[1] > small[0] + small[1] + 20e-6, (small, large)


def test_same_host_latency_is_measured_between_two_processes():
    one_way_s = samehost_latency_s(rounds=50)
    assert 0 < one_way_s < 0.05, one_way_s


def test_same_host_latency_with_polling_receives():
    """Both ends poll before blocking, as workers do on free cores (the probe's own receive
    goes through the runtime's link, whose poll really polls)."""
    one_way_s = samehost_latency_s(2e-4, rounds=50)
    assert 0 < one_way_s < 0.05, one_way_s
