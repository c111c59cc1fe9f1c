"""How a parallelism plugs into the runtime core.

A rank's :class:`~outcore.runtime.trainer.Trainer` builds its share of a plan in a fixed
sequence of steps; at each step it hands the same :class:`RankBuild` to every parallelism the
plan uses, in the order of :data:`outcore.parallel.PARALLELISMS` (tensor, spatial, sharding,
replicas: as torchtitan applies TP, then activation checkpointing, then FSDP). A parallelism
reads the build, changes the parts it owns (the model before it is traced, the traced module,
the parameters this rank keeps) and records what it made in :attr:`RankBuild.made` for the
steps after it. The core below (messaging, values, piece modules, the executor:
:mod:`outcore.core`) knows none of them.

A parallelism's other parts stay in the torch-free layers where the planner and the simulator
read them: its plan field (:class:`outcore.plan.layout.Layout`), its cost
(:mod:`outcore.cost`), its lowering (:mod:`outcore.schedule.lower`) and its choices in the
search (:mod:`outcore.search.layouts`). Each parallelism's module docstring names them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch
    from torch import nn

    from outcore.graph.ir import Graph
    from outcore.plan.plan import Plan
    from outcore.schedule.lower import Lowered

__all__ = ["Parallelism", "RankBuild"]


@dataclass
class RankBuild:
    """What a rank has built so far (the trainer fills it in step by step).

    Attributes:
        rank, world: this process and the world size.
        slot, shard: this rank's device slot of the plan and its place among the slot's
            ``tp`` tensor-parallel ranks (``rank = slot * tp + shard``).
        plan: the plan on the layer-level graph; ``graph`` that graph.
        model: the whole model (before tracing); ``micro_inputs`` one micro-batch's inputs.
        device: this rank's device; ``timeout_s`` the longest wait for any collective.
        gm: the traced model (from :meth:`Parallelism.on_trace` on).
        lowered: the schedule every rank runs (from :meth:`Parallelism.on_pieces` on).
        modules: this rank's piece modules (from :meth:`Parallelism.on_pieces` on).
        extra_modules: modules whose parameters this rank keeps beside its pieces'.
        named_params: the parameters this rank keeps, by name (from
            :meth:`Parallelism.on_parameters` on); ``params`` those the optimizer updates.
        aliases: tied parameters' names, each to the one name every rank uses.
        made: what each parallelism made, by its name (a tensor layout, a spatial stage, a
            parameter sharder), for the steps and the parallelisms after it.
    """

    rank: int
    world: int
    slot: int
    shard: int
    plan: Plan
    graph: Graph
    model: nn.Module
    micro_inputs: tuple[torch.Tensor, ...]
    device: torch.device
    timeout_s: float
    gm: Any = None
    lowered: Lowered | None = None
    modules: list[Any] = field(default_factory=list)
    extra_modules: list[Any] = field(default_factory=list)
    named_params: dict[str, Any] = field(default_factory=dict)
    params: list[Any] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    made: dict[str, Any] = field(default_factory=dict)


class Parallelism:
    """One parallelism's part in building a rank. Subclasses set :attr:`name`, say when the
    plan uses them (:meth:`active`) and override the steps they take part in; every step
    defaults to doing nothing.

    Every rank runs every step of every active parallelism, in the same order: a step may
    create process groups (a collective) only on that condition.
    """

    name: ClassVar[str] = ""

    def active(self, plan: Plan, world: int) -> bool:
        """Whether the plan (on ``world`` ranks) uses this parallelism."""
        raise NotImplementedError

    def on_model(self, build: RankBuild) -> None:
        """Before the model is traced (split its modules in place)."""

    def on_trace(self, build: RankBuild) -> None:
        """After tracing, before lowering (change the traced module)."""

    def on_pieces(self, build: RankBuild) -> None:
        """After this rank's piece modules are built (attach modules of its own)."""

    def on_parameters(self, build: RankBuild) -> None:
        """After the rank keeps its parameters, before the optimizer is made over
        ``build.params`` (replace them by shards)."""

    def on_trainer(self, trainer: Any) -> None:
        """Once the trainer is whole (optimizer hooks, process groups over its state)."""
