"""``spatialize``: run a model's layers before a join point on image tiles (MPI4DL's spatial
parallelism, the "SP" part of SP + LP / SP + GEMS).

1. *Shape propagation*: a copy of the model on the meta device runs the example input once; every
   module's global input size and the order in which modules are first called are recorded.
2. *Conversion*: every leaf module first called before the join is replaced in place by its spatial
   version (:mod:`outcore.parallel.spatial.layers`), element-wise layers are left as they are,
   anything else raises (it would silently compute per tile).
3. *Join*: a forward pre-hook on the join module gathers its input (all tiles -> the whole tensor
   on every rank); with no join, the model's output is gathered.

The parameters of the spatial layers are replicated over the tiles and each tile's backward gives
the part of their gradient from its region: :meth:`SpatialModel.reduce_gradients` sums them over
the tile group (after the backward, before the optimizer step). The layers after the join run
replicated on every tile and need no reduction.
"""

from __future__ import annotations

import copy
import logging

import torch
import torch.distributed as dist
from torch import nn

from outcore.core.comm import allreduce_into
from outcore.cost.spatial_geometry import TileGrid
from outcore.errors import UsageError
from outcore.parallel.spatial.comm import SpatialGroup, gather_tiles, scatter_image
from outcore.parallel.spatial.layers import POINTWISE_TYPES, SPATIAL_TYPES, make_spatial

__all__ = ["spatialize", "SpatialModel", "record_shapes"]

log = logging.getLogger(__name__)


def record_shapes(model: nn.Module, example: torch.Tensor):
    """Run a meta-device copy of ``model`` on ``example``'s shape. Returns (order of first calls:
    module names, {name: [input shapes]}, output shape)."""
    meta = copy.deepcopy(model).to("meta").eval()   # eval: shapes only, no statistics
    order, shapes, handles = [], {}, []
    for name, mod in meta.named_modules():
        def hook(m, args, name=name):
            if name not in shapes:
                order.append(name)
                shapes[name] = []
            if args and isinstance(args[0], torch.Tensor):
                shapes[name].append(tuple(args[0].shape))
        handles.append(mod.register_forward_pre_hook(hook))
    with torch.no_grad():
        out = meta(torch.empty(example.shape, dtype=example.dtype, device="meta"))
    for h in handles:
        h.remove()
    return order, shapes, tuple(out.shape) if isinstance(out, torch.Tensor) else None


def _leaf(mod: nn.Module) -> bool:
    return next(iter(mod.children()), None) is None


class SpatialModel(nn.Module):
    """A model whose layers before the join run on tiles. ``forward`` takes my tile (or the whole
    image, of which it keeps my tile) and returns what the serial model returns, on every rank."""

    def __init__(self, module: nn.Module, sg: SpatialGroup, image_shape, out_shape,
                 spatial_names: list[str]):
        super().__init__()
        self.module = module
        self.sg = sg
        self.image_shape = tuple(image_shape)
        self.out_shape = out_shape
        self.spatial_names = spatial_names

    def tile_shape(self) -> tuple:
        r0, r1, c0, c1 = self.sg.grid.region(self.sg.tile, *self.image_shape[2:])
        return self.image_shape[:2] + (r1 - r0, c1 - c0)

    def forward(self, x):
        if tuple(x.shape[2:]) == self.image_shape[2:] and self.sg.grid.tiles > 1:
            x = scatter_image(x, self.sg)
        elif tuple(x.shape[2:]) != self.tile_shape()[2:]:
            raise UsageError(f"spatial model: input of {tuple(x.shape)} is neither the image "
                             f"{self.image_shape} nor my tile {self.tile_shape()}")
        y = self.module(x)
        if self.out_shape is not None and isinstance(y, torch.Tensor) and y.dim() == 4 \
                and tuple(y.shape[2:]) != self.out_shape[2:]:
            y = gather_tiles(y, self.sg, self.out_shape[2:])
        return y

    def spatial_parameters(self) -> list[nn.Parameter]:
        """Parameters of the tiled layers (their gradients are per-tile partial sums)."""
        mods = dict(self.module.named_modules())
        return [p for n in self.spatial_names for p in mods[n].parameters(recurse=False)]

    def reduce_gradients(self) -> None:
        """Sum the tiled layers' gradients over the tile group (one flat all-reduce)."""
        if self.sg.grid.tiles > 1:
            allreduce_into([p.grad for p in self.spatial_parameters() if p.grad is not None],
                           self.sg.group)


def _join_hook(sg: SpatialGroup, hw: tuple[int, int]):
    def hook(module, args):
        x = args[0]
        if isinstance(x, torch.Tensor) and x.dim() == 4 and tuple(x.shape[2:]) != hw:
            return (gather_tiles(x, sg, hw),) + tuple(args[1:])
        return None
    return hook


def spatialize(model: nn.Module, grid: TileGrid | str, *, example: torch.Tensor,
               group=None, join: str | None = None) -> SpatialModel:
    """Convert ``model`` in place so that the layers called before module ``join`` (a qualified
    name, e.g. ``"fc"`` or ``"layer3"``; None: the whole model) run on ``grid``'s tiles of an image
    shaped like ``example`` (N, C, H, W), the tile group being ``group`` (None: the default group,
    whose size must be ``grid.tiles``). Returns the wrapper that the rank trains."""
    grid = TileGrid.parse(grid) if isinstance(grid, str) else grid
    sg = SpatialGroup(grid, group)
    if dist.is_initialized() and dist.get_world_size(group) != grid.tiles:
        raise UsageError(f"tile grid {grid.rows}x{grid.cols} needs a group of {grid.tiles} "
                         f"ranks, got {dist.get_world_size(group)}")
    order, shapes, out_shape = record_shapes(model, example)
    mods = dict(model.named_modules())
    if join is not None and join not in shapes:
        raise UsageError(f"join module {join!r} is not called by the model; name one of "
                         f"{[n for n in order if n][:12]}...")
    stop = order.index(join) if join is not None else len(order)
    spatial = []
    for name in order[:stop]:
        mod = mods[name]
        if not _leaf(mod) or (join is not None and join.startswith(name + ".")):
            continue
        if type(mod) in SPATIAL_TYPES:
            make_spatial(mod, sg, {s[2:] for s in shapes[name]})
            spatial.append(name)
        elif isinstance(mod, POINTWISE_TYPES):
            if any(True for _ in mod.parameters(recurse=False)):
                spatial.append(name)
        else:
            raise UsageError(f"layer {name} ({type(mod).__name__}) runs before the join but has "
                             f"no spatial version: move the join before it (join={name!r}) or "
                             f"replace it by one of {sorted(t.__name__ for t in SPATIAL_TYPES)}")
    if join is not None:
        hw = shapes[join][0][2:]
        mods[join].register_forward_pre_hook(_join_hook(sg, tuple(hw)))
        out_shape = None
    log.info("spatial %dx%d: %d layers on tiles, join at %s", grid.rows, grid.cols,
             len(spatial), join or "the output")
    return SpatialModel(model, sg, tuple(example.shape), out_shape, spatial)
