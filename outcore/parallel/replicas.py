"""Model replicas' step in building a rank: batch-norm running statistics that several ranks
hold (GEMS MAST and MASTER replicas, data-parallel copies) are averaged over their holders
whenever the trainer syncs them (before a checkpoint, at the end of a run), so that every rank,
every checkpoint and the trained model agree. The plan fields are ``Layout.replicas`` and
``Layout.dp``; their gradients are summed by the schedule's all-reduce buckets
(:mod:`outcore.schedule.lower`), which the core's executor runs."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from outcore.core.comm import allreduce_into
from outcore.core.offload import running_stats
from outcore.parallel.base import Parallelism

__all__ = ["Replicas", "StatGroup", "sync_running_stats"]

# (process group, members, the running statistics they all hold)
StatGroup = tuple[Any, int, list[torch.Tensor]]


class Replicas(Parallelism):
    """Groups the running statistics by the ranks that hold them (every rank gathers which
    it holds and creates every group, in one order)."""

    name = "replicas"

    def active(self, plan: Any, world: int) -> bool:
        return world > 1

    def on_trainer(self, trainer: Any) -> None:
        trainer.buffer_groups = replicated_running_stats(trainer.gm, trainer.rank,
                                                         trainer.world)


def replicated_running_stats(gm: torch.nn.Module, rank: int, world: int) -> list[StatGroup]:
    """Batch-norm running statistics of ``gm`` that several ranks hold, grouped by their
    holders: ``(group, members, this rank's tensors)`` for each group this rank is in."""
    mine = running_stats(gm, ("running_mean", "running_var"))
    if not dist.is_initialized() or world == 1:
        return []
    names: list[Any] = [None] * world
    dist.all_gather_object(names, sorted(mine))
    holders: dict[str, tuple[int, ...]] = {}
    for r, held in enumerate(names):
        for name in held:
            holders[name] = holders.get(name, ()) + (r,)
    out = []
    for ranks in sorted({h for h in holders.values() if len(h) > 1}):
        pg = dist.new_group(list(ranks))  # every rank creates every group, in one order
        if rank in ranks:
            out.append((pg, len(ranks), [mine[n] for n in sorted(mine) if holders[n] == ranks]))
    return out


def sync_running_stats(groups: list[StatGroup]) -> None:
    """Average each group's running statistics over its members (each replica saw other
    micro-batches). Losses and gradients do not depend on them (training mode)."""
    for pg, n, bufs in groups:
        allreduce_into(bufs, pg, divide_by=n)
