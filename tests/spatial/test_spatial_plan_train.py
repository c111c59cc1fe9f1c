"""A spatial plan trains exactly like one process (MPI4DL's SP + LP on outcore's runtime).

The layers before the join run on 2 tiles of unequal height (19 rows: 10 + 9; a stride-2
convolution and a 3x3 stride-2 max pool cross the tile border); at the join the tiles are
gathered onto the spatial stage's rank, which continues with 1 stage (2 ranks) or a 2-stage
pipeline (3 ranks: the extra tile rank is rank 2), and on a 2x2 grid (4 ranks). Losses and
every parameter of every rank after 2-3 optimizer steps are compared with plain single-process
training.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from outcore.graph.io import to_dict as graph_doc
from outcore.plan.layout import Layout
from outcore.plan.plan import make_plan, to_dict as plan_doc
from outcore.plan.spatial import SpatialPlan
from outcore.runtime.config import TrainConfig
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import assert_matches, graph_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

MODEL = f"{Path(__file__).parent / 'sp_models.py'}:small_resnet"


def spatial_docs(cfg: TrainConfig, join: str, stages: int, boundary: str | None,
                 grid: str = "2x1"):
    g = graph_for(cfg)
    names = [g.name_of(i) for i in range(g.num_nodes)]
    j = names.index(join)
    a = np.zeros(g.num_nodes, dtype=np.int64)
    if boundary is not None:
        a[names.index(boundary):] = stages - 1
    sp = SpatialPlan(grid=grid, join=join, tiled=tuple(int(i) for i in g.ids[:j + 1]))
    plan = make_plan(g, a, strategy="manual", devices=stages + sp.tiles - 1, memory_bytes=None,
                     microbatches=cfg.microbatches, schedule=cfg.schedule,
                     layout=Layout(sp=sp.tiles), spatial=sp)
    return graph_doc(g), plan_doc(plan)


@pytest.mark.parametrize("stages,join,boundary,schedule", [
    (1, "relu_3", None, "1f1b"),               # join after the second block: 2 ranks
    (2, "relu_1", "_5_conv1", "gpipe"),      # join after the first block, pipeline of 2
])
def test_spatial_plan_equals_single_process(stages, join, boundary, schedule):
    cfg = TrainConfig(model=MODEL, batch_size=4, microbatches=2, steps=3, schedule=schedule,
                      optimizer="adam", lr=1e-2, return_state=True, track_memory=False)
    gdoc, pdoc = spatial_docs(cfg, join, stages, boundary)
    results = run_local(train_worker, stages + 1, (cfg, gdoc, pdoc), timeout_s=90)
    assert_matches(results, *reference(cfg))


def _tiles_reference(cfg: TrainConfig, root: str):
    """Plain PyTorch on the whole images of ``root`` (same seed, batches, micro-batches)."""
    import copy

    import torch

    from outcore.runtime.data import default_loss
    from outcore.spatial.data import TileFolderData
    from outcore.zoo import build_model
    from tests.runtime.helpers import accumulated_steps
    _, built = build_model(cfg.model, batch_size=cfg.batch_size, seed=cfg.seed)
    model = copy.deepcopy(built)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    data = TileFolderData(root, cfg.batch_size, cfg.seed)
    losses = accumulated_steps(model, opt, data.batch, cfg.steps, cfg.microbatches,
                               default_loss)
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}


def test_tile_ranks_read_only_their_tile(tmp_path):
    """``--data tiles:FOLDER``: each tile rank reads its tile of the PNG images; training equals
    plain PyTorch on the whole images."""
    import json

    from PIL import Image
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (19, 21, 3), dtype=np.uint8)).save(
            tmp_path / f"img{i}.png")
    (tmp_path / "labels.json").write_text(json.dumps({f"img{i}.png": i % 3 for i in range(4)}))
    cfg = TrainConfig(model=MODEL, batch_size=4, microbatches=2, steps=2, schedule="1f1b",
                      optimizer="adam", lr=1e-2, return_state=True, track_memory=False,
                      data=f"tiles:{tmp_path}")
    from outcore.cost.spatial_geometry import TileGrid
    from outcore.spatial.data import TileFolderData
    (x,), _ = TileFolderData(str(tmp_path), 4, 0, grid=TileGrid(rows=2, cols=1), tile=1).batch(0)
    assert tuple(x.shape) == (4, 3, 9, 21)      # tile 1: rows 10..18 only
    gdoc, pdoc = spatial_docs(cfg, "relu_3", 1, None)
    results = run_local(train_worker, 2, (cfg, gdoc, pdoc), timeout_s=90)
    assert_matches(results, *_tiles_reference(cfg, str(tmp_path)))


def test_four_tiles_on_a_2x2_grid():
    """``--sp 4 --sp-grid 2x2``: tiles of 10/9 rows and 11/10 columns, corner halos in the
    second exchange step; 1 stage, 4 ranks."""
    cfg = TrainConfig(model=MODEL, batch_size=4, microbatches=2, steps=2, schedule="1f1b",
                      optimizer="adam", lr=1e-2, return_state=True, track_memory=False)
    gdoc, pdoc = spatial_docs(cfg, "relu_1", 1, None, grid="2x2")
    results = run_local(train_worker, 4, (cfg, gdoc, pdoc), timeout_s=120)
    assert_matches(results, *reference(cfg))


UNET = f"{Path(__file__).parent / 'sp_models.py'}:unet"


def unet_config(steps: int) -> TrainConfig:
    """SGD with momentum and a large step: Adam divides each gradient by its own magnitude, so
    the rounding of a weight whose gradient nearly cancels (the dilated bottleneck convolution)
    becomes a full step of noise; SGD moves every weight by its gradient, so an error in a
    gradient shows in the parameters."""
    return TrainConfig(model=UNET, batch_size=4, microbatches=2, steps=steps, schedule="1f1b",
                       optimizer="sgd", lr=0.1, momentum=0.9, return_state=True,
                       track_memory=False)


@pytest.mark.parametrize("grid,stages,join,boundary", [
    # join after the bottleneck: the skip connections enc1 (19 rows: 10/9) and enc2 (9: 5/4)
    # are gathered with it; the decoder runs on tile 0 (2 ranks)
    ("2x1", 1, "mid_1", None),
    # join after the second encoder level, the decoder's second half on a second stage: the
    # gathered enc1 skip goes on to rank 1 (3 ranks: the extra tile rank is rank 2)
    ("2x1", 2, "enc2_2", "up1"),
])
def test_unet_skip_connections_gathered_at_the_join(grid, stages, join, boundary):
    cfg = unet_config(steps=3)
    gdoc, pdoc = spatial_docs(cfg, join, stages, boundary, grid=grid)
    results = run_local(train_worker, stages + 1, (cfg, gdoc, pdoc), timeout_s=90)
    assert_matches(results, *reference(cfg))


def test_unet_on_four_tiles():
    """4x1 tiles of 5/5/5/4, 3/2/2/2 and 1/1/1/1 rows; join at the bottleneck (4 ranks)."""
    cfg = unet_config(steps=2)
    gdoc, pdoc = spatial_docs(cfg, "mid_1", 1, None, grid="4x1")
    results = run_local(train_worker, 4, (cfg, gdoc, pdoc), timeout_s=120)
    assert_matches(results, *reference(cfg))


def test_unet_through_the_api_with_a_pipeline(tmp_path):
    """``outcore.train(..., sp=2, sp_join="mid_1")``: the planner places the decoder over a
    2-stage pipeline after the join (3 ranks); the losses equal plain PyTorch's."""
    import outcore
    g = outcore.model_graph(UNET, costs="estimate:cpu", batch_size=4)
    one = outcore.plan(g, 2, sp=2, sp_join="mid_1", strategy="pipeline")
    assert one.stages == 1      # no limit: the decoder stays on the spatial stage
    memory = 0.8 * max(one.predicted["peak_bytes"])
    report = outcore.train(UNET, 3, memory=memory, sp=2, sp_join="mid_1",
                           strategy="pipeline", costs="estimate:cpu", batch_size=4, steps=3,
                           optimizer="sgd", lr=0.1, run_dir=str(tmp_path / "run"), trace=False)
    p = report.plan
    assert p.spatial.join == "mid_1" and p.layout.sp == 2 and p.stages == 2
    assert p.devices == 3 and len(set(p.assignment.tolist())) == 2
    ref_losses, _ = reference(dataclasses.replace(unet_config(steps=3), microbatches=1))
    np.testing.assert_allclose(report.losses, ref_losses, rtol=1e-5, atol=0)


def test_spatial_with_data_parallel_copies():
    """SP + DP (``--sp 2 --dp 2``): two copies of a 2-tile group (4 ranks: ordinary slots 0
    and 1, extra tile ranks 2 and 3), each on its half of the batch; the tiled layers'
    gradients summed over the copies (tile 0: the data-parallel buckets; extra tiles: their
    own group) and over the tiles."""
    cfg = TrainConfig(model=MODEL, batch_size=4, microbatches=1, steps=3, schedule="1f1b",
                      optimizer="sgd", lr=0.1, momentum=0.9, return_state=True,
                      track_memory=False)
    g = graph_for(cfg, copies=2)
    names = [g.name_of(i) for i in range(g.num_nodes)]
    j = names.index("relu_1")
    sp = SpatialPlan(grid="2x1", join="relu_1", tiled=tuple(int(i) for i in g.ids[:j + 1]))
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
                           trace=False)
    p = report.plan
    assert p.layout.dp == 2 and p.layout.sp == 2 and p.devices == 4
    ref_losses, _ = reference(dataclasses.replace(unet_config(steps=3), microbatches=1),
                              chunks=2)
    np.testing.assert_allclose(report.losses, ref_losses, rtol=1e-5, atol=0)
