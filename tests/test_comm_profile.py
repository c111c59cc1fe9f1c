"""The communication profile (outcore.trace.comm_profile): per kind, measured beside predicted."""

from __future__ import annotations

import pytest

from outcore.trace import Event, Timeline, comm_profile


def tl(events, source):
    return Timeline(2, tuple(events), max(e.end_s for e in events), source=source)


def test_profile_sums_per_kind_and_sets_bandwidths():
    measured = tl([Event(0, "F", "0F0", 0.0, 1.0),
                   Event(0, "send", "t0SF0", 1.0, 1.5, stream="comm", bytes=1000, peer=1),
                   Event(0, "send", "t0SF1", 2.0, 2.5, stream="comm", bytes=1000, peer=1),
                   Event(1, "recv", "t0RF0", 0.0, 1.6, stream="comm", bytes=1000, peer=0),
                   Event(1, "allreduce", "AR0", 3.0, 5.0, stream="comm", bytes=4000)],
                  "measured")
    predicted = tl([Event(0, "send", "t0SF0", 1.0, 1.1, stream="comm", bytes=1000),
                    Event(0, "send", "t0SF1", 2.0, 2.1, stream="comm", bytes=1000),
                    Event(1, "allreduce", "AR0", 3.0, 4.0, stream="comm", bytes=4000)],
                   "simulated")
    rows = {r["kind"]: r for r in comm_profile(measured, predicted)}
    assert set(rows) == {"send", "recv", "allreduce"}  # compute is not communication
    send = rows["send"]
    assert send["count"] == 2 and send["bytes"] == 2000
    assert send["measured_s"] == pytest.approx(1.0) and send["measured_bandwidth"] == \
        pytest.approx(2000.0)
    assert send["predicted_s"] == pytest.approx(0.2) and send["predicted_bandwidth"] == \
        pytest.approx(10000.0)
    assert rows["recv"]["predicted_s"] is None  # the model predicted no receive here
    assert rows["allreduce"]["measured_bandwidth"] == pytest.approx(2000.0)
    assert rows["allreduce"]["predicted_bandwidth"] == pytest.approx(4000.0)


def test_measured_events_without_bytes_take_the_predicted_bytes():
    measured = tl([Event(0, "send", "t0SF0", 0.0, 0.5, stream="comm")], "measured")
    predicted = tl([Event(0, "send", "t0SF0", 0.0, 0.1, stream="comm", bytes=500)], "simulated")
    (row,) = comm_profile(measured, predicted)
    assert row["bytes"] == 500 and row["measured_bandwidth"] == pytest.approx(1000.0)
