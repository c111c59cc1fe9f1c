"""Shared pieces of the spatial-plan training tests: plan documents with a named join, and
the models and configurations they train."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from outcore.config import TrainConfig
from outcore.graph.io import to_dict as graph_doc
from outcore.plan.layout import Layout
from outcore.plan.plan import make_plan, to_dict as plan_doc
from outcore.plan.spatial import SpatialPlan
from tests.runtime.helpers import graph_for

MODEL = f"{Path(__file__).parent / 'sp_models.py'}:small_resnet"
UNET = f"{Path(__file__).parent / 'sp_models.py'}:unet"


def spatial_docs(cfg: TrainConfig, join: str, stages: int, boundary: str | None,
                 grid: str = "2x1"):
    """Graph and plan documents: the nodes up to ``join`` on ``grid`` tiles, the rest on
    ``stages`` stages split at node ``boundary`` (None: one stage)."""
    g = graph_for(cfg)
    names = [g.name_of(i) for i in range(g.num_nodes)]
    j = names.index(join)
    a = np.zeros(g.num_nodes, dtype=np.int64)
    if boundary is not None:
        a[names.index(boundary):] = stages - 1
    sp = SpatialPlan(grid=grid, join=join, tiled=tuple(int(i) for i in g.ids[:j + 1]))
    plan = make_plan(g, a, strategy="manual", devices=stages + sp.tiles - 1, memory_bytes=None,
                     microbatches=cfg.planning.microbatches,
                     schedule="1f1b" if cfg.planning.schedule == "auto" else cfg.planning.schedule,
                     layout=Layout(sp=sp.tiles), spatial=sp)
    return graph_doc(g), plan_doc(plan)


def unet_config(steps: int) -> TrainConfig:
    """SGD with momentum and a large step: Adam divides each gradient by its own magnitude, so
    the rounding of a weight whose gradient nearly cancels (the dilated bottleneck convolution)
    becomes a full step of noise; SGD moves every weight by its gradient, so an error in a
    gradient shows in the parameters."""
    return TrainConfig.make(model=UNET, batch_size=4, microbatches=2, steps=steps, schedule="1f1b",
                            optimizer="sgd", lr=0.1, momentum=0.9, return_state=True,
                            track_memory=False)
