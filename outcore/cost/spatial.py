"""Costs of spatial parallelism for the planner and the simulator; pure, no torch.

Per layer and per tile: the halo a tile receives (bytes; the backward sends the same bytes back
as gradients), the bytes of a gather at the join, and the activation bytes a tile holds. They
follow the runtime exactly (:mod:`outcore.parallel.spatial`): halo rows are exchanged first (with
the tiles of the same grid column), then halo columns of the row-extended tile (with the tiles of
the same grid row), so corners travel in the second step; the gather is an all-gather of tiles
padded to the largest tile. MPI4DL's estimate is the same halo of ``(kernel - 1) / 2`` per side for
"same" convolutions; here the halo is exact per side for any kernel, stride, padding, dilation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from outcore.cost.spatial_geometry import (
    TileGrid,
    bilinear_need,
    conv_need,
    conv_out_size,
    conv_transpose_need,
    conv_transpose_out_size,
    halo_sides,
    intervals,
    upsample_need,
)
from outcore.errors import UsageError

__all__ = ["LayerGeometry", "LayerCost", "chain_costs", "output_hw", "tile_needs", "tile_halos",
           "halo_bytes", "gather_bytes", "tile_activation_bytes", "bn_allreduce_bytes"]

KINDS = ("conv", "pool", "conv_transpose", "upsample", "pointwise", "batchnorm", "global_pool")


@dataclass(frozen=True, kw_only=True)
class LayerGeometry:
    """The spatial shape of one layer, per axis (height, width).

    kind: ``conv`` (also max pooling), ``pool`` (average pooling: like conv), ``conv_transpose``,
    ``upsample`` (integer ``factor``, nearest or ``bilinear``), ``pointwise``,
    ``batchnorm`` (no halo; two all-reduces of ``channels`` values), ``global_pool`` (1×1 output).
    """

    kind: str
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    output_padding: tuple[int, int] = (0, 0)
    factor: tuple[int, int] = (1, 1)
    ceil_mode: bool = False
    bilinear: bool = False
    same: bool = False            # conv padding='same': output size = input size, ``padding``
                                  # is the padding before (PyTorch puts the odd one after)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UsageError(f"spatial layer kind {self.kind!r}: use one of {KINDS}")

    def out_size(self, axis: int, n: int) -> int:
        k, s, p, d = (self.kernel[axis], self.stride[axis], self.padding[axis],
                      self.dilation[axis])
        if self.kind == "conv" and self.same:
            return n
        if self.kind in ("conv", "pool"):
            return conv_out_size(n, k, s, p, d, self.ceil_mode)
        if self.kind == "conv_transpose":
            return conv_transpose_out_size(n, k, s, p, d, self.output_padding[axis])
        if self.kind == "upsample":
            return n * self.factor[axis]
        if self.kind == "global_pool":
            return 1
        return n

    def need(self, axis: int, o0: int, o1: int, n: int) -> tuple[int, int]:
        """Input interval (global; may reach into the padding) for output rows ``[o0, o1)``."""
        k, s, p, d = (self.kernel[axis], self.stride[axis], self.padding[axis],
                      self.dilation[axis])
        if self.kind in ("conv", "pool"):
            return conv_need(o0, o1, k, s, p, d)
        if self.kind == "conv_transpose":
            return conv_transpose_need(o0, o1, n, k, s, p, d)
        if self.kind == "upsample":
            if self.bilinear:
                return bilinear_need(o0, o1, n, self.factor[axis])
            return upsample_need(o0, o1, self.factor[axis])
        return o0, o1


def output_hw(layer: LayerGeometry, in_hw: tuple[int, int]) -> tuple[int, int]:
    return layer.out_size(0, in_hw[0]), layer.out_size(1, in_hw[1])


def _axis_needs(layer: LayerGeometry, axis: int, n: int, parts: int) -> list[tuple[int, int]]:
    if layer.kind in ("pointwise", "batchnorm", "global_pool"):
        return intervals(n, parts)
    return [layer.need(axis, o0, o1, n) for o0, o1 in intervals(layer.out_size(axis, n), parts)]


def tile_needs(layer: LayerGeometry, in_hw: tuple[int, int], grid: TileGrid
               ) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Per tile (row-major): the (rows, cols) input intervals it reads (global coordinates)."""
    nh = _axis_needs(layer, 0, in_hw[0], grid.rows)
    nw = _axis_needs(layer, 1, in_hw[1], grid.cols)
    return [(nh[t // grid.cols], nw[t % grid.cols]) for t in range(grid.tiles)]


def tile_halos(layer: LayerGeometry, in_hw: tuple[int, int], grid: TileGrid
               ) -> list[tuple[int, int, int, int]]:
    """Per tile: halo (top, bottom, left, right) rows/columns received from neighbours."""
    rows, cols = intervals(in_hw[0], grid.rows), intervals(in_hw[1], grid.cols)
    out = []
    for t, (need_h, need_w) in enumerate(tile_needs(layer, in_hw, grid)):
        r, c = grid.coords(t)
        out.append(halo_sides(rows[r], need_h, in_hw[0]) + halo_sides(cols[c], need_w, in_hw[1]))
    return out


def halo_bytes(layer: LayerGeometry, batch: int, channels: int, in_hw: tuple[int, int],
               grid: TileGrid, dtype_bytes: int = 4) -> list[int]:
    """Per tile: bytes received by one forward halo exchange of ``layer`` on a
    ``batch × channels × in_hw`` input (the backward sends as many back). Rows first, over the
    tile's own width; then columns, over the rows the tile holds after the first step."""
    cols = intervals(in_hw[1], grid.cols)
    out = []
    for t, ((top, bottom, left, right), (need_h, _)) in enumerate(
            zip(tile_halos(layer, in_hw, grid), tile_needs(layer, in_hw, grid))):
        width = cols[grid.coords(t)[1]]
        held_rows = max(0, min(need_h[1], in_hw[0]) - max(need_h[0], 0))
        elems = (top + bottom) * (width[1] - width[0]) + (left + right) * held_rows
        out.append(elems * batch * channels * dtype_bytes)
    return out


def gather_bytes(batch: int, channels: int, hw: tuple[int, int], grid: TileGrid,
                 dtype_bytes: int = 4) -> int:
    """Bytes each rank receives when the tiles are gathered at the join (an all-gather of tiles
    padded to the largest tile: ``(tiles - 1) ×`` the largest tile)."""
    mh = max(b - a for a, b in intervals(hw[0], grid.rows))
    mw = max(b - a for a, b in intervals(hw[1], grid.cols))
    return (grid.tiles - 1) * mh * mw * batch * channels * dtype_bytes


def tile_activation_bytes(batch: int, channels: int, hw: tuple[int, int], grid: TileGrid,
                          dtype_bytes: int = 4) -> list[int]:
    """Per tile: bytes of its part of a ``batch × channels × hw`` activation."""
    return [(r1 - r0) * (c1 - c0) * batch * channels * dtype_bytes
            for r0, r1, c0, c1 in (grid.region(t, *hw) for t in range(grid.tiles))]


def bn_allreduce_bytes(channels: int, dtype_bytes: int = 4) -> int:
    """Payload of a spatial batch norm's forward all-reduces (sum, then centred sum of squares;
    the backward all-reduces the same two vectors' gradients)."""
    return 2 * channels * dtype_bytes


@dataclass(frozen=True, kw_only=True)
class LayerCost:
    """One layer of a chain on tiles, per tile (the largest over the tiles).

    out_hw: global output size; out_bytes: the tile's output; region_bytes: the input region a
    windowed layer reads and keeps for its backward (own rows + halo + padding; 0 for element-wise
    layers, which read their input in place); halo_bytes: received per forward (the backward sends
    as many back); allreduce_bytes: batch norm's statistics per forward.
    """

    out_hw: tuple[int, int]
    out_bytes: int
    region_bytes: int
    halo_bytes: int
    allreduce_bytes: int


def _region_len(layer: LayerGeometry, need: tuple[int, int], n: int) -> int:
    """Rows of the region a layer computes on: padded for windows, clipped otherwise."""
    if layer.kind in ("conv", "pool"):
        return need[1] - need[0]
    return max(0, min(need[1], n) - max(need[0], 0))


def chain_costs(layers, batch: int, in_hw: tuple[int, int], grid: TileGrid,
                dtype_bytes: int = 4) -> list[LayerCost]:
    """Walk a chain of ``(LayerGeometry, in_channels, out_channels)`` from an image of ``in_hw``;
    one :class:`LayerCost` per layer. A join after layer ``i`` gathers ``layers[i]``'s output
    (:func:`gather_bytes`); the saved activations per tile up to there are the sum of
    ``out_bytes + region_bytes`` of layers ``0..i`` (plus the input tile)."""
    out, hw = [], cast(tuple[int, int], tuple(in_hw))
    for layer, cin, cout in layers:
        halo = max(halo_bytes(layer, batch, cin, hw, grid, dtype_bytes))
        region = 0
        if layer.kind not in ("pointwise", "batchnorm", "global_pool"):
            region = max(_region_len(layer, nh, hw[0]) * _region_len(layer, nw, hw[1])
                         for nh, nw in tile_needs(layer, hw, grid)) * batch * cin * dtype_bytes
        hw = output_hw(layer, hw)
        out_bytes = max(tile_activation_bytes(batch, cout, hw, grid, dtype_bytes)) \
            if layer.kind != "global_pool" else batch * cout * dtype_bytes
        reduce = bn_allreduce_bytes(cin, dtype_bytes) if layer.kind == "batchnorm" else 0
        out.append(LayerCost(out_hw=hw, out_bytes=out_bytes, region_bytes=region,
                             halo_bytes=halo, allreduce_bytes=reduce))
    return out
