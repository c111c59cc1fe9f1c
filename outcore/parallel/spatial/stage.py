"""The spatial stage at run time: a plan's tiled layers on their tile ranks (MPI4DL's SP + LP).

A plan with ``layout.sp > 1`` (``outcore.plan.spatial``) runs the nodes up to its join on the
tile group: the spatial stage's ordinary rank (tile 0) and the ``sp - 1`` extra tile ranks
numbered after the ordinary slots. Every rank of the group converts the layers of those nodes
in place to their spatial versions (:func:`outcore.parallel.spatial.layers.make_spatial`, halo
exchange inside); then

* on **tile 0**, the piece holding the tiled nodes is edited: the model's input is cut to the
  rank's tile (a tile given as input is kept), and every tiled output used after the join (the
  join node's, and a U-Net's skip connections from its tiled encoder) is gathered onto this
  rank (``gather_tiles(dst=0)``) right after the node that makes it; the nodes after the join
  read the gathered tensors, the tiled ones keep reading tiles; the rest of the piece, and of
  the plan, runs as usual;
* on an **extra tile rank**, the tiled nodes form one module with the same gathers at the same
  places (they return empty tensors there); :meth:`SpatialStage.run_tiles` runs it for each
  micro-batch in the order tile 0 runs its piece's forwards and backwards (the schedule's
  action list), the backward receiving its slices of the gathered activations' gradients (the
  gathers' scatters).

The tile group's collectives (halo exchanges, batch-norm statistics, gathers) must come in the
same order on every rank of the group. Forward: the two modules run the tiled nodes and the
gathers in the same (graph) order. Backward: PyTorch's autograd engine runs, among the ready
functions, the most recently created first; on tile 0 every function after the join is newer
than every gather, so it finishes the layers after the join first, and then both ranks run
the gathers' and tiled layers' backwards from the same ready set in the same order.

The tiled layers' gradients are per-tile partial sums: every rank of the group sums them over
the group (one flat all-reduce) right before its optimizer step, so the replicated parameters
stay identical (``SpatialModel.reduce_gradients``' scheme). A plan with several copies
(data-parallel copies, GEMS MAST replicas) has one tile group per copy; tile 0's partial sums
are summed over the copies by the ordinary data-parallel buckets, an extra tile's over a group
of the same tile of every copy, before the sum over the tiles.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.fx as fx
from torch import nn

from outcore.core.comm import allreduce_into
from outcore.core.modules import PieceModule
from outcore.cost.spatial_geometry import TileGrid
from outcore.errors import PlanError, UsageError
from outcore.graph.ir import Graph
from outcore.parallel.spatial.comm import SpatialGroup, gather_tiles
from outcore.parallel.spatial.layers import POINTWISE_TYPES, SPATIAL_TYPES, make_spatial
from outcore.plan.plan import Plan
from outcore.plan.spatial import home_rank, tile_group, tile_ranks

__all__ = ["SpatialStage", "attach"]

log = logging.getLogger(__name__)


class TileIn(nn.Module):
    """The model's input -> this rank's tile (a tile given as input is kept)."""

    def __init__(self, sg: SpatialGroup, hw: tuple[int, int]):
        super().__init__()
        self.sg, self.hw = sg, tuple(hw)

    def forward(self, x):
        r0, r1, c0, c1 = self.sg.grid.region(self.sg.tile, *self.hw)
        if tuple(x.shape[-2:]) == self.hw:
            return x[..., r0:r1, c0:c1]
        if tuple(x.shape[-2:]) == (r1 - r0, c1 - c0):
            return x
        raise UsageError(f"spatial stage: input of {tuple(x.shape)} is neither the image "
                         f"{self.hw} nor tile {self.sg.tile} ({r1 - r0}x{c1 - c0})")


class Join(nn.Module):
    """The join: the tiles gathered onto tile 0 (an empty tensor on the other tiles)."""

    def __init__(self, sg: SpatialGroup, hw: tuple[int, int]):
        super().__init__()
        self.sg, self.hw = sg, tuple(hw)

    def forward(self, x):
        return gather_tiles(x, self.sg, self.hw, dst=0)


def _index(graph: Graph, name: str) -> int:
    return [graph.name_of(i) for i in range(graph.num_nodes)].index(name)


def _hw(shape: Any) -> tuple[int, int]:
    return int(shape[2]), int(shape[3])


def _convert(gm: fx.GraphModule, graph: Graph, names: list[str], sg: SpatialGroup
             ) -> list[nn.Module]:
    """Make the tiled nodes' layers spatial in place; return the layers holding parameters."""
    nodes = {n.name: n for n in gm.graph.nodes}
    sizes: dict[str, set] = {}
    for name in names:
        n = nodes[name]
        if n.op != "call_module":
            continue
        shapes = graph.attr(_index(graph, name), "in_shapes") or []
        sizes.setdefault(str(n.target), set()).update(_hw(s) for s in shapes[:1])
    out = []
    for target, hws in sizes.items():
        mod = gm.get_submodule(target)
        if type(mod) in SPATIAL_TYPES:
            make_spatial(mod, sg, hws)
        elif not isinstance(mod, POINTWISE_TYPES) and not hasattr(mod, "_sp"):
            raise UsageError(f"layer {target} ({type(mod).__name__}) runs before the spatial "
                             "join but has no spatial version: join before it (--sp-join)")
        if any(True for _ in mod.parameters(recurse=False)):
            out.append(mod)
    return out


class SpatialStage:
    """One rank's part of the tile group (see the module docstring)."""

    def __init__(self, sg: SpatialGroup, layers: list[nn.Module], tiles_module: Any,
                 order: list[tuple[str, int]], images: dict[str, tuple[int, int]] | None = None,
                 copy: int = 0, copies: int = 1, dp_group: Any = None):
        self.sg = sg
        self.images = images or {}         # model inputs the tiled layers read: name -> (H, W)
        self.layers = layers
        self.tiles_module = tiles_module   # extra tile ranks: the tiled nodes + gather
        self.order = order                 # ("F"/"B", micro-batch) of tile 0's piece
        self.copy, self.copies = copy, copies   # data-parallel copy of this tile group
        self.dp_group = dp_group           # extra tile ranks, dp > 1: this tile of every copy

    @property
    def is_extra(self) -> bool:
        return self.tiles_module is not None

    def parameters(self) -> list[nn.Parameter]:
        seen: dict[int, nn.Parameter] = {}
        for m in self.layers:
            for p in m.parameters(recurse=False):
                seen.setdefault(id(p), p)
        return list(seen.values())

    def reduce_gradients(self) -> None:
        """Sum the tiled layers' gradients over the tile group (one flat all-reduce); with
        data parallelism an extra tile rank first sums them over the same tile of every copy
        (tile 0's were summed over the copies by the executor's data-parallel buckets)."""
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if self.dp_group is not None:
            allreduce_into(grads, self.dp_group)
        allreduce_into(grads, self.sg.group)

    def run_tiles(self, inputs: list[tuple[torch.Tensor, ...]],
                  precision: Callable[[], Any] = contextlib.nullcontext) -> None:
        """Extra tile rank: forward and backward of every micro-batch of its copy (``inputs``:
        the micro-batches of every copy, copy-major), in tile 0's order; the forwards run in
        the context ``precision()`` makes (the run's autocast)."""
        outs: dict[int, tuple[torch.Tensor, ...]] = {}
        first = self.copy * (len(inputs) // self.copies)
        for op, mb in self.order:
            if op == "F":
                with precision():
                    outs[mb] = tuple(self.tiles_module.module(*inputs[first + mb]))
            else:
                out = outs.pop(mb)
                torch.autograd.backward(out, [torch.empty(0, device=t.device) for t in out])


def _join_name(name: str) -> str:
    return f"sp_join_{name}"


def _tile0_edit(pm: PieceModule, sg: SpatialGroup, graph: Graph, names: list[str],
                gathered: list[str], inputs: list[str]) -> None:
    """Tile 0's piece: inputs cut to the tile, the gathered nodes' outputs gathered for the
    nodes after the join (the tiled nodes keep reading the tiles)."""
    g = pm.module.graph
    tiled = set(names)
    for n in list(g.nodes):
        if n.op == "placeholder" and n.name[3:] in inputs:
            hw = _hw(graph.attr(_index(graph, n.name[3:]), "shape"))
            pm.module.add_submodule(f"sp_tile_{n.name}", TileIn(sg, hw))
            with g.inserting_after(n):
                cut = g.call_module(f"sp_tile_{n.name}", (n,))
            n.replace_all_uses_with(cut, delete_user_cb=lambda u: u is not cut)
    nodes = {n.name: n for n in g.nodes}
    for name in gathered:
        node = nodes[name]
        pm.module.add_submodule(_join_name(name),
                                Join(sg, _hw(graph.attr(_index(graph, name), "shape"))))
        with g.inserting_after(node):
            joined = g.call_module(_join_name(name), (node,))
        node.replace_all_uses_with(
            joined, delete_user_cb=lambda u: u is not joined and u.name not in tiled)
    pm.module.recompile()


def _tiles_module(gm: fx.GraphModule, names: list[str], gathered: list[str], sg: SpatialGroup,
                  graph: Graph) -> PieceModule:
    """Extra tile rank: the tiled nodes as one module, inputs cut to the tile, outputs the
    (empty) gathers of the gathered nodes, each right after its node (as on tile 0)."""
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    root = nn.Module()
    nodes = {m.name: m for m in gm.graph.nodes}
    joins = []
    for name in names:
        n = nodes[name]
        if n.op == "placeholder":
            hw = _hw(graph.attr(_index(graph, name), "shape"))
            setattr(root, f"sp_tile_{name}", TileIn(sg, hw))
            env[name] = g.call_module(f"sp_tile_{name}", (g.placeholder(name),))
            continue
        env[name] = g.node_copy(n, lambda a: env[a.name])
        if name in gathered:
            setattr(root, _join_name(name),
                    Join(sg, _hw(graph.attr(_index(graph, name), "shape"))))
            joins.append(g.call_module(_join_name(name), (env[name],)))
    g.output(tuple(joins))
    for n in g.nodes:   # the layers themselves: shared with gm (pruning keeps them)
        if n.op == "call_module" and not hasattr(root, str(n.target).split(".")[0]):
            parts = str(n.target).split(".")
            setattr(root, parts[0], gm.get_submodule(parts[0]))
    module = fx.GraphModule(root, g, "spatial_tiles")
    return PieceModule(-1, module, [], [], [])


def attach(rank: int, gm: fx.GraphModule, graph: Graph, plan: Plan, low: Any,
           modules: list[PieceModule]) -> SpatialStage | None:
    """Every rank calls this (it creates the tile group); returns this rank's
    :class:`SpatialStage`, or None for a rank outside the tile group."""
    sp = plan.spatial
    copy, pg, dp_pg = _groups(rank, plan)
    if copy is None:
        return None
    sg = SpatialGroup(TileGrid.parse(sp.grid), pg)
    names = [graph.name_of(i) for i in sp.indices(graph).tolist()]
    piece_of = low.pieces.piece_of   # on the copied graph: copy c's node i is c * n + i
    pieces = {int(piece_of[copy * graph.num_nodes + _index(graph, n)]) for n in names}
    if len(pieces) != 1:
        raise PlanError(f"the tiled layers of the spatial plan span {len(pieces)} pieces on rank "
                        f"{sp.stage}; they must form one piece: re-plan without memory policies "
                        "on them")
    piece = pieces.pop()
    if low.costs.policies and low.costs.policies[piece] != "none":
        raise PlanError("the spatial stage's piece has a memory policy "
                        f"({low.costs.policies[piece]}): re-plan with --memory-policy none")
    home = home_rank(plan.stages, sp, copy, plan.layout.maps)
    order = [(a.op, a.mb) for a in low.schedule.actions[home]
             if a.op in ("F", "B") and a.piece == piece]
    layers = _convert(gm, graph, names, sg)
    inputs = [n for n in names if graph.op_of(_index(graph, n)) == "input"]
    gathered = [graph.name_of(i) for i in sp.gathered(graph).tolist()]
    images = {n: _hw(graph.attr(_index(graph, n), "shape")) for n in inputs}
    copies = plan.layout.copies
    if rank == home:
        pm = next(m for m in modules if m.id == piece)
        _tile0_edit(pm, sg, graph, names, gathered, inputs)
        return SpatialStage(sg, layers, None, order, images, copy, copies)
    log.info("rank %d: tile %d of %s (copy %d), %d tiled nodes, %d gathered at the join", rank,
             sg.tile, sp.grid, copy, len(names), len(gathered))
    return SpatialStage(sg, layers, _tiles_module(gm, names, gathered, sg, graph), order,
                        images, copy, copies, dp_pg)


def _groups(rank: int, plan: Plan) -> tuple[int | None, Any, Any]:
    """Create every copy's tile group (data-parallel copies x GEMS replicas) and, with more
    than one copy, a group per extra tile over the copies (every rank creates every group, in
    the same order); return this rank's copy (None outside every tile group), tile group and
    the group of its tile over the copies."""
    sp, stages, dp = plan.spatial, plan.stages, plan.layout.dp
    copies, maps = plan.layout.copies, plan.layout.maps
    mine: tuple[int | None, Any, Any] = (None, None, None)
    for c in range(copies):
        ranks = tile_group(stages, sp, dp, c, maps)
        pg = dist.new_group(ranks)
        if rank in ranks:
            mine = (c, pg, None)
    if copies > 1:
        for t in range(sp.tiles - 1):
            ranks = [tile_ranks(stages, sp.tiles, dp, c)[t] for c in range(copies)]
            pg = dist.new_group(ranks)
            if rank in ranks:
                mine = (mine[0], mine[1], pg)
    return mine
