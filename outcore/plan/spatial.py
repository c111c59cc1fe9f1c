"""Spatial parallelism on the plan: which layers run on image tiles, and where they join (no torch).

MPI4DL's SP + LP (Jain et al., "Exploiting hybrid parallelism for training large models on
huge images", public code OSU-Nowlab/MPI4DL): the layers before a *join point* run on ``sp``
tiles of the image, each tile on its own rank, exchanging halos at every windowed layer; at the
join the tiles are gathered onto one rank and the rest of the graph runs with the ordinary plan
(pipeline, ParDNN). MPI4DL numbers the spatial ranks of the first split first and the layer-
parallel ranks after them; outcore keeps the ordinary device slots first (``0 .. stages-1``,
unchanged by ``sp``, so a plan without tiles numbers its ranks the same) and appends the
``sp - 1`` extra tile ranks after them: the tile group is ``[stage of the inputs] + [stages,
..., stages + sp - 2]``, its tile 0 being the stage's ordinary rank, on which the gathered
activation continues.

The join is a cut of the graph in its (topological) node order: the *tiled prefix* is every
node up to and including the join node, and every tiled node is a layer with a spatial version
(convolution, pooling, batch norm, element-wise, residual add, channel concatenation,
upsampling). Every tiled tensor used after the cut is *gathered* at the join: the join node's
output, and the skip connections of a U-Net whose encoder runs on tiles and whose decoder does
not (:meth:`SpatialPlan.gathered`). :func:`join_candidates` lists the valid cuts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from outcore.cost.spatial_geometry import TileGrid
from outcore.errors import FormatError, UsageError
from outcore.graph.ir import Graph

__all__ = ["SpatialPlan", "SPATIAL_OPS", "crossing", "home_rank", "join_candidates",
           "prefix_of", "tile_fraction", "tile_ranks", "tile_group"]

SPATIAL_OPS = frozenset({
    "input", "conv2d", "convtranspose2d", "conv_transpose2d", "batchnorm2d", "maxpool2d",
    "avgpool2d", "upsample", "relu", "relu_", "relu6", "leakyrelu", "elu", "gelu", "silu",
    "sigmoid", "tanh", "hardswish", "hardsigmoid", "mish", "prelu", "identity", "softplus",
    "add", "iadd", "add_", "mul", "sub", "cat"})


@dataclass(frozen=True, kw_only=True)
class SpatialPlan:
    """The tiled part of a plan.

    Attributes:
        grid: tile grid, ``"ROWSxCOLS"`` (``"2x1"``: 2 tiles over the height).
        join: name of the join node: the last tiled node; its output, and every other tiled
            output used after it (skip connections), is gathered.
        tiled: ids of the nodes that run on tiles (the join node and every node before it).
        stage: the stage holding the graph's inputs (its rank is tile 0).
        reason: why the planner joined there (for ``outcore plan``).
    """

    grid: str
    join: str
    tiled: tuple[int, ...]
    stage: int = 0
    reason: str = ""

    def __post_init__(self) -> None:
        TileGrid.parse(self.grid)

    @property
    def tiles(self) -> int:
        return TileGrid.parse(self.grid).tiles

    def to_dict(self) -> dict[str, Any]:
        return {"grid": self.grid, "join": self.join, "tiled": list(self.tiled),
                "stage": self.stage, "reason": self.reason}

    @staticmethod
    def from_dict(doc: Any, source: str = "plan") -> "SpatialPlan":
        if not isinstance(doc, dict):
            raise FormatError(f"{source}: 'spatial' must be a JSON object")
        try:
            return SpatialPlan(grid=str(doc["grid"]), join=str(doc["join"]),
                               tiled=tuple(int(i) for i in doc["tiled"]),
                               stage=int(doc.get("stage", 0)), reason=str(doc.get("reason", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"{source}: unreadable 'spatial' record ({e}): it needs grid, "
                              "join and tiled") from None

    def on_fine(self, fine: Graph, group: np.ndarray, coarse: Graph) -> "SpatialPlan":
        """This record on the layer-level graph ``fine`` of a plan made on ``coarse`` (its
        collapse; ``group[i]`` = coarse index of fine node ``i``)."""
        mine = set(self.indices(coarse).tolist())
        tiled = [i for i in range(fine.num_nodes) if int(group[i]) in mine]
        return SpatialPlan(grid=self.grid, join=fine.name_of(tiled[-1]),
                           tiled=tuple(int(fine.ids[i]) for i in tiled), stage=self.stage,
                           reason=self.reason)

    def indices(self, g: Graph) -> np.ndarray:
        """Indices in ``g`` of the tiled nodes."""
        index = g.index_of_id
        return np.array(sorted(index[i] for i in self.tiled), dtype=np.int64)

    def gathered(self, g: Graph) -> np.ndarray:
        """Indices in ``g`` of the tiled nodes whose output is gathered at the join (used by a
        node that is not tiled), in node order; the join node is the last."""
        idx = self.indices(g)
        return np.array(crossing(g, idx), dtype=np.int64)


def crossing(g: Graph, tiled: Any) -> list[int]:
    """Indices, in order, of the nodes of ``tiled`` (indices in ``g``) used by a node outside."""
    inside = {int(i) for i in tiled}
    return sorted(i for i in inside if any(int(s) not in inside for s in g.successors(i)))


def _hw(g: Graph, i: int) -> tuple[int, int] | None:
    shape = g.attr(i, "shape")
    return (int(shape[2]), int(shape[3])) if isinstance(shape, list) and len(shape) == 4 \
        and all(isinstance(v, int) for v in shape) else None


def join_candidates(g: Graph, grid: TileGrid) -> list[int]:
    """Indices ``j`` of valid join nodes, in graph order: nodes ``0..j`` all have a spatial
    version and a 4-D output with at least a row and a column per tile, node ``j``'s output is
    used after ``j``, and no model input is (tile 0 may hold only its tile of it). Other
    outputs used after ``j`` (skip connections) are gathered with the join node's."""
    out = []
    crossing: set[int] = set()   # producers <= j with a user > j
    for j in range(g.num_nodes):
        if g.op_of(j) not in SPATIAL_OPS:
            break
        hw = _hw(g, j)
        if hw is None or hw[0] < grid.rows or hw[1] < grid.cols:
            break
        if any(int(s) > j for s in g.successors(j)):
            crossing.add(j)
        crossing = {i for i in crossing if any(int(s) > j for s in g.successors(i))}
        if j in crossing and not any(g.op_of(i) == "input" for i in crossing):
            out.append(j)
    return out


def prefix_of(g: Graph, join: str, grid: TileGrid) -> int:
    """Index of join node ``join`` (a node name); raise :class:`UsageError` naming the valid
    joins when it is not one."""
    names = [g.name_of(i) for i in range(g.num_nodes)]
    valid = join_candidates(g, grid)
    if join not in names or names.index(join) not in valid:
        shown = ", ".join(names[j] for j in valid[:12]) or "none"
        raise UsageError(f"--sp-join {join!r} is not a valid join for a {grid.rows}x{grid.cols} "
                         f"grid (every node up to it must have a spatial version, its output "
                         f"must be used after it and the model's input must not): use one of "
                         f"{shown}")
    return names.index(join)


def tile_fraction(g: Graph, i: int, grid: TileGrid) -> float:
    """Share of node ``i``'s output held by the largest tile (1.0 for non-image outputs)."""
    hw = _hw(g, i)
    if hw is None:
        return 1.0
    r0, r1, c0, c1 = grid.region(0, *hw)   # tile 0 is the largest (first rows and columns)
    return (r1 - r0) * (c1 - c0) / float(hw[0] * hw[1])


def tile_ranks(stages: int, sp: int, dp: int = 1, copy: int = 0) -> list[int]:
    """The extra tile ranks of copy ``copy`` (``d x replicas + k``: data-parallel copy ``d``,
    GEMS replica ``k``) of a plan with ``stages`` ordinary slots per data-parallel copy: after
    the ``dp x stages`` ordinary ranks, ``sp - 1`` per copy."""
    first = stages * dp + copy * (sp - 1)
    return list(range(first, first + sp - 1))


def home_rank(stages: int, spatial: SpatialPlan, copy: int = 0,
              maps: tuple[tuple[int, ...], ...] = ()) -> int:
    """The ordinary rank holding copy ``copy``'s spatial stage (its tile 0): ``d x stages +
    maps[k][stage]`` (GEMS replica ``k`` of data-parallel copy ``d``)."""
    replicas = max(len(maps), 1)
    d, k = divmod(copy, replicas)
    return d * stages + (maps[k][spatial.stage] if maps else spatial.stage)


def tile_group(stages: int, spatial: SpatialPlan, dp: int = 1, copy: int = 0,
               maps: tuple[tuple[int, ...], ...] = ()) -> list[int]:
    """Global ranks of copy ``copy``'s tile group, tile order: its spatial stage's rank, then
    its extra tile ranks."""
    return [home_rank(stages, spatial, copy, maps)] + tile_ranks(stages, spatial.tiles, dp, copy)


def check_spatial_request(req: Any) -> None:
    """Raise :class:`UsageError` unless a :class:`~outcore.plan.request.PlanRequest` with
    ``sp > 1`` can be planned."""
    if req.tp != 1:
        raise UsageError(f"--sp {req.sp} with --tp {req.tp}: spatial and tensor parallelism "
                         "together are not supported yet; use one of them")
    if req.parallel == "master":
        raise UsageError(f"--sp {req.sp} runs with pipeline, ParDNN, data-parallel and GEMS "
                         "MAST placements (MASTER with tiles is not supported yet): use "
                         "--parallel mp or mast")
    if req.devices < req.sp * req.dp:
        raise UsageError(f"--sp {req.sp} with --dp {req.dp} needs at least "
                         f"{req.sp * req.dp} devices, got {req.devices}")
    grid = TileGrid.parse(req.sp_grid) if req.sp_grid else TileGrid(rows=req.sp, cols=1)
    if grid.tiles != req.sp:
        raise UsageError(f"--sp-grid {req.sp_grid} has {grid.tiles} tiles, --sp is {req.sp}")
