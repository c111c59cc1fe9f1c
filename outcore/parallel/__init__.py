"""The parallelisms a rank is built with, as plug-ins over the runtime core (:mod:`outcore.core`).

Each is one :class:`~outcore.parallel.base.Parallelism` (its module says where its plan
field, cost and lowering live); :data:`PARALLELISMS` is the one registration, in the order the
trainer applies them: tensor, spatial, sharding, replicas. Adding a parallelism is a module here
and a line in that tuple.
"""

from outcore.parallel.base import Parallelism, RankBuild
from outcore.parallel.replicas import Replicas
from outcore.parallel.sharding import Sharding
from outcore.parallel.spatial.rank import SpatialParallelism
from outcore.parallel.tensor.rank import TensorParallelism

PARALLELISMS: tuple[Parallelism, ...] = (TensorParallelism(), SpatialParallelism(), Sharding(),
                                         Replicas())

__all__ = ["PARALLELISMS", "Parallelism", "RankBuild", "active"]


def active(plan, world: int) -> list[Parallelism]:
    """The parallelisms ``plan`` uses on ``world`` ranks, in the order they apply."""
    return [p for p in PARALLELISMS if p.active(plan, world)]
