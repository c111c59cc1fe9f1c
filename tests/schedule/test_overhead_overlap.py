"""The runtime's per-piece cost: added to a CPU piece's time, overlapped with an accelerator's
(on GPUs the host queues the next piece while the device runs this one)."""

from __future__ import annotations

import numpy as np

from outcore.hardware.cluster import from_dict, make_cluster, to_dict
from outcore.plan.pieces import cut
from outcore.schedule import piece_costs


def test_overlapped_overhead_is_a_floor_not_an_addition():
    from outcore.graph.io import from_dict as graph_from_dict
    g = graph_from_dict({"format": "outcore-graph/1", "name": "c", "nodes": [
        {"id": i, "fwd_s": f} for i, f in enumerate([1e-3, 1e-6, 1e-3, 1e-6])],
        "edges": [{"src": i, "dst": i + 1, "bytes": 64} for i in range(3)]})
    P = cut(g, np.array([0, 1, 0, 1]))
    added = piece_costs(g, P, 2, fwd_overhead_s=5e-5, bwd_overhead_s=1.5e-4)
    over = piece_costs(g, P, 2, fwd_overhead_s=5e-5, bwd_overhead_s=1.5e-4,
                       overhead_overlaps=True)
    np.testing.assert_allclose(added.fwd_s, [1e-3 + 5e-5, 1e-6 + 5e-5] * 2)
    # a big piece hides the host work; a tiny one waits for it
    np.testing.assert_allclose(over.fwd_s, [1e-3, 5e-5] * 2)
    np.testing.assert_allclose(over.bwd_s, [2e-3, 1.5e-4] * 2)


def test_accelerator_presets_overlap_cpu_and_generic_do_not():
    assert make_cluster(2, device="a100").device.host_overlap
    assert not make_cluster(2, device="cpu").device.host_overlap
    assert not make_cluster(2).device.host_overlap
    cl = make_cluster(2, "8GiB", device="a100")
    assert from_dict(to_dict(cl), devices=2, memory_bytes=8 * 2**30).device.host_overlap
