"""The memory model and the arguments of the planning context."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.errors import UsageError
from outcore.graph.ir import build
from outcore.hardware.spec import Cluster, DeviceSpec, LinkSpec
from outcore.placers.context import make_context, received_bytes


def fan_out():
    """p feeds x, y, z; p -> x carries 30 bytes, p -> y 50, p -> z 40."""
    return build("fan", fwd_s=[1, 1, 1, 1], src=[0, 0, 0], dst=[1, 2, 3],
                 edge_bytes=[30, 50, 40], param_bytes=[100, 0, 0, 0], saved_bytes=[1, 2, 3, 4])


def test_a_tensor_is_received_once_per_device_at_its_largest_edge():
    g = fan_out()
    # x and y on device 1, z on device 2: device 1 receives p once (50 bytes), device 2 once (40)
    a = np.array([0, 1, 1, 2])
    assert received_bytes(g, a, 3).tolist() == [0, 50, 40]
    assert received_bytes(g, np.zeros(4, np.int64), 3).tolist() == [0, 0, 0]


def test_peak_is_static_plus_inflight_activations_plus_transient():
    g = fan_out()
    ctx = make_context(g, 3, optimizer="sgd", microbatches=3)
    a = np.array([0, 1, 1, 2])
    # device 0: 2 x 100 params + 3 x saved 1 + transient 50 (p's output: its largest edge)
    # device 1: 3 x (2 + 3 + 50) ; device 2: 3 x (4 + 40); their outputs are 0 bytes
    assert ctx.memory(a).tolist() == [200 + 3 + 50, 3 * 55, 3 * 44]
    # 1F1B: per-device micro-batches in flight
    assert ctx.memory(a, inflight=np.array([3.0, 2.0, 1.0])).tolist() == [253, 110, 44]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_devices_must_be_a_positive_whole_number(bad):
    with pytest.raises(UsageError, match="devices"):
        make_context(fan_out(), bad)


def test_negative_or_nan_memory_is_refused_with_the_fix():
    with pytest.raises(UsageError, match="memory_bytes=16"):
        make_context(fan_out(), 2, memory_bytes=-1)
    with pytest.raises(UsageError):
        make_context(fan_out(), 2, memory_bytes=float("nan"))


def test_cluster_smaller_than_devices_is_refused():
    dev = DeviceSpec("d", 1e9, 1e12, 1e11)
    with pytest.raises(UsageError, match="cluster has 2 devices"):
        make_context(fan_out(), 4, cluster=Cluster(dev, 1, 2))


def test_links_follow_the_cluster_hierarchy():
    dev = DeviceSpec("d", 1e9, 1e12, 1e11)
    cl = Cluster(dev, nodes=2, devices_per_node=2, intra=LinkSpec(100e9, 1e-6),
                 inter=LinkSpec(10e9, 5e-6))
    ctx = make_context(fan_out(), 4, cluster=cl)
    assert ctx.lat_s[0, 1] == 1e-6 and ctx.lat_s[0, 2] == 5e-6 and ctx.lat_s[2, 2] == 0
    assert ctx.inv_bw[1, 3] == pytest.approx(1e-10)


@pytest.mark.parametrize("family", ["nas", "transformer", "unet"])
def test_the_memory_parts_are_numpys_sums_to_the_last_bit(family):
    """``memory_parts`` (one compiled pass) equals the model written with numpy: per device,
    ``np.bincount`` of state and saved bytes, the received bytes, the largest output."""
    from outcore.graph.generators import make

    g = make(family, 3000)
    ctx = make_context(g, 4, microbatches=2)
    rng = np.random.default_rng(0)
    for a in (rng.integers(0, 4, g.num_nodes), np.zeros(g.num_nodes, np.int64),
              np.repeat(np.arange(4), -(-g.num_nodes // 4))[:g.num_nodes]):
        static, act, trans = ctx.memory_parts(a)
        assert np.array_equal(static, np.bincount(a, weights=g.param_bytes * ctx.factor,
                                                  minlength=4))
        saved = np.bincount(a, weights=g.saved_bytes.astype(np.float64), minlength=4)
        assert np.array_equal(act, saved + received_bytes(g, a, 4))
        assert np.array_equal(trans, [max([0.0] + [float(g.out_bytes[v])
                                                   for v in np.flatnonzero(a == d)])
                                      for d in range(4)])
    with pytest.raises(UsageError, match="memory model counts 4"):
        ctx.memory_parts(np.full(g.num_nodes, 4))
