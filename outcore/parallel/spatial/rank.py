"""Spatial parallelism's step in building a rank: the plan's tiled layers on their tile group
(:func:`~outcore.parallel.spatial.stage.attach`), and the sum of their per-tile gradients
before every optimizer step. The plan field is ``Plan.spatial``
(:class:`outcore.plan.spatial.SpatialPlan`); its cost and lowering are
:mod:`outcore.cost.spatial` and :mod:`outcore.schedule.spatial`, its choice of join
:mod:`outcore.search.spatial`."""

from __future__ import annotations

from typing import Any

from outcore.core.collectives import recording
from outcore.parallel.base import Parallelism, RankBuild
from outcore.parallel.spatial.stage import attach

__all__ = ["SpatialParallelism"]


class SpatialParallelism(Parallelism):
    """Attaches the tile group's stage (every rank creates the tile groups); an extra tile
    rank keeps the tiles module's parameters too."""

    name = "spatial"

    def active(self, plan: Any, world: int) -> bool:
        return plan.spatial is not None

    def on_pieces(self, build: RankBuild) -> None:
        stage = attach(build.rank, build.gm, build.graph, build.plan, build.lowered,
                       build.modules)
        build.made[self.name] = stage
        if stage is not None and stage.is_extra:
            build.extra_modules.append(stage.tiles_module)

    def on_trainer(self, trainer: Any) -> None:
        trainer.traced_steps.append(recording)  # its communication, on the traced step
        stage = trainer.spatial
        if stage is not None and trainer.optimizer is not None:
            trainer.optimizer.register_step_pre_hook(lambda *_: stage.reduce_gradients())
