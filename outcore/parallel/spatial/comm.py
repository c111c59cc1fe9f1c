"""Communication of spatial parallelism: halo exchange, group sums and the tile gather.

Each is an autograd Function, so the backward runs the transposed communication: the halo rows a
tile received are sent back as gradients and added where they came from (MPI4DL's spatial layers
do the same by hand, ``torchgems/spatial.py``; torch's DTensor convolution, ``_tp_conv.py``, does it
for one axis, stride 1, on the global ranks of a 1-D mesh). Point-to-point messages are posted all
at once with ``batch_isend_irecv`` (gloo on CPU, NCCL on GPUs) and then awaited, so neighbours
exchanging in both directions cannot deadlock.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from outcore.core.collectives import record
from outcore.core.comm import settled
from outcore.cost.spatial_geometry import TileGrid, intervals

__all__ = ["SpatialGroup", "exchange_axis", "fetch_region", "lean_region", "group_sum",
           "gather_tiles", "scatter_image"]

def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class SpatialGroup:
    """The ranks holding the tiles of one image: ``group`` (None = the default group) has
    ``grid.tiles`` members; group rank ``t`` holds tile ``t`` (row-major)."""

    grid: TileGrid
    group: object = None

    @property
    def tile(self) -> int:
        return 0 if self.grid.tiles == 1 else dist.get_rank(self.group)

    @property
    def coords(self) -> tuple[int, int]:
        return self.grid.coords(self.tile)

    def global_rank(self, tile: int) -> int:
        if self.group is None:
            return tile
        return dist.get_global_rank(self.group, tile)

    def axis_peers(self, axis: int) -> list[int]:
        """Global ranks of the tiles in my column (axis 0: rows) or my row (axis 1: columns)."""
        r, c = self.coords
        if axis == 0:
            return [self.global_rank(self.grid.tile_of(i, c)) for i in range(self.grid.rows)]
        return [self.global_rank(self.grid.tile_of(r, j)) for j in range(self.grid.cols)]


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return lo, max(lo, hi)


def _p2p(sends: list, recvs: list, group) -> None:
    """Post every (tensor, peer) send and receive, then wait for all."""
    ops = [dist.P2POp(dist.isend, t, p, group) for t, p in sends]
    ops += [dist.P2POp(dist.irecv, t, p, group) for t, p in recvs]
    if ops:
        with settled(*(t for t, _ in sends), *(t for t, _ in recvs)):
            for req in dist.batch_isend_irecv(ops):
                req.wait()


class _Exchange(torch.autograd.Function):
    """Along tensor dimension ``dim``: tile ``me`` owns ``own[me]`` and returns the rows
    ``need[me]`` (clipped to the image), taking the rows it does not own from their owners."""

    @staticmethod
    def forward(ctx, x, dim, me, own, need, peers, group):
        ctx.args = (dim, me, own, need, peers, group, x.shape)
        sends, recvs, pieces = [], [], []
        for j in range(len(own)):
            if j != me:
                lo, hi = _overlap(own[me], need[j])
                if hi > lo:
                    sends.append((x.narrow(dim, lo - own[me][0], hi - lo).contiguous(), peers[j]))
            lo, hi = _overlap(own[j], need[me])
            if hi <= lo:
                continue
            if j == me:
                pieces.append(x.narrow(dim, lo - own[me][0], hi - lo))
            else:
                shape = list(x.shape)
                shape[dim] = hi - lo
                buf = x.new_empty(shape)
                recvs.append((buf, peers[j]))
                pieces.append(buf)
        with record("sp halo", _nbytes(t for t, _ in recvs)):
            _p2p(sends, recvs, group)
        if not pieces:                                    # this tile reads nothing on this axis
            return x.narrow(dim, 0, 0).clone()
        return torch.cat(pieces, dim) if len(pieces) > 1 else pieces[0].clone()

    @staticmethod
    def backward(ctx, grad):
        dim, me, own, need, peers, group, shape = ctx.args
        grad = grad.contiguous()
        gx = grad.new_zeros(shape)
        sends, recvs, offset = [], [], 0
        for j in range(len(own)):
            lo, hi = _overlap(own[j], need[me])
            if hi <= lo:
                continue
            piece = grad.narrow(dim, offset, hi - lo)
            offset += hi - lo
            if j == me:
                gx.narrow(dim, lo - own[me][0], hi - lo).add_(piece)
            else:
                sends.append((piece.contiguous(), peers[j]))
        for j in range(len(own)):
            if j != me:
                lo, hi = _overlap(own[me], need[j])
                if hi > lo:
                    rshape = list(shape)
                    rshape[dim] = hi - lo
                    recvs.append((grad.new_empty(rshape), peers[j], lo))
        with record("sp halo", _nbytes(b for b, _, _ in recvs)):
            _p2p(sends, [(b, p) for b, p, _ in recvs], group)
        for buf, _, lo in recvs:
            gx.narrow(dim, lo - own[me][0], buf.shape[dim]).add_(buf)
        return gx, None, None, None, None, None, None


def exchange_axis(x: torch.Tensor, sg: SpatialGroup, axis: int, n: int,
                  needs: list[tuple[int, int]]) -> torch.Tensor:
    """Rows (axis 0) or columns (axis 1) ``needs[me]`` of an image axis of extent ``n`` (clipped
    to ``[0, n)``), given every tile's need along that axis (in the order of the axis's tiles)."""
    parts = sg.grid.rows if axis == 0 else sg.grid.cols
    me = sg.coords[axis]
    own = intervals(n, parts)
    clipped = [(max(lo, 0), max(min(hi, n), max(lo, 0))) for lo, hi in needs]
    if all(c == o for c, o in zip(clipped, own)):
        return x
    if all(o[0] <= c[0] and c[1] <= o[1] for c, o in zip(clipped, own)):
        # every tile reads inside its own rows (a strided 1x1 convolution skips the last):
        # nothing moves between tiles, and my region is a view of my tile
        lo, hi = clipped[me]
        return x.narrow(2 + axis, lo - own[me][0], hi - lo)
    if parts == 1:
        return x.narrow(2 + axis, clipped[0][0], clipped[0][1] - clipped[0][0])
    peers = sg.axis_peers(axis)
    return _Exchange.apply(x, 2 + axis, me, own, clipped, peers, sg.group)


def fetch_region(x: torch.Tensor, sg: SpatialGroup, hw: tuple[int, int],
                 needs_h: list[tuple[int, int]], needs_w: list[tuple[int, int]],
                 pad_value: float | None = 0.0) -> torch.Tensor:
    """My tile's input region ``needs_h[row] × needs_w[col]`` of an image of size ``hw``: halo
    rows, then halo columns of the row-extended tile (corners come with the second step), then
    the part outside the image filled with ``pad_value`` (None: leave it out)."""
    r, c = sg.coords
    x = exchange_axis(x, sg, 0, hw[0], needs_h)
    x = exchange_axis(x, sg, 1, hw[1], needs_w)
    if pad_value is None:
        return x
    (lo_h, hi_h), (lo_w, hi_w) = needs_h[r], needs_w[c]
    pads = (max(0, -lo_w), max(0, hi_w - hw[1]), max(0, -lo_h), max(0, hi_h - hw[0]))
    if any(pads):
        x = torch.nn.functional.pad(x, pads, value=pad_value)
    return x


def _interior(sg: SpatialGroup, hw, needs_h, needs_w):
    """Per axis (start in the region, start in my tile, length) of the rows a region shares
    with my tile."""
    r, c = sg.coords
    out = []
    for axis, (needs, parts) in enumerate(((needs_h, sg.grid.rows), (needs_w, sg.grid.cols))):
        o0, o1 = intervals(hw[axis], parts)[(r, c)[axis]]
        lo, hi = needs[(r, c)[axis]]
        a, b = max(o0, lo), min(o1, hi)
        out.append((a - lo, a - o0, b - a))
    return out


def lean_region(x: torch.Tensor, xr: torch.Tensor, sg: SpatialGroup, hw, needs_h, needs_w):
    """Saved-tensor hooks under which an operator that saves the region ``xr`` (a convolution,
    a max pool) keeps only its border strips (halo and padding) and my tile ``x``, which the
    layers before keep anyway: the region is rebuilt, bit for bit, when the backward needs it.
    Without them a tiled layer would keep one more activation than the serial one."""
    (rh, xh, lh), (rw, xw, lw) = _interior(sg, hw, needs_h, needs_w)
    if lh <= 0 or lw <= 0 or xr.data_ptr() == x.data_ptr():
        return contextlib.nullcontext()
    key = (xr.data_ptr(), tuple(xr.shape))

    def pack(t):
        if not isinstance(t, torch.Tensor) or (t.data_ptr(), tuple(t.shape)) != key:
            return t
        strips = (t[:, :, :rh].clone(), t[:, :, rh + lh:].clone(),
                  t[:, :, rh:rh + lh, :rw].clone(), t[:, :, rh:rh + lh, rw + lw:].clone())
        return ("region", x.detach(), strips, tuple(t.shape))

    def unpack(p):
        if not (isinstance(p, tuple) and p and p[0] == "region"):
            return p
        _, xs, (top, bottom, left, right), shape = p
        t = xs.new_empty(shape)
        t[:, :, :rh] = top
        t[:, :, rh + lh:] = bottom
        t[:, :, rh:rh + lh, :rw] = left
        t[:, :, rh:rh + lh, rw + lw:] = right
        t[:, :, rh:rh + lh, rw:rw + lw] = xs[:, :, xh:xh + lh, xw:xw + lw]
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


class _GroupSum(torch.autograd.Function):
    """All-reduce (sum) over the tile group; its gradient is the all-reduced gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        y = x.clone()
        with settled(y), record("sp allreduce", _nbytes([y])):
            dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):
        g = grad.clone()
        with settled(g), record("sp allreduce", _nbytes([g])):
            dist.all_reduce(g, group=ctx.group)
        return g, None


def group_sum(x: torch.Tensor, sg: SpatialGroup) -> torch.Tensor:
    """Sum of ``x`` over the tiles (differentiable)."""
    if sg.grid.tiles == 1:
        return x
    return _GroupSum.apply(x, sg.group)


class _Gather(torch.autograd.Function):
    """Tiles -> the whole image on every rank. Backward: every rank holds the same gradient of
    the whole image (the layers after the join run replicated), so a tile keeps its own slice."""

    @staticmethod
    def forward(ctx, x, sg, hw):
        grid = sg.grid
        rows, cols = intervals(hw[0], grid.rows), intervals(hw[1], grid.cols)
        mh, mw = max(b - a for a, b in rows), max(b - a for a, b in cols)
        r, c = sg.coords
        ctx.region = (rows[r], cols[c])
        padded = torch.nn.functional.pad(x, (0, mw - x.shape[3], 0, mh - x.shape[2])).contiguous()
        bufs = [torch.empty_like(padded) for _ in range(grid.tiles)]
        with settled(padded, *bufs), record("sp gather", _nbytes(bufs[1:])):
            dist.all_gather(bufs, padded, group=sg.group)
        out = x.new_empty(x.shape[:2] + tuple(hw))
        for t, buf in enumerate(bufs):
            (a, b), (p, q) = rows[t // grid.cols], cols[t % grid.cols]
            out[:, :, a:b, p:q] = buf[:, :, :b - a, :q - p]
        return out

    @staticmethod
    def backward(ctx, grad):
        (a, b), (p, q) = ctx.region
        return grad[:, :, a:b, p:q].contiguous(), None, None


class _GatherTo(torch.autograd.Function):
    """Tiles -> the whole image on tile ``dst`` only (the others get an empty tensor). Backward:
    ``dst`` scatters each tile's slice of the gradient back to it."""

    @staticmethod
    def forward(ctx, x, sg, hw, dst):
        grid = sg.grid
        rows, cols = intervals(hw[0], grid.rows), intervals(hw[1], grid.cols)
        mh, mw = max(b - a for a, b in rows), max(b - a for a, b in cols)
        regions = [(rows[t // grid.cols], cols[t % grid.cols]) for t in range(grid.tiles)]
        ctx.args = (sg, regions, (mh, mw), dst, x.shape)
        padded = torch.nn.functional.pad(x, (0, mw - x.shape[3], 0, mh - x.shape[2])).contiguous()
        root = sg.global_rank(dst)
        if sg.tile != dst:
            with settled(padded), record("sp gather", _nbytes([padded])):
                dist.gather(padded, None, dst=root, group=sg.group)
            return x.new_empty(0)
        bufs = [torch.empty_like(padded) for _ in range(grid.tiles)]
        with settled(padded, *bufs), record("sp gather", _nbytes(bufs[1:])):
            dist.gather(padded, bufs, dst=root, group=sg.group)
        out = x.new_empty(x.shape[:2] + tuple(hw))
        for buf, ((a, b), (p, q)) in zip(bufs, regions):
            out[:, :, a:b, p:q] = buf[:, :, :b - a, :q - p]
        return out

    @staticmethod
    def backward(ctx, grad):
        # each tile's slice of the gradient goes to it on its own, one at a time: a scatter
        # would copy every slice first and its library flatten them once more (two whole
        # gradients beside the one held)
        sg, regions, _, dst, shape = ctx.args
        if sg.tile != dst:
            recv = grad.new_empty(shape)
            with record("sp scatter", _nbytes([recv])):
                _p2p([], [(recv, sg.global_rank(dst))], sg.group)
            return recv, None, None, None
        mine = None
        for t, ((a, b), (p, q)) in enumerate(regions):
            part = grad[:, :, a:b, p:q].contiguous()
            if t == dst:
                mine = part
            else:
                with record("sp scatter", _nbytes([part])):
                    _p2p([(part, sg.global_rank(t))], [], sg.group)
            del part
        return mine, None, None, None


def gather_tiles(x: torch.Tensor, sg: SpatialGroup, hw: tuple[int, int],
                 dst: int | None = None) -> torch.Tensor:
    """The whole ``(N, C, *hw)`` tensor from its tiles (the join point), on every rank of the
    group (``dst=None``: what follows runs replicated) or on tile ``dst`` only (the others get an
    empty tensor, on which they call ``torch.autograd.backward(out, torch.empty(0))`` to receive
    their gradient when ``dst`` runs its backward)."""
    if sg.grid.tiles == 1:
        return x
    if dst is not None:
        return _GatherTo.apply(x, sg, tuple(hw), dst)
    return _Gather.apply(x, sg, tuple(hw))


def scatter_image(x: torch.Tensor, sg: SpatialGroup) -> torch.Tensor:
    """My tile of a whole image every rank holds (tests; real jobs read only their tile)."""
    r0, r1, c0, c1 = sg.grid.region(sg.tile, x.shape[2], x.shape[3])
    return x[:, :, r0:r1, c0:c1]
