"""SP + DP and SP + GEMS MAST: copies of a spatial plan, each with its own tile group, equal
single-process training (every parameter, 4 ranks; and the U-Net through the API, losses)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from outcore.config import TrainConfig
from outcore.graph.io import to_dict as graph_doc
from outcore.plan.layout import Layout
from outcore.plan.plan import make_plan, to_dict as plan_doc
from outcore.plan.spatial import SpatialPlan
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.parallel.spatial.plan_helpers import MODEL, UNET, unet_config
from tests.runtime.helpers import assert_matches, graph_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]


def _two_tiles_to_relu_1():
    """The config (2 copies of 2 images, SGD), graph, node names and 2x1 spatial plan joined
    after ``relu_1`` the tests below share."""
    cfg = TrainConfig.make(model=MODEL, batch_size=4, microbatches=1, steps=3, schedule="1f1b",
                           optimizer="sgd", lr=0.1, momentum=0.9, return_state=True,
                           track_memory=False)
    g = graph_for(cfg, copies=2)
    names = [g.name_of(i) for i in range(g.num_nodes)]
    j = names.index("relu_1")
    sp = SpatialPlan(grid="2x1", join="relu_1", tiled=tuple(int(i) for i in g.ids[:j + 1]))
    return cfg, g, names, sp


def test_spatial_with_data_parallel_copies():
    """SP + DP (``--sp 2 --dp 2``): two copies of a 2-tile group (4 ranks: ordinary slots 0
    and 1, extra tile ranks 2 and 3), each on its half of the batch; the tiled layers'
    gradients summed over the copies (tile 0: the data-parallel buckets; extra tiles: their
    own group) and over the tiles."""
    cfg, g, names, sp = _two_tiles_to_relu_1()
    layout = dataclasses.replace(Layout.replicate("mp", 1, 1, 2), sp=2)
    plan = make_plan(g, np.zeros(g.num_nodes, dtype=np.int64), strategy="manual",
                     devices=layout.ranks(1), memory_bytes=None, microbatches=1,
                     schedule="1f1b", layout=layout, spatial=sp)
    results = run_local(train_worker, 4, (cfg, graph_doc(g), plan_doc(plan)), timeout_s=120)
    assert_matches(results, *reference(cfg, chunks=2))


def test_spatial_with_data_parallel_through_the_api(tmp_path):
    """``outcore.train(..., sp=2, dp=2)``: the planner's join and placement, 4 ranks; the
    losses equal plain PyTorch's on the whole batch (2 chunks of 2 images)."""
    import outcore
    report = outcore.train(UNET, 4, sp=2, dp=2, costs="estimate:cpu", batch_size=4, steps=3,
                           optimizer="sgd", lr=0.1, run_dir=str(tmp_path / "run"),
                           timeline=False)
    p = report.plan
    assert p.layout.dp == 2 and p.layout.sp == 2 and p.devices == 4
    ref_losses, _ = reference(unet_config(steps=3).replace(microbatches=1),
                              chunks=2)
    np.testing.assert_allclose(report.losses, ref_losses, rtol=1e-5, atol=0)


def test_spatial_with_gems_mast_replicas():
    """SP + GEMS MAST: two replicas over 2 stages in opposite directions (replica B's spatial
    stage is on rank 1), each with its own tile group (extra tile ranks 2 and 3): 4 ranks."""
    cfg, g, names, sp = _two_tiles_to_relu_1()
    a = np.zeros(g.num_nodes, dtype=np.int64)
    a[names.index("_5_conv1"):] = 1
    layout = dataclasses.replace(Layout.replicate("mast", 2, 2, 1), sp=2)
    assert layout.ranks(2) == 4
    plan = make_plan(g, a, strategy="manual", devices=4, memory_bytes=None, microbatches=1,
                     schedule="1f1b", layout=layout, spatial=sp)
    results = run_local(train_worker, 4, (cfg, graph_doc(g), plan_doc(plan)), timeout_s=120)
    assert_matches(results, *reference(cfg, chunks=2))
