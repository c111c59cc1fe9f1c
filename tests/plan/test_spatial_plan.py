"""Spatial parallelism on the plan: join candidates, the request's checks, the rank layout,
the JSON form, the join chosen from the memory model, and the simulated tile ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import outcore
from outcore.cost.spatial_geometry import TileGrid
from outcore.errors import UsageError
from outcore.plan.layout import Layout
from outcore.plan.plan import from_dict, to_dict
from outcore.plan.request import PlanRequest
from outcore.plan.spatial import SpatialPlan, join_candidates, tile_group
from outcore.search.loop import search
from outcore.sim.simulate import simulate
from tests.parallel.spatial.sp_models import small_resnet, unet


@pytest.fixture(scope="module")
def g():
    model, example = small_resnet()
    x = torch.randn(2, 3, 256, 256)
    return outcore.estimate(outcore.capture(model, (x,)), device="v100")


def names(g, idx):
    return [g.name_of(i) for i in idx]


def test_join_candidates_gather_every_tensor_that_crosses(g):
    # every node of the stem and the blocks; inside a residual block two tensors cross (the
    # block's input and its branch) and both are gathered
    cands = join_candidates(g, TileGrid(rows=2, cols=1))
    assert names(g, cands) == names(g, range(1, 19))
    sp = SpatialPlan(grid="2x1", join="relu", tiled=tuple(int(i) for i in g.ids[:7]))
    assert names(g, sp.gathered(g)) == ["_2", "relu"]
    sp = SpatialPlan(grid="2x1", join="relu_1", tiled=tuple(int(i) for i in g.ids[:11]))
    assert names(g, sp.gathered(g)) == ["relu_1"]


@pytest.fixture(scope="module")
def unet_g():
    model, _ = unet()
    return outcore.estimate(outcore.capture(model, (torch.randn(1, 3, 515, 515),)),
                            device="v100")


def test_unet_joins_gather_the_skip_connections(unet_g):
    """A join inside the U-Net gathers the encoder's skip connections with it; the spatial
    stage's memory counts them, and the simulator charges their gathers."""
    g = unet_g
    assert names(g, join_candidates(g, TileGrid(rows=4, cols=1))) == names(g, range(1, 20))
    p = search(g, PlanRequest.make(2, sp=2, sp_join="mid_1"))
    assert names(g, p.spatial.gathered(g)) == ["enc1_2", "enc2_2", "mid_1"]
    q = search(g, PlanRequest.make(2, sp=2, sp_join="dec2_1"))
    assert names(g, q.spatial.gathered(g)) == ["enc1_2", "dec2_1"]
    first = search(g, PlanRequest.make(2, sp=2, sp_join="enc1_2"))
    assert names(g, first.spatial.gathered(g)) == ["enc1_2"]
    # the tile rank sends enc1's tile in both; at mid_1 also enc2's and mid's, and the halos
    # of the encoder's second level
    r, r_first = simulate(p, g), simulate(first, g)
    assert r.comm_bytes[1] > r_first.comm_bytes[1] > 0
    # tile 0 holds the whole enc1 skip (gathered) beside its tiles
    assert r.peak_bytes[0] > g.out_bytes[names(g, range(g.num_nodes)).index("enc1_2")]


def test_request_refuses_tp_with_sp_and_too_few_devices():
    with pytest.raises(UsageError, match="tensor"):
        PlanRequest.make(4, sp=2, tp=2)
    with pytest.raises(UsageError, match="at least 4 devices"):
        PlanRequest.make(2, sp=4)
    with pytest.raises(UsageError, match="MASTER"):
        PlanRequest.make(4, sp=2, parallel="master")
    with pytest.raises(UsageError, match="at least 4 devices"):
        PlanRequest.make(2, sp=2, dp=2)
    with pytest.raises(UsageError, match="tile"):
        PlanRequest.make(4, sp=2, sp_grid="2x2")


def test_layout_counts_the_extra_tile_ranks():
    assert Layout(sp=4).ranks(3) == 6        # stages - 1 + sp
    assert tile_group(3, SpatialPlan(grid="2x2", join="x", tiled=(0,), stage=1)) == [1, 3, 4, 5]
    # data parallel: ordinary slots 0..5 (copy-major), then 3 extra tile ranks per copy
    sp = SpatialPlan(grid="2x2", join="x", tiled=(0,), stage=1)
    assert tile_group(3, sp, dp=2, copy=0) == [1, 6, 7, 8]
    assert tile_group(3, sp, dp=2, copy=1) == [4, 9, 10, 11]


def test_spatial_with_data_parallel_copies(g):
    p = search(g, PlanRequest.make(4, sp=2, dp=2, sp_join="relu_1"))
    assert p.devices == 4 and p.layout.dp == 2 and p.layout.sp == 2 and p.stages == 1
    r = simulate(p, g)
    assert r.peak_bytes.shape == (4,)
    # ranks 2 and 3 are the copies' extra tile ranks: busy, holding less than the stage ranks
    assert (r.busy_s[2:] > 0).all() and (r.peak_bytes[2:] < r.peak_bytes[:2]).all()
    assert r.peak_bytes[2] == r.peak_bytes[3] and r.peak_bytes[0] == r.peak_bytes[1]


def test_named_join_and_round_trip(g):
    p = search(g, PlanRequest.make(3, sp=2, sp_join="relu_1", strategy="pipeline"))
    assert p.spatial.join == "relu_1" and p.devices == 3 and p.layout.sp == 2
    assert p.spatial.reason == "named by --sp-join"
    tiled = set(p.spatial.tiled)
    assert tiled == {int(i) for i in g.ids[:names(g, range(g.num_nodes)).index("relu_1") + 1]}
    q = from_dict(to_dict(p))
    assert q.spatial == p.spatial and q.layout == p.layout and q.stages == p.stages
    with pytest.raises(UsageError, match="not a valid join"):
        search(g, PlanRequest.make(3, sp=2, sp_join="_8"))


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


def test_spatial_with_gems_mast(g):
    """SP + MAST on 4 devices: 2 stages, each replica's spatial stage with one extra tile rank
    (replica A: ranks 0 and 2; replica B, reversed: ranks 1 and 3)."""
    p = search(g, PlanRequest.make(4, sp=2, parallel="mast", sp_join="relu_1"))
    assert p.layout.mode == "mast" and p.layout.sp == 2 and p.stages == 2 and p.devices == 4
    assert tile_group(2, p.spatial, 1, 0, p.layout.maps) == [p.spatial.stage, 2]
    assert tile_group(2, p.spatial, 1, 1, p.layout.maps) == [1 - p.spatial.stage, 3]
    r = simulate(p, g)
    assert r.peak_bytes.shape == (4,) and (r.busy_s[2:] > 0).all()
    with pytest.raises(UsageError, match="more devices"):
        search(g, PlanRequest.make(3, sp=2, parallel="mast", sp_join="relu_1"))
