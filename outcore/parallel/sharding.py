"""Sharded parameters inside a plan: FSDP / ZeRO-3 over the data-parallel copies of a slot.

A layout with ``depth > 1`` (``outcore.plan.layout``) has the ``depth`` copies of a device slot
hold ``1 / depth`` of its parameters each, with their gradients and optimizer state
(Rajbhandari et al., "ZeRO", SC 2020, stage 3; PyTorch FSDP; AxoNN's depth dimension, Singh et
al., IPDPS 2022). The lowering cuts every rank's nodes into gather units of equal parameter
bytes (``outcore.schedule.lower.shard_units``), so a piece is a unit or part of one:

* before a piece's forward and backward, its units' parameters are all-gathered into one flat
  buffer each and the parameters' ``.data`` point into it; after, they point at nothing again
  (autograd saved the parameter objects, whose data is back in place when the backward runs);
* after the backward, the units' gradients are reduce-scattered into the shard's ``.grad``
  (summed: the loss is already divided by the copies), so whole gradients never outlive a
  piece. Reduce-scattering the part of a gradient one piece produced is exact when a parameter
  is used by several pieces: the scatter is linear;
* with ``dp > depth`` (hybrid sharding) the shards' gradients are all-reduced over the copies
  holding the same shard when the schedule's all-reduce of the bucket comes;
* the optimizer steps the flat shards.

The plan field is ``Layout.depth``; its cost is the shards' memory and the gathers in the
lowering (:func:`outcore.schedule.lower.shard_units`) and the search's sharded layouts
(:func:`outcore.search.tensor.shard_costed`); :class:`Sharding` is its step in building a rank.

``torch.distributed.fsdp.fully_shard`` does the same for modules whose ``forward`` it wraps; a
plan's pieces are fx graph modules run by outcore's executor, with forward and backward called
separately per micro-batch, so the gather and scatter are placed by the executor instead.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from outcore.core.collectives import CollectiveLog
from outcore.core.comm import settled
from outcore.core.modules import has_no_storage, module_params
from outcore.core.values import local
from outcore.errors import RuntimeFailure
from outcore.hardware.memtrack import storage_resized
from outcore.parallel.base import Parallelism, RankBuild

log = logging.getLogger(__name__)

__all__ = ["ParamSharder", "Sharding", "shard_groups", "sharded_names"]


def shard_groups(stages: int, dp: int, depth: int, rank: int, tp: int = 1) -> tuple[Any, Any]:
    """``(shard group, replica group)`` of ``rank`` in a plan whose slot ``d * stages + s`` is
    copy ``d`` of slot ``s`` (ranks ``slot * tp + t``, tensor shard ``t``): the copies ``d``
    with the same ``d // depth`` shard a slot's (tensor shard's) parameters; those with the
    same ``d % depth`` hold the same shard. Every rank creates every group, in one order
    (``torch.distributed.new_group`` is collective)."""
    shard_pg = replica_pg = None

    def ranks_of(copies: list[int], s: int, t: int) -> list[int]:
        return [(d * stages + s) * tp + t for d in copies]

    for s in range(stages):
        for t in range(tp):
            for g in range(dp // depth):
                ranks = ranks_of([g * depth + k for k in range(depth)], s, t)
                pg = dist.new_group(ranks)
                if rank in ranks:
                    shard_pg = pg
            if dp > depth:
                for k in range(depth):
                    ranks = ranks_of([g * depth + k for g in range(dp // depth)], s, t)
                    pg = dist.new_group(ranks)
                    if rank in ranks:
                        replica_pg = pg
    return shard_pg, replica_pg


def _data(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s elements on this rank: a tensor-parallel DTensor's local
    shard (the object itself, not the view ``to_local`` returns), else ``t``."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


class _Unit:
    """Parameters gathered together: one dtype, one flat buffer, this rank's flat shard.

    The parameters are views of ``flat`` for good; releasing them frees ``flat``'s storage
    (resized to nothing) and gathering resizes it back (PyTorch FSDP's storage trick). So a view
    of a weight that autograd saved in the forward (``addmm`` saves ``weight.t()``) does not keep
    the gathered parameters alive until the backward, and sees them again when it runs."""

    def __init__(self, named: list[tuple[str, nn.Parameter]], depth: int, index: int):
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.meshes = [(p.device_mesh, p.placements) if hasattr(p, "_local_tensor") else None
                       for p in self.params]
        data = [_data(p) for p in self.params]
        self.shapes = [d.shape for d in data]
        self.numels = [d.numel() for d in data]
        total = sum(self.numels)
        self.size = -(-total // depth)  # elements per shard (the last one padded)
        # parameters without storage get their values later (:meth:`ParamSharder.load_values`)
        self.flat = torch.zeros(self.size * depth, dtype=data[0].dtype, device=data[0].device)
        self.nbytes = self.flat.untyped_storage().nbytes()
        if not any(has_no_storage(d) for d in data):
            with torch.no_grad():
                torch.cat([d.detach().reshape(-1) for d in data], out=self.flat[:total])
        self.index = index
        self.shard = nn.Parameter(self.own(self.flat).clone())
        offset = 0
        for d, shape, n in zip(data, self.shapes, self.numels):
            d.data = self.flat[offset:offset + n].view(shape)
            offset += n
        self.free()

    def free(self) -> None:
        self._resize(0)

    def allocate(self) -> torch.Tensor:
        self._resize(self.nbytes)
        return self.flat

    def own(self, whole: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a flat buffer of the unit's whole size."""
        return whole[self.index * self.size:(self.index + 1) * self.size]

    def _resize(self, nbytes: int) -> None:
        storage = self.flat.untyped_storage()
        old = storage.data_ptr()
        storage.resize_(nbytes)
        storage_resized(storage, old)  # the CPU memory tracker sees no operator do this


def _sums_in_place(t: torch.Tensor) -> bool:
    """Whether gathers and reduce-scatters of ``t`` run as all-reduces in place: on CPU tensors
    (gloo). gloo's all-gather and reduce-scatter make flat copies of their tensors (the latter
    a clone of the whole input) that its own thread drops when it gets to it, and under load
    one outlived its call by 27 ms, into the next piece: a sharded rank measured 11 % over its
    prediction. An in-place all-reduce holds nothing but the tensors given (twice the bytes on
    the wire; a sum with zeros is exact)."""
    return t.device.type == "cpu"


class ParamSharder:
    """This rank's sharded parameters (see the module docstring).

    Args:
        pieces: per piece of this rank, in an order every copy shares, its ``(name,
            parameter)`` pairs to shard (names shared by every copy).
        group: the shard group (``depth`` ranks); ``replicas``: the group holding the same
            shard in the other sharding groups (None: ``dp == depth``).
        wait: ``wait(work, what)`` with the runtime's timeout.
    """

    def __init__(self, pieces: list[tuple[int, list[tuple[str, nn.Parameter]]]], group: Any,
                 replicas: Any, depth: int, wait: Callable[[Any, str], None]):
        self.group, self.replicas, self.depth, self.wait = group, replicas, depth, wait
        self.log = CollectiveLog()  # the executor's, once it exists (the traced step's timings)
        index = dist.get_rank(group) if group is not None else 0
        self.units: list[_Unit] = []
        self.uses: dict[int, list[_Unit]] = {}
        owner: dict[int, _Unit] = {}
        for piece, named in pieces:
            fresh: dict[torch.dtype, list[tuple[str, nn.Parameter]]] = {}
            for name, p in named:
                if id(p) not in owner and p.requires_grad:
                    fresh.setdefault(p.dtype, []).append((name, p))
                    owner[id(p)] = None  # type: ignore[assignment]
            for same in fresh.values():
                unit = _Unit(same, depth, index)
                self.units.append(unit)
                for _, p in same:
                    owner[id(p)] = unit
            used = {id(owner[id(p)]): owner[id(p)] for _, p in named if owner.get(id(p))}
            self.uses[piece] = list(used.values())
        self.by_name = {n: (u, k) for u in self.units for k, n in enumerate(u.names)}
        log.info("sharding %d parameters in %d units over %d copies", len(self.by_name),
                 len(self.units), depth)

    @property
    def shards(self) -> list[nn.Parameter]:
        """What the optimizer steps instead of the sharded parameters."""
        return [u.shard for u in self.units]

    def sharded(self, p: nn.Parameter) -> bool:
        return any(p is q for u in self.units for q in u.params)

    # ------------------------------------------------------------------ per piece
    def gather(self, piece: int) -> None:
        """Whole parameters of ``piece``'s units, until :meth:`release`."""
        for unit in self.uses.get(piece, ()):
            whole = unit.allocate()
            with settled(whole), \
                    self.log.timed("shard allgather", whole.numel() * whole.element_size()):
                if _sums_in_place(whole):
                    with torch.no_grad():
                        whole.zero_()
                        unit.own(whole).copy_(unit.shard.detach())
                    work = dist.all_reduce(whole, group=self.group, async_op=True)
                else:
                    work = dist.all_gather_single(whole, unit.shard.detach(),
                                                  group=self.group, async_op=True)
                self.wait(work, f"gathering {len(unit.names)} sharded parameters")
                del work

    def release(self, piece: int) -> None:
        for unit in self.uses.get(piece, ()):
            unit.free()

    def reduce_gradients(self, piece: int) -> None:
        """Reduce-scatter the gradients ``piece``'s backward left in its units' parameters
        into the shards' ``.grad`` (and drop the whole gradients)."""
        for unit in self.uses.get(piece, ()):
            flat = torch.zeros(unit.size * self.depth, dtype=unit.shard.dtype,
                               device=unit.shard.device)
            offset = 0
            for p, n in zip(unit.params, unit.numels):
                if p.grad is not None:
                    flat[offset:offset + n].copy_(_data(p.grad).reshape(-1))
                    p.grad = None
                offset += n
            with settled(flat), \
                    self.log.timed("shard reduce_scatter", flat.numel() * flat.element_size()):
                # (settled: gloo's thread lets go of flat before it is dropped)
                if _sums_in_place(flat):
                    work = dist.all_reduce(flat, group=self.group, async_op=True)
                    self.wait(work, f"reduce-scattering {len(unit.names)} sharded gradients")
                    out = unit.own(flat).clone()
                else:
                    out = torch.empty(unit.size, dtype=flat.dtype, device=flat.device)
                    work = dist.reduce_scatter_single(out, flat, group=self.group,
                                                      async_op=True)
                    self.wait(work, f"reduce-scattering {len(unit.names)} sharded gradients")
                del work
            del flat
            g = unit.shard.grad
            unit.shard.grad = out if g is None else g.add_(out)

    def sync_replicas(self) -> None:
        """Hybrid sharding: sum the shards' gradients over the copies holding the same shard."""
        if self.replicas is None:
            return
        grads = [u.shard.grad if u.shard.grad is not None else torch.zeros_like(u.shard)
                 for u in self.units]
        flat = torch.cat([g.reshape(-1) for g in grads])
        work = dist.all_reduce(flat, group=self.replicas, async_op=True)
        self.wait(work, "all-reducing sharded gradients over the data-parallel groups")
        offset = 0
        for u in self.units:
            u.shard.grad = flat[offset:offset + u.size]  # a view: no second copy
            offset += u.size

    # ------------------------------------------------------------------ whole state
    def whole(self, shards: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every sharded parameter's whole value, gathered from per-unit ``shards`` (the
        parameters themselves or optimizer state of their shape), by name."""
        out = {}
        for unit, shard in zip(self.units, shards):
            flat = torch.empty(unit.size * self.depth, dtype=shard.dtype, device=shard.device)
            work = dist.all_gather_single(flat, shard.detach().contiguous(), group=self.group,
                                          async_op=True)
            self.wait(work, "gathering sharded state")
            offset = 0
            for name, shape, n, mesh in zip(unit.names, unit.shapes, unit.numels, unit.meshes):
                value = flat[offset:offset + n].view(shape).clone()
                if mesh is not None:  # a tensor-parallel shard: the DTensor it is part of
                    from torch.distributed.tensor import DTensor
                    value = DTensor.from_local(value, mesh[0], mesh[1], run_check=False)
                out[name] = value
                offset += n
        return out

    def parameters(self) -> dict[str, torch.Tensor]:
        return self.whole([u.shard for u in self.units])

    def optimizer_state(self, state: dict[Any, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The optimizer's state of the shards as whole per-parameter state, by name."""
        out: dict[str, dict[str, Any]] = {}
        keys = sorted({k for u in self.units for k in state.get(u.shard, {})})
        for key in keys:
            values = [state.get(u.shard, {}).get(key) for u in self.units]
            if all(isinstance(v, torch.Tensor) and v.shape == u.shard.shape
                   for v, u in zip(values, self.units)):
                for name, value in self.whole(values).items():  # type: ignore[arg-type]
                    out.setdefault(name, {})[key] = value
            else:  # scalars (Adam's step): the same on every parameter of a unit
                for u, v in zip(self.units, values):
                    for name in u.names:
                        out.setdefault(name, {})[key] = v
        return out

    def _slice(self, unit: _Unit, values: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.zeros(unit.size * self.depth, dtype=unit.shard.dtype,
                           device=unit.shard.device)
        torch.cat([local(v).reshape(-1).to(flat) for v in values],
                  out=flat[:sum(unit.numels)])
        index = dist.get_rank(self.group) if self.group is not None else 0
        return flat[index * unit.size:(index + 1) * unit.size]

    def load_parameters(self, whole: dict[str, torch.Tensor]) -> None:
        """Set the shards from whole parameter values by name (a checkpoint)."""
        with torch.no_grad():
            for u in self.units:
                u.shard.copy_(self._slice(u, [whole[n] for n in u.names]))

    def load_values(self, whole: dict[str, torch.Tensor]) -> None:
        """Set the shards of the units all of whose parameters ``whole`` holds (a rank
        building its sharded parameters a group of units at a time)."""
        with torch.no_grad():
            for u in self.units:
                if all(n in whole for n in u.names):
                    u.shard.copy_(self._slice(u, [whole[n] for n in u.names]))

    def load_optimizer_state(self, state: dict[Any, dict[str, Any]],
                             whole: Callable[[str, str], Any]) -> None:
        """Set the optimizer's shard state from ``whole(name, key)`` values."""
        for u in self.units:
            st = state[u.shard]
            for key in list(st):
                if isinstance(st[key], torch.Tensor) and st[key].shape == u.shard.shape:
                    st[key].copy_(self._slice(u, [whole(n, key) for n in u.names]))
                elif isinstance(st[key], torch.Tensor):
                    st[key].copy_(whole(u.names[0], key))
                else:
                    st[key] = whole(u.names[0], key)


class Sharding(Parallelism):
    """Sharded data parallelism's step: once the rank keeps its parameters, the ones its
    sharded buckets hold become shards (:class:`ParamSharder`), which the optimizer steps
    instead (every rank creates every shard group)."""

    name = "sharding"

    def active(self, plan: Any, world: int) -> bool:
        return plan.layout.depth > 1

    def on_parameters(self, build: RankBuild) -> None:
        sharder = _sharder(build)
        build.made[self.name] = sharder
        build.params = [p for p in build.params if not sharder.sharded(p)] + sharder.shards


def _sharder(build: RankBuild) -> ParamSharder:
    """The :class:`ParamSharder` of this rank's pieces: their parameters that sharded buckets
    hold, pieces in the order of their first node in one model copy."""
    layout, low = build.plan.layout, build.lowered
    tp = layout.tp
    groups = shard_groups(build.plan.stages, layout.dp, layout.depth, build.rank, tp)
    names = sharded_names(build)
    name_of = {id(p): k for k, p in build.named_params.items()}
    per_copy = low.graph.num_nodes // low.copies
    order = sorted(build.modules, key=lambda pm: min(i % per_copy
                                                     for i in low.pieces.pieces[pm.id].nodes))
    pieces = [(pm.id, [(name_of[id(q)], q) for q in module_params(pm.module)
                       if name_of.get(id(q)) in names]) for pm in order]
    wait_s = timedelta(seconds=build.timeout_s)

    def wait(work: Any, what: str) -> None:
        if work.wait(wait_s) is False:
            raise RuntimeFailure(f"rank {build.rank}: timed out after {build.timeout_s:.0f} s "
                                 f"{what}")

    return ParamSharder(pieces, groups[0], groups[1], layout.depth, wait)


def sharded_names(build: RankBuild) -> set[str]:
    """The parameters this rank's sharded buckets hold, by the name every rank uses."""
    schedule = build.lowered.schedule
    meta = schedule.meta
    return {build.aliases.get(n, n) for b, sh in enumerate(meta.get("bucket_sharded", ()))
            if sh and build.slot in schedule.buckets[b] for n in meta["bucket_params"][b]}
