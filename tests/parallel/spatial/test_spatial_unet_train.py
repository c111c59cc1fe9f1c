"""A U-Net through spatial plans: its skip connections from the tiled encoder to the decoder
after the join are gathered at the join (``SpatialPlan.gathered``). Odd image size (19 x 23:
tiles of 10/9, 5/4 and 2/2 rows on 2 tiles), two transposed convolutions; losses and every
parameter of every rank after 2-3 SGD steps equal single-process training to 1e-5 relative."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.parallel.spatial.plan_helpers import UNET, spatial_docs, unet_config
from tests.runtime.helpers import assert_matches, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]


@pytest.mark.parametrize("grid,stages,join,boundary", [
    # join after the bottleneck: the skip connections enc1 (19 rows: 10/9) and enc2 (9: 5/4)
    # are gathered with it; the decoder runs on tile 0 (2 ranks; slow: the pipelined join
    # below gathers a skip too)
    pytest.param("2x1", 1, "mid_1", None, marks=pytest.mark.slow),
    # join after the second encoder level, the decoder's second half on a second stage: the
    # gathered enc1 skip goes on to rank 1 (3 ranks: the extra tile rank is rank 2)
    ("2x1", 2, "enc2_2", "up1"),
])
def test_unet_skip_connections_gathered_at_the_join(grid, stages, join, boundary):
    cfg = unet_config(steps=3)
    gdoc, pdoc = spatial_docs(cfg, join, stages, boundary, grid=grid)
    results = run_local(train_worker, stages + 1, (cfg, gdoc, pdoc), timeout_s=90)
    assert_matches(results, *reference(cfg))


@pytest.mark.slow
def test_unet_on_four_tiles():
    """4x1 tiles of 5/5/5/4, 3/2/2/2 and 1/1/1/1 rows; join at the bottleneck (4 ranks)."""
    cfg = unet_config(steps=2)
    gdoc, pdoc = spatial_docs(cfg, "mid_1", 1, None, grid="4x1")
    results = run_local(train_worker, 4, (cfg, gdoc, pdoc), timeout_s=120)
    assert_matches(results, *reference(cfg))


def test_unet_through_the_api_with_a_pipeline(tmp_path):
    """``outcore.train(..., sp=2, sp_join="mid_1")``: the planner places the decoder over a
    2-stage pipeline after the join (3 ranks); the losses equal plain PyTorch's with the same
    micro-batches. (Two: with one, the decoder's stage alone needs as much as the whole
    model on one stage, its convolutions' scratch memory counted.)"""
    import outcore
    g = outcore.model_graph(UNET, costs="estimate:cpu", batch_size=4)
    one = outcore.plan(g, 2, sp=2, sp_join="mid_1", strategy="pipeline")
    assert one.stages == 1      # no limit: the decoder stays on the spatial stage
    memory = 0.95 * max(one.predicted["peak_bytes"])  # under it: the decoder moves on
    report = outcore.train(UNET, 3, memory=memory, sp=2, sp_join="mid_1", microbatches=2,
                           strategy="pipeline", costs="estimate:cpu", batch_size=4, steps=3,
                           optimizer="sgd", lr=0.1, run_dir=str(tmp_path / "run"), timeline=False)
    p = report.plan
    assert p.spatial.join == "mid_1" and p.layout.sp == 2 and p.stages == 2
    assert p.devices == 3 and len(set(p.assignment.tolist())) == 2
    ref_losses, _ = reference(unet_config(steps=3).replace(microbatches=2))
    np.testing.assert_allclose(report.losses, ref_losses, rtol=1e-5, atol=0)
