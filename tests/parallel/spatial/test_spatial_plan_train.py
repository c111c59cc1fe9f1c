"""A spatial plan trains exactly like one process (MPI4DL's SP + LP on outcore's runtime).

The layers before the join run on 2 tiles of unequal height (19 rows: 10 + 9; a stride-2
convolution and a 3x3 stride-2 max pool cross the tile border); at the join the tiles are
gathered onto the spatial stage's rank, which continues with 1 stage (2 ranks) or a 2-stage
pipeline (3 ranks: the extra tile rank is rank 2), and on a 2x2 grid (4 ranks). Losses and
every parameter of every rank after 2-3 optimizer steps are compared with plain single-process
training.
"""

from __future__ import annotations

import numpy as np
import pytest

from outcore.config import TrainConfig
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.parallel.spatial.plan_helpers import MODEL, spatial_docs
from tests.runtime.helpers import assert_matches, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]


@pytest.mark.parametrize("stages,join,boundary,schedule", [
    # join after the second block: 2 ranks (slow: the pipeline below covers the join)
    pytest.param(1, "relu_3", None, "1f1b", marks=pytest.mark.slow),
    (2, "relu_1", "_5_conv1", "gpipe"),      # join after the first block, pipeline of 2
])
def test_spatial_plan_equals_single_process(stages, join, boundary, schedule):
    cfg = TrainConfig.make(model=MODEL, batch_size=4, microbatches=2, steps=3, schedule=schedule,
                           optimizer="adam", lr=1e-2, return_state=True, track_memory=False)
    gdoc, pdoc = spatial_docs(cfg, join, stages, boundary)
    results = run_local(train_worker, stages + 1, (cfg, gdoc, pdoc), timeout_s=90)
    losses, state = reference(cfg)
    assert_matches(results, losses, state)
    # every rank allocated exactly the parameters it trains (the extra tile rank its tiled
    # layers'), not the whole model's
    for r in results:
        own = sum(v.numel() * v.element_size() for v in r["state"].values())
        assert r["built_bytes"] == own, (r["rank"], r["built_bytes"], own)


def _tiles_reference(cfg: TrainConfig, root: str):
    """Plain PyTorch on the whole images of ``root`` (same seed, batches, micro-batches)."""
    import copy

    import torch

    from outcore.parallel.spatial.data import TileFolderData
    from outcore.runtime.data import default_loss
    from outcore.zoo import build_model
    from tests.runtime.helpers import accumulated_steps
    _, built = build_model(cfg.graph.model, batch_size=cfg.graph.batch_size, seed=cfg.run.seed)
    model = copy.deepcopy(built)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.optim.lr)
    data = TileFolderData(root, cfg.graph.batch_size, cfg.run.seed)
    losses = accumulated_steps(model, opt, data.batch, cfg.run.steps, cfg.planning.microbatches,
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
    cfg = TrainConfig.make(model=MODEL, batch_size=4, microbatches=2, steps=2, schedule="1f1b",
                           optimizer="adam", lr=1e-2, return_state=True, track_memory=False,
                           data=f"tiles:{tmp_path}")
    from outcore.cost.spatial_geometry import TileGrid
    from outcore.parallel.spatial.data import TileFolderData
    (x,), _ = TileFolderData(str(tmp_path), 4, 0, grid=TileGrid(rows=2, cols=1), tile=1).batch(0)
    assert tuple(x.shape) == (4, 3, 9, 21)      # tile 1: rows 10..18 only
    gdoc, pdoc = spatial_docs(cfg, "relu_3", 1, None)
    results = run_local(train_worker, 2, (cfg, gdoc, pdoc), timeout_s=90)
    assert_matches(results, *_tiles_reference(cfg, str(tmp_path)))


def test_four_tiles_on_a_2x2_grid():
    """``--sp 4 --sp-grid 2x2``: tiles of 10/9 rows and 11/10 columns, corner halos in the
    second exchange step; 1 stage, 4 ranks."""
    cfg = TrainConfig.make(model=MODEL, batch_size=4, microbatches=2, steps=2, schedule="1f1b",
                           optimizer="adam", lr=1e-2, return_state=True, track_memory=False)
    gdoc, pdoc = spatial_docs(cfg, "relu_1", 1, None, grid="2x2")
    results = run_local(train_worker, 4, (cfg, gdoc, pdoc), timeout_s=120)
    assert_matches(results, *reference(cfg))
