"""Tile geometry for spatial parallelism (MPI4DL / GEMS spatial parallelism); pure, no torch.

An image (or an activation) of height H and width W is split over a grid of ``rows × cols`` tiles:
rows split H, cols split W, each axis independently and as evenly as possible (the first
``H mod rows`` tiles of an axis are one row taller, like ``numpy.array_split``). Every tensor of a
given global size is split the same way, whatever layer produced it, so element-wise ops, residual
adds and channel concatenation of two tiled tensors need no communication.

For a sliding-window layer (convolution, pooling, transposed convolution, nearest upsampling) the
tile that owns output rows ``[o0, o1)`` needs input rows ``[lo, hi)`` (``need_*`` below), which may
start before or end after the rows it owns: the part inside the image comes from the neighbours
(the *halo*, MPI4DL's ``halo_len``, here per side and per layer, exact for any kernel, stride,
padding and dilation), the part outside the image is the layer's own padding. One axis at a time:
rows first, then columns of the row-extended tile, so corner halos need no diagonal messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from outcore.errors import UsageError

__all__ = ["TileGrid", "split_sizes", "intervals", "conv_out_size", "conv_need",
           "conv_transpose_out_size", "conv_transpose_need", "upsample_need", "bilinear_need",
           "halo_sides", "pool_divisors"]


def split_sizes(n: int, parts: int) -> list[int]:
    """Extents of ``parts`` tiles over ``n`` rows: ``n // parts``, the first ``n % parts`` one
    more."""
    if parts < 1:
        raise UsageError(f"a tile grid needs at least one tile per axis, got {parts}")
    if n < parts:
        raise UsageError(f"cannot split {n} rows/cols into {parts} tiles (a tile would be "
                         f"empty): join the tiles before this layer, or use fewer tiles")
    q, r = divmod(n, parts)
    return [q + 1 if i < r else q for i in range(parts)]


def intervals(n: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of every tile over ``n`` rows (see :func:`split_sizes`)."""
    out, start = [], 0
    for size in split_sizes(n, parts):
        out.append((start, start + size))
        start += size
    return out


@dataclass(frozen=True, kw_only=True)
class TileGrid:
    """``rows × cols`` tiles; tile ``t`` (row-major) is rank ``t`` of the spatial group."""

    rows: int
    cols: int

    def __post_init__(self):
        if self.rows < 1 or self.cols < 1:
            raise UsageError(f"tile grid {self.rows}x{self.cols}: both sides must be >= 1")

    @classmethod
    def parse(cls, text: str) -> "TileGrid":
        """``"2x4"`` (rows × cols) or ``"4"`` (4 tiles over the height)."""
        try:
            parts = [int(p) for p in str(text).lower().split("x")]
        except ValueError:
            parts = []
        if len(parts) == 1:
            return cls(rows=parts[0], cols=1)
        if len(parts) != 2:
            raise UsageError(f"tile grid {text!r}: write ROWSxCOLS, e.g. 2x2 or 1x4")
        return cls(rows=parts[0], cols=parts[1])

    @property
    def tiles(self) -> int:
        return self.rows * self.cols

    def coords(self, tile: int) -> tuple[int, int]:
        """(row, col) of tile ``tile``."""
        if not 0 <= tile < self.tiles:
            raise UsageError(f"tile {tile} is not in a {self.rows}x{self.cols} grid")
        return divmod(tile, self.cols)

    def tile_of(self, row: int, col: int) -> int:
        return row * self.cols + col

    def region(self, tile: int, height: int, width: int) -> tuple[int, int, int, int]:
        """``(row0, row1, col0, col1)`` of tile ``tile`` in an image of ``height × width``."""
        r, c = self.coords(tile)
        r0, r1 = intervals(height, self.rows)[r]
        c0, c1 = intervals(width, self.cols)[c]
        return r0, r1, c0, c1


def conv_out_size(n: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1,
                  ceil_mode: bool = False) -> int:
    """Output extent of a convolution / pooling window along one axis (PyTorch's formula,
    including ``ceil_mode``'s rule that the last window must start inside the padded input)."""
    span = dilation * (kernel - 1) + 1
    num = n + 2 * padding - span
    if num < 0:
        raise UsageError(f"window of {span} does not fit {n} rows with padding {padding}")
    out = (-(-num // stride) if ceil_mode else num // stride) + 1
    if ceil_mode and (out - 1) * stride >= n + padding:
        out -= 1
    return out


def conv_need(o0: int, o1: int, kernel: int, stride: int = 1, padding: int = 0,
              dilation: int = 1) -> tuple[int, int]:
    """Input rows ``[lo, hi)`` (global, padding coordinates may be < 0 or >= n) that output rows
    ``[o0, o1)`` of a convolution or pooling window read."""
    return o0 * stride - padding, (o1 - 1) * stride - padding + dilation * (kernel - 1) + 1


def conv_transpose_out_size(n: int, kernel: int, stride: int = 1, padding: int = 0,
                            dilation: int = 1, output_padding: int = 0) -> int:
    """Output extent of a transposed convolution along one axis (PyTorch's formula)."""
    return (n - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1


def conv_transpose_need(o0: int, o1: int, n: int, kernel: int, stride: int = 1,
                        padding: int = 0, dilation: int = 1) -> tuple[int, int]:
    """Input rows ``[lo, hi)`` (clipped to ``[0, n)``) that contribute to output rows ``[o0, o1)``
    of a transposed convolution: input ``i`` writes output ``i*stride - padding + k*dilation``."""
    lo = -(-(o0 + padding - dilation * (kernel - 1)) // stride)
    hi = (o1 - 1 + padding) // stride + 1
    lo, hi = max(lo, 0), min(hi, n)
    return lo, max(hi, lo)


def upsample_need(o0: int, o1: int, factor: int) -> tuple[int, int]:
    """Input rows that nearest upsampling by an integer ``factor`` copies into ``[o0, o1)``."""
    return o0 // factor, (o1 - 1) // factor + 1


def bilinear_need(o0: int, o1: int, n: int, factor: int) -> tuple[int, int]:
    """Input rows that bilinear upsampling (align_corners=False) by an integer ``factor`` reads
    for output rows ``[o0, o1)``: output ``o`` reads ``floor(src)`` and the row after, where
    ``src = max((o + 0.5) / factor - 0.5, 0)``. For factors other than powers of two PyTorch's
    ``1 / factor`` is rounded, so one more row is taken on each side."""
    lo = max((2 * o0 + 1 - factor) // (2 * factor), 0)
    hi = max((2 * (o1 - 1) + 1 - factor) // (2 * factor), 0) + 2
    if factor & (factor - 1):
        lo, hi = lo - 1, hi + 1
    return max(lo, 0), min(hi, n)


def halo_sides(own: tuple[int, int], need: tuple[int, int], n: int) -> tuple[int, int]:
    """Rows a tile owning ``own`` must receive from before and after it to cover ``need``
    (the part of ``need`` outside ``[0, n)`` is padding, not halo). Negative values never occur;
    rows of ``own`` outside ``need`` are simply not read."""
    lo, hi = max(need[0], 0), min(need[1], n)
    return max(0, min(own[0], hi) - lo), max(0, hi - max(own[1], lo))


def pool_divisors(o0: int, o1: int, n: int, kernel: int, stride: int, padding: int,
                  count_include_pad: bool) -> list[int]:
    """Per output row in ``[o0, o1)``: how many of its window's rows average pooling counts along
    this axis (PyTorch: padding counts when ``count_include_pad``, never beyond ``n + padding``)."""
    out = []
    for o in range(o0, o1):
        start = o * stride - padding
        stop = min(start + kernel, n + padding)
        if not count_include_pad:
            start, stop = max(start, 0), min(stop, n)
        out.append(stop - start)
    return out
