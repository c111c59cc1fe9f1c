"""Spatial parallelism on the plan: join candidates, the request's checks, the rank layout,
the JSON form, the join chosen from the memory model, and the simulated tile ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import outcore
from outcore.cost.spatial_geometry import TileGrid
from outcore.errors import UsageError
from outcore.partition.search import search
from outcore.plan.layout import Layout
from outcore.plan.plan import from_dict, to_dict
from outcore.plan.request import PlanRequest
from outcore.plan.spatial import SpatialPlan, join_candidates, tile_group
from outcore.sim.simulate import simulate
from tests.spatial.sp_models import small_resnet


@pytest.fixture(scope="module")
def g():
    model, example = small_resnet()
    x = torch.randn(2, 3, 256, 256)
    return outcore.estimate(outcore.capture(model, (x,)), device="v100")


def names(g, idx):
    return [g.name_of(i) for i in idx]


def test_join_candidates_are_single_tensor_cuts(g):
    # inside a residual block two tensors cross (the block's input and its branch): no join
    assert names(g, join_candidates(g, TileGrid(rows=2, cols=1))) == \
        ["_0", "_1", "_2", "add", "relu_1", "_4", "add_1", "relu_3"]


def test_request_refuses_tp_with_sp_and_too_few_devices():
    with pytest.raises(UsageError, match="tensor"):
        PlanRequest.make(4, sp=2, tp=2)
    with pytest.raises(UsageError, match="at least 4 devices"):
        PlanRequest.make(2, sp=4)
    with pytest.raises(UsageError, match="--dp 1"):
        PlanRequest.make(4, sp=2, dp=2)
    with pytest.raises(UsageError, match="tile"):
        PlanRequest.make(4, sp=2, sp_grid="2x2")


def test_layout_counts_the_extra_tile_ranks():
    assert Layout(sp=4).ranks(3) == 6        # stages - 1 + sp
    assert tile_group(3, SpatialPlan(grid="2x2", join="x", tiled=(0,), stage=1)) == [1, 3, 4, 5]


def test_named_join_and_round_trip(g):
    p = search(g, PlanRequest.make(3, sp=2, sp_join="relu_1", strategy="pipeline"))
    assert p.spatial.join == "relu_1" and p.devices == 3 and p.layout.sp == 2
    assert p.spatial.reason == "named by --sp-join"
    tiled = set(p.spatial.tiled)
    assert tiled == {int(i) for i in g.ids[:names(g, range(g.num_nodes)).index("relu_1") + 1]}
    q = from_dict(to_dict(p))
    assert q.spatial == p.spatial and q.layout == p.layout and q.stages == p.stages
    with pytest.raises(UsageError, match="not a valid join"):
        search(g, PlanRequest.make(3, sp=2, sp_join="_3_conv1"))


def test_join_from_the_memory_model_fits_and_says_why(g):
    # the whole step on one device needs more than the limit; 2 tiles + 1 stage fit
    plain = simulate(search(g, PlanRequest.make(1, strategy="single")), g)
    limit = 0.75 * float(plain.peak_bytes.max())
    p = search(g, PlanRequest.make(2, limit, sp=2))
    r = simulate(p, g)
    assert r.fits and r.peak_bytes.shape == (2,)
    assert "earliest point" in p.spatial.reason
    assert any(n.startswith("sp 2 (2x1 tiles) joins after") for n in p.notes)
    # the tile rank holds the tiled layers' share: less than the spatial stage's rank
    assert 0 < r.peak_bytes[1] < r.peak_bytes[0]
    assert r.busy_s[1] > 0


def test_more_tiles_lower_the_tile_peak(g):
    peaks = []
    for sp in (2, 4):
        p = search(g, PlanRequest.make(sp, sp=sp, sp_join="relu_3"))
        peaks.append(float(simulate(p, g).peak_bytes[-1]))
    assert peaks[1] < peaks[0]
    assert np.isfinite(peaks).all()
