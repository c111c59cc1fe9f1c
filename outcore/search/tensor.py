"""The graph a layout's placements are made on: costed as one tensor-parallel rank sees it
(AxoNN / Megatron splits, :mod:`outcore.cost.tensor`), or as one shard of a sharded layout
holds it, and the plan's note on AxoNN's 2-D grid (no torch)."""

from __future__ import annotations

import numpy as np

from outcore.cost.grid import grid_note
from outcore.cost.tensor import plan_layout, tensor_graph
from outcore.errors import InfeasibleError
from outcore.graph.ir import Graph
from outcore.graph.tensor_pairs import TensorLayout
from outcore.plan.plan import Plan
from outcore.plan.request import PlanRequest

__all__ = ["shard_costed", "tensor_costed", "tensor_split", "with_grid_note"]


def tensor_costed(g: Graph, req: PlanRequest) -> Graph:
    """``g`` costed as one rank of the request's tensor-parallel group sees it (``g`` itself
    for ``tp = 1``): every planner then places device slots of ``tp`` ranks."""
    return tensor_split(g, req)[0]


def tensor_split(g: Graph, req: PlanRequest) -> tuple[Graph, TensorLayout]:
    """:func:`tensor_costed`, and the tensor-parallel layout it costed."""
    if req.tp == 1:
        return g, TensorLayout(tp=1, pairs=(), splits=())
    layout = plan_layout(g, req.fixed_tp)
    if not layout.split_modules:
        raise InfeasibleError(f"--tp {req.tp}: no layer of {g.name!r} can be split {req.tp} "
                              f"ways (split: an nn.Linear / nn.Embedding, or in a "
                              f"torch.export graph Hugging Face's Conv1D, called once, with a "
                              f"width divisible by {req.tp} and, outside a Megatron pair, at "
                              f"least 1 MiB of parameters; convolutions, norms and layers "
                              f"shared across calls stay whole); use --tp 1")
    return tensor_graph(g, req.fixed_tp, req.cluster.link(0, 1), layout=layout)[0], layout


def shard_costed(g: Graph, depth: int) -> Graph:
    """``g`` with each layer's parameter state as one of ``depth`` shards holds it: what the
    placement of a sharded plan budgets (the gathers' working memory and time are the
    lowering's: :func:`outcore.schedule.lower.shard_units`)."""
    return g.replace(param_bytes=np.ceil(g.param_bytes / depth).astype(g.param_bytes.dtype))


def with_grid_note(p: Plan, layout: TensorLayout, req: PlanRequest) -> Plan:
    """``p`` with a note on AxoNN's row x column grid when it is tensor-parallel (``layout``:
    its tensor-parallel layout): what the largest pair's collectives take on the plan's 1-D
    layout and on the best grid (:func:`outcore.cost.grid.grid_note`)."""
    if p.layout.tp == 1:
        return p
    note = grid_note(layout, req.cluster)
    return p.with_notes(note) if note else p
