"""AxoNN's 2-D tensor parallelism: each Linear of a pair split over a ``rows x cols`` grid.

AxoNN (Singh & Bhatele, "AxoNN: An asynchronous, message-driven parallel framework for
extreme-scale deep learning", IPDPS 2022; Singh et al., "A 4D Hybrid Algorithm to Scale Parallel
Training to Thousands of GPUs", SC 2024, section 3) splits a Linear's weight over a grid of
``G_r x G_c`` ranks (its public code: ``axonn/intra_layer``); a pair's second Linear uses the
grid transposed, so the activation between them stays sharded. Rank ``(r, c)`` (global rank
``r * cols + c`` of the grid) holds, for a pair ``A -> element-wise -> B``:

* ``A`` (weight ``[out, in]``): output features split by ``c``, input features by ``r``. The
  replicated input is sliced to its ``r``-th features, multiplied, and the partial products
  are all-reduced over the ``r`` ranks sharing ``c``: the output's ``c``-th features, the same
  on every ``r``.
* the element-wise ops (and attention heads, split over ``cols``) run on those shards;
* ``B``: input features split by ``c``, output features by ``r``. Partial products are
  all-reduced over the ``c`` ranks sharing ``r``, then the ``r``-th output shards are
  all-gathered over ``r``: the whole output, replicated.

Backward (the conjugates): ``A``'s input gradient is summed over the ranks sharing ``r`` and
all-gathered over ``r``; ``B``'s input gradient is summed over the ranks sharing ``c``. With
``rows = 1`` this is Megatron's 1-D layout (one all-reduce each way); ``cols = 1`` splits every
layer's reduction dimension instead. Weights are ``DTensor`` shards on a ``("row", "col")``
mesh, so they gather whole, checkpoint and all-reduce across data-parallel copies like any
other. Where the grid pays off against 1-D: :func:`outcore.cost.grid.best_grid`.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from outcore.core.values import local as _local
from outcore.errors import UsageError
from outcore.graph.tensor_pairs import TensorLayout
from outcore.parallel.tensor.graph_split import CopyToTP, GatherFromTP, ReduceFromTP
from outcore.parallel.tensor.heads import divide_heads

log = logging.getLogger(__name__)

__all__ = ["grid_mesh_2d", "split_grid", "grid_fits"]


class _SliceFromTP(torch.autograd.Function):
    """This rank's slice of the last dimension forward; the gradient all-gathered backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.group = group
        width = x.shape[-1] // size
        return x[..., rank * width:(rank + 1) * width].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return GatherFromTP.apply(grad, ctx.group), None


def grid_mesh_2d(rows: int, cols: int) -> Any:
    """A ``("row", "col")`` device mesh of ``rows x cols`` ranks (every rank of the job)."""
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized() or dist.get_world_size() != rows * cols:
        raise UsageError(f"a {rows} x {cols} grid needs {rows * cols} ranks in an initialised "
                         "process group; start that many workers")
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    return init_device_mesh(device, (rows, cols), mesh_dim_names=("row", "col"))


def grid_fits(layout: TensorLayout, model: nn.Module, rows: int, cols: int) -> list[int]:
    """Indices of ``layout``'s pairs (found for ``cols`` ways) whose Linears also divide by
    ``rows`` (``A``'s inputs, ``B``'s outputs) and that hold plain ``nn.Linear`` layers."""
    fits = []
    for k, pair in enumerate(layout.pairs):
        mods = [model.get_submodule(m) for m in pair.columns + pair.rows]
        if max(pair.chunks or (1,)) > 1 or not all(type(m) is nn.Linear for m in mods):
            continue
        a_in = [model.get_submodule(m).in_features for m in pair.columns]
        b_out = [model.get_submodule(m).out_features for m in pair.rows]
        if all(v % rows == 0 for v in a_in + b_out):
            fits.append(k)
    return fits


def _shard(linear: nn.Linear, mesh: Any, out_dim: str, in_dim: str) -> None:
    """Replace ``linear``'s weight (and bias) by this rank's block: output features split over
    mesh dimension ``out_dim``, input features over ``in_dim``."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    names = mesh.mesh_dim_names
    coords = {n: mesh.get_local_rank(n) for n in names}
    sizes = {n: mesh.size(names.index(n)) for n in names}
    w = linear.weight.detach()
    block = w.chunk(sizes[out_dim], 0)[coords[out_dim]].chunk(sizes[in_dim], 1)[coords[in_dim]]
    place = [Shard(0) if n == out_dim else Shard(1) for n in names]
    linear.weight = nn.Parameter(DTensor.from_local(block.clone(), mesh, place, run_check=False),
                                 requires_grad=linear.weight.requires_grad)
    if linear.bias is not None:
        b = linear.bias.detach().chunk(sizes[out_dim], 0)[coords[out_dim]]
        bplace = [Shard(0) if n == out_dim else Replicate() for n in names]
        linear.bias = nn.Parameter(DTensor.from_local(b.clone(), mesh, bplace, run_check=False),
                                   requires_grad=linear.bias.requires_grad)


def _first_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``A``: slice the input over the row group, sum the products over it; the result holds
    this column's output features."""
    rows, cols = self.outcore_grid
    x = CopyToTP.apply(_SliceFromTP.apply(x, rows), cols)
    y = ReduceFromTP.apply(F.linear(x, _local(self.weight)), rows)
    return y if self.bias is None else y + _local(self.bias)


def _second_forward(self: nn.Linear, h: torch.Tensor) -> torch.Tensor:
    """``B``: this column's input features; products summed over the column group, bias once,
    then the row shards gathered into the whole output."""
    rows, cols = self.outcore_grid
    z = ReduceFromTP.apply(F.linear(CopyToTP.apply(h, rows), _local(self.weight)), cols)
    if self.bias is not None:
        z = z + _local(self.bias)
    return GatherFromTP.apply(z, rows)


def split_grid(model: nn.Module, layout: TensorLayout, rows: int, cols: int,
               mesh: Any = None) -> list[int]:
    """Split ``model``'s pairs (a layout found for ``cols`` ways) over the grid in place; return
    the indices of the pairs split (the others stay whole, as do layers that do not pair)."""
    mesh = mesh if mesh is not None else grid_mesh_2d(rows, cols)
    groups = (mesh.get_group("row"), mesh.get_group("col"))
    done = grid_fits(layout, model, rows, cols)
    for k in done:
        pair = layout.pairs[k]
        for name, forward, dims in [(m, _first_forward, ("col", "row")) for m in pair.columns] + \
                                   [(m, _second_forward, ("row", "col")) for m in pair.rows]:
            linear = model.get_submodule(name)
            _shard(linear, mesh, *dims)
            linear.outcore_grid = groups
            linear.forward = types.MethodType(forward, linear)
        if pair.heads:
            divide_heads(model, pair, cols)
    log.info("2-D tensor parallel (%d x %d): %d of %d pairs split", rows, cols, len(done),
             len(layout.pairs))
    return done
