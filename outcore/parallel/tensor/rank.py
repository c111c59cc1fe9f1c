"""Tensor parallelism's step in building a rank: the plan's Megatron pairs split over the
``tp`` ranks of each device slot.

A model traced with torch.fx has its modules split before tracing
(:func:`~outcore.parallel.tensor.parallel.split_for_plan`) and the head counts its traced graph
reads sliced after (:func:`~outcore.parallel.tensor.graph_split.slice_head_operands`); a model
captured with torch.export has its ATen calls split in the traced graph itself
(:func:`~outcore.parallel.tensor.parallel.split_traced_for_plan`). The plan field is
``Layout.tp``; the layout and its cost are :func:`outcore.cost.tensor.plan_layout` and
:func:`outcore.cost.tensor.tensor_graph`, which the lowering and the search read."""

from __future__ import annotations

from typing import Any

from outcore.core.randomness import set_shards
from outcore.parallel.base import Parallelism, RankBuild
from outcore.parallel.tensor.graph_split import current_tensor_mesh, slice_head_operands
from outcore.parallel.tensor.parallel import is_exported, split_for_plan, split_traced_for_plan
from outcore.parallel.tensor.timing import timed_step

__all__ = ["TensorParallelism"]


class TensorParallelism(Parallelism):
    """Splits the slot's layers over its ``tp`` ranks (every rank creates the meshes)."""

    name = "tensor"

    def active(self, plan: Any, world: int) -> bool:
        return plan.layout.tp > 1

    def on_model(self, build: RankBuild) -> None:
        if not is_exported(build.graph):  # split the modules, then trace them
            build.made[self.name] = split_for_plan(build.model, build.graph,
                                                   build.plan.layout.tp)

    def on_trace(self, build: RankBuild) -> None:
        if is_exported(build.graph):  # ATen calls: split the exported trace itself
            build.made[self.name] = split_traced_for_plan(build.gm, build.graph,
                                                          build.plan.layout.tp)
        else:  # per-head operands: sliced in the traced graph
            slice_head_operands(build.gm, build.graph, build.made[self.name])
        # dropout on a shard draws its part of the whole sample's mask, as one device does
        g = build.graph
        set_shards(build.shard, build.plan.layout.tp,
                   {g.name_of(i): g.attr(i, "shape") for i in range(g.num_nodes)},
                   int(g.batch_size or 0))

    def on_trainer(self, trainer: Any) -> None:
        """The traced step times this slot's tensor-parallel collectives."""
        group = current_tensor_mesh().get_group()
        trainer.traced_steps.append(lambda log: timed_step(log, group))
