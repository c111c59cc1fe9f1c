"""Cluster.link_times: every transfer's link time at once, as link(a, b).time gives it."""

from __future__ import annotations

import numpy as np

from outcore.hardware.cluster import from_dict


def test_link_times_are_each_pairs_link_time():
    cluster = from_dict({"nodes": 2, "devices_per_node": 2,
                         "intra": {"bandwidth": 3e11, "latency_s": 5e-6},
                         "inter": {"bandwidth": 2.5e9, "latency_s": 2e-5}},
                        devices=4, memory_bytes=None)
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 4, 200), rng.integers(0, 4, 200)
    nbytes = rng.integers(0, 10**7, 200).astype(float)
    nbytes[::7] = 0.0  # no bytes: no time, as LinkSpec.time says
    got = cluster.link_times(a, b, nbytes)
    want = [cluster.link(int(x), int(y)).time(float(n)) for x, y, n in zip(a, b, nbytes)]
    assert got.tolist() == want
    assert (got[::7] == 0).all() and (got[((a // 2) != (b // 2)) & (nbytes > 0)] > 2e-5).all()
