"""The runtime's host time per message (``DeviceSpec.send_overhead_s``/``recv_overhead_s``,
and per byte: ``send_byte_s``/``recv_byte_s``) delays the sender's next
action and the receiver's, by hand; and it survives the plan's cluster record."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.graph import build as gbuild
from outcore.hardware.cluster import from_dict, make_cluster, to_dict
from outcore.plan import make_plan
from outcore.sim import simulate


def _chain(send_s: float, recv_s: float, per_byte: tuple[float, float] | None = None):
    # two nodes on two devices, one micro-batch: fwd 1 s, bwd 2 s, 1 B over a 2 B/s link
    g = gbuild("two", fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0], src=[0], dst=[1], edge_bytes=[1],
               out_bytes=[0, 0], saved_bytes=[0, 0], batch_size=1)
    cluster = make_cluster(2, None, 2.0, 0.0, overhead_s=(0.0, 0.0),
                           message_overhead_s=(send_s, recv_s), message_byte_s=per_byte)
    p = make_plan(g, np.array([0, 1]), strategy="manual", devices=2, memory_bytes=None,
                  microbatches=1, schedule="gpipe", cluster=cluster)
    return simulate(p, g, cluster=cluster)


def spans(r, rank):
    return [(e.label, e.start_s, e.end_s) for e in r.timeline.events
            if e.rank == rank and e.kind in ("F", "B")]


def test_message_host_time_by_hand():
    base = _chain(0.0, 0.0)
    assert spans(base, 1) == [("1F0", 1.5, 2.5), ("1B0", 2.5, 4.5)]
    assert spans(base, 0) == [("0F0", 0, 1), ("0B0", 5, 7)]
    r = _chain(0.25, 0.125)
    # send call 1 -> 1.25, wire 0.5 -> 1.75, receive call -> 1.875; gradients alike from 4.875
    assert spans(r, 1) == [("1F0", 1.875, 2.875), ("1B0", 2.875, 4.875)]
    assert spans(r, 0) == [("0F0", 0, 1), ("0B0", 5.75, 7.75)]
    assert r.iteration_s == pytest.approx(base.iteration_s + 2 * (0.25 + 0.125))


def test_message_host_time_per_byte_by_hand():
    """The 1-byte message's calls cost 0.25 + 0.5 (send) and 0.125 + 0.25 (receive) seconds:
    both ranks pay them as in the fixed case, nothing else moves."""
    r = _chain(0.25, 0.125, per_byte=(0.5, 0.25))
    # send call 1 -> 1.75, wire 0.5 -> 2.25, receive call -> 2.625; gradients alike from 5.625
    assert spans(r, 1) == [("1F0", 2.625, 3.625), ("1B0", 3.625, 5.625)]
    assert spans(r, 0) == [("0F0", 0, 1), ("0B0", 7.25, 9.25)]
    assert r.iteration_s == pytest.approx(_chain(0.75, 0.375).iteration_s)


def test_message_host_time_survives_the_cluster_record():
    c = make_cluster(2, None, "1GB/s", "20us", device="cpu", message_overhead_s=(7e-6, 9e-6),
                     message_byte_s=(1e-10, 2e-10))
    back = from_dict(to_dict(c), devices=2, memory_bytes=None)
    assert (back.device.send_overhead_s, back.device.recv_overhead_s) == (7e-6, 9e-6)
    assert (back.device.send_byte_s, back.device.recv_byte_s) == (1e-10, 2e-10)
