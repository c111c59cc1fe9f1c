"""Planners see the runtime's per-piece cost: a cut is charged the fixed forward and backward
cost of the piece it starts, so placements are not cut finer than the runtime can run fast."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from outcore.api import estimate, make_cluster
from outcore.graph.capture import capture
from outcore.placers import partition
from outcore.placers.context import make_context
from outcore.plan.pieces import cut
from outcore.zoo import resolve_model


def test_cuts_cost_the_per_piece_overhead_as_latency():
    cl = make_cluster(3, bandwidth="16GB/s", latency="25us")
    d = cl.device
    assert d.fwd_overhead_s > 0 and d.bwd_overhead_s > 0
    g = resolve_and_cost("outcore:mlp")
    ctx = make_context(g, 3, cluster=cl)
    plain = make_context(g, 3, cluster=replace(cl, device=replace(d, fwd_overhead_s=0.0,
                                                                  bwd_overhead_s=0.0)))
    off = ~np.eye(3, dtype=bool)
    np.testing.assert_allclose(ctx.lat_s[off] - plain.lat_s[off],
                               0.5 * (d.fwd_overhead_s + d.bwd_overhead_s))
    assert (np.diag(ctx.lat_s) == np.diag(plain.lat_s)).all()  # no cut, no new piece


def resolve_and_cost(name):
    spec = resolve_model(name, batch_size=8)
    return estimate(capture(spec.build(), spec.example_inputs, name=name), "v100")


@pytest.mark.parametrize("strategy", ["pardnn", "heft"])
def test_planners_cut_less_when_pieces_cost_time(strategy):
    g = resolve_and_cost("outcore:transformer:layers=2,d_model=128,heads=4,seq=16,vocab=256")
    cl = make_cluster(2, device="v100")
    free = replace(cl, device=replace(cl.device, fwd_overhead_s=0.0, bwd_overhead_s=0.0))
    costly = partition(g, 2, cluster=cl, strategy=strategy, microbatches=4).assignment
    naive = partition(g, 2, cluster=free, strategy=strategy, microbatches=4).assignment
    assert len(cut(g, costly).pieces) < len(cut(g, naive).pieces)
