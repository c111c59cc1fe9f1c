"""Spatial (tiled) versions of the image layers: each computes exactly its tile of the serial
layer's output.

A spatial layer reads its tile's input *region* (own rows and columns, the halo taken from the
neighbours by :func:`outcore.parallel.spatial.comm.fetch_region`, the image's padding added locally)
and runs the serial operator with no padding on it, so each output element sees the same inputs, in
the same order, as in the serial layer. The global size of the layer's input is recorded when the
model is converted (:mod:`outcore.parallel.spatial.convert`); at run time a layer checks its tile
against it.

Classes are subclasses of the torch modules; :func:`make_spatial` converts a module in place
(same parameter objects, same state-dict names).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from outcore.core.collectives import record
from outcore.cost.spatial_geometry import (
    bilinear_need,
    conv_need,
    conv_out_size,
    conv_transpose_need,
    conv_transpose_out_size,
    intervals,
    pool_divisors,
    upsample_need,
)
from outcore.errors import UsageError
from outcore.parallel.spatial.comm import SpatialGroup, fetch_region, lean_region

__all__ = ["make_spatial", "geometry_of", "SPATIAL_TYPES", "POINTWISE_TYPES", "global_pool_sum"]


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


class _SpatialMixin:
    """Shared by the spatial layers: the tile group and the global input sizes seen."""

    _sp: SpatialGroup
    _sp_hw: tuple

    def _global_hw(self, x: torch.Tensor) -> tuple[int, int]:
        """The global (H, W) of ``x``, my tile of one of the recorded input sizes."""
        sg = self._sp
        for hw in self._sp_hw:
            r0, r1, c0, c1 = sg.grid.region(sg.tile, *hw)
            if (r1 - r0, c1 - c0) == tuple(x.shape[-2:]):
                return hw
        raise UsageError(f"spatial {type(self).__name__}: tile of {tuple(x.shape[-2:])} on tile "
                         f"{sg.tile} does not match the image sizes {list(self._sp_hw)} the model "
                         f"was converted for: call spatialize() again with this image size")

    def _plans(self, hw, out_fn, need_fn):
        """Per axis: (output size, every tile's needed input interval)."""
        parts = (self._sp.grid.rows, self._sp.grid.cols)
        outs, needs = [], []
        for axis in (0, 1):
            n_out = out_fn(axis, hw[axis])
            outs.append(n_out)
            needs.append([need_fn(axis, o0, o1, hw[axis]) for o0, o1 in intervals(n_out,
                                                                                  parts[axis])])
        return outs, needs


def _conv_pads(module, axis: int) -> tuple[int, int]:
    """(before, after) zero padding along ``axis``, also for padding='same'/'valid'."""
    if isinstance(module.padding, str):
        if module.padding == "valid":
            return 0, 0
        total = module.dilation[axis] * (module.kernel_size[axis] - 1)
        return total // 2, total - total // 2
    return module.padding[axis], module.padding[axis]


def _on_tile(x: torch.Tensor, xr: torch.Tensor, k, s, d) -> torch.Tensor:
    """``x`` itself where the region ``xr`` is ``x`` cut short at its ends by rows or columns
    that give no output of a window ``k``, stride ``s``, dilation ``d`` (a strided 1x1
    convolution reads every other row): the operator then neither copies the region nor
    rebuilds it in the backward, and the output is the same."""
    if xr is x or xr.data_ptr() != x.data_ptr() or xr.shape[:2] != x.shape[:2]:
        return xr
    for a in (0, 1):
        n, m, reach = x.shape[2 + a], xr.shape[2 + a], d[a] * (k[a] - 1) + 1
        if m > n or (n - reach) // s[a] != (m - reach) // s[a]:
            return xr
    return x


class SpatialConv2d(_SpatialMixin, nn.Conv2d):
    """Conv2d on a tile: any kernel, stride, padding (zeros), dilation and groups."""

    def forward(self, x):
        hw = self._global_hw(x)
        k, s, d = self.kernel_size, self.stride, self.dilation

        def out_fn(a, n):
            lo, hi = _conv_pads(self, a)
            return (n + lo + hi - d[a] * (k[a] - 1) - 1) // s[a] + 1

        def need_fn(a, o0, o1, n):
            return conv_need(o0, o1, k[a], s[a], _conv_pads(self, a)[0], d[a])

        _, (nh, nw) = self._plans(hw, out_fn, need_fn)
        xr = _on_tile(x, fetch_region(x, self._sp, hw, nh, nw, 0.0), k, s, d)
        with lean_region(x, xr, self._sp, hw, nh, nw):
            return F.conv2d(xr, self.weight, self.bias, s, 0, d, self.groups)


class SpatialMaxPool2d(_SpatialMixin, nn.MaxPool2d):
    """MaxPool2d on a tile (padding is -inf, ceil_mode's extra window included)."""

    def forward(self, x):
        hw = self._global_hw(x)
        k, s = _pair(self.kernel_size), _pair(self.stride or self.kernel_size)
        p, d = _pair(self.padding), _pair(self.dilation)
        _, (nh, nw) = self._plans(
            hw, lambda a, n: conv_out_size(n, k[a], s[a], p[a], d[a], self.ceil_mode),
            lambda a, o0, o1, n: conv_need(o0, o1, k[a], s[a], p[a], d[a]))
        xr = fetch_region(x, self._sp, hw, nh, nw, -math.inf)
        with lean_region(x, xr, self._sp, hw, nh, nw):
            return F.max_pool2d(xr, k, s, 0, d, ceil_mode=False)


class SpatialAvgPool2d(_SpatialMixin, nn.AvgPool2d):
    """AvgPool2d on a tile: window sums, divided by the serial layer's divisor per position."""

    def forward(self, x):
        hw = self._global_hw(x)
        k, s = _pair(self.kernel_size), _pair(self.stride or self.kernel_size)
        p = _pair(self.padding)
        outs, (nh, nw) = self._plans(
            hw, lambda a, n: conv_out_size(n, k[a], s[a], p[a], 1, self.ceil_mode),
            lambda a, o0, o1, n: conv_need(o0, o1, k[a], s[a], p[a], 1))
        xr = fetch_region(x, self._sp, hw, nh, nw, 0.0)
        sums = F.avg_pool2d(xr, k, s, 0, ceil_mode=False, count_include_pad=True,
                            divisor_override=1)
        if self.divisor_override:
            return sums / self.divisor_override
        r, c = self._sp.coords
        divs = []
        for a, (o0, o1) in enumerate((intervals(outs[0], self._sp.grid.rows)[r],
                                      intervals(outs[1], self._sp.grid.cols)[c])):
            divs.append(torch.tensor(pool_divisors(o0, o1, hw[a], k[a], s[a], p[a],
                                                   self.count_include_pad), dtype=x.dtype))
        return sums / (divs[0][:, None] * divs[1][None, :]).to(x.device)


class SpatialConvTranspose2d(_SpatialMixin, nn.ConvTranspose2d):
    """ConvTranspose2d on a tile: the input rows that write into my output rows, transposed
    convolution without padding, then my rows cut out (bias added last, so rows that no input
    reaches still get it)."""

    def forward(self, x, output_size=None):
        if output_size is not None:
            raise UsageError("spatial ConvTranspose2d: output_size is not supported; set "
                             "output_padding on the module instead")
        hw = self._global_hw(x)
        k, s, p = self.kernel_size, self.stride, self.padding
        d, op = self.dilation, self.output_padding
        outs, (nh, nw) = self._plans(
            hw, lambda a, n: conv_transpose_out_size(n, k[a], s[a], p[a], d[a], op[a]),
            lambda a, o0, o1, n: conv_transpose_need(o0, o1, n, k[a], s[a], p[a], d[a]))
        xr = fetch_region(x, self._sp, hw, nh, nw, None)
        r, c = self._sp.coords
        mine = (intervals(outs[0], self._sp.grid.rows)[r],
                intervals(outs[1], self._sp.grid.cols)[c])
        lo = (nh[r][0], nw[c][0])
        if xr.shape[2] == 0 or xr.shape[3] == 0:
            y = x.new_zeros(x.shape[0], self.out_channels, mine[0][1] - mine[0][0],
                            mine[1][1] - mine[1][0])
        else:
            y = F.conv_transpose2d(xr, self.weight, None, s, 0, 0, self.groups, d)
            pads = []
            for a in (1, 0):                              # F.pad order: last dim first
                start = mine[a][0] - (lo[a] * s[a] - p[a])    # where my rows begin in y
                end = start + mine[a][1] - mine[a][0]
                pads += [-start, end - y.shape[2 + a]]
            y = F.pad(y, pads)
        if self.bias is not None:
            y = y + self.bias[None, :, None, None]
        return y


class SpatialUpsample(_SpatialMixin, nn.Upsample):
    """Upsample by an integer factor on a tile: nearest, or bilinear without align_corners (the
    rows its source coordinates reach, computed on the region and cut to my rows)."""

    def _factors(self, hw):
        if self.scale_factor is not None:
            f = _pair(self.scale_factor) if not isinstance(self.scale_factor, float) \
                else (self.scale_factor, self.scale_factor)
        else:
            size = _pair(self.size)
            f = tuple(size[a] / hw[a] for a in (0, 1))
        if any(float(v) != int(v) or v < 1 for v in f):
            raise UsageError(f"spatial Upsample: only integer factors are supported, got {f}")
        return tuple(int(v) for v in f)

    def forward(self, x):
        if self.mode not in ("nearest", "bilinear") or self.align_corners:
            raise UsageError(f"spatial Upsample: mode {self.mode!r} (align_corners="
                             f"{self.align_corners}) is not supported; use nearest or bilinear "
                             f"with align_corners=False")
        hw = self._global_hw(x)
        f = self._factors(hw)

        def need_fn(a, o0, o1, n):
            if self.mode == "bilinear":
                return bilinear_need(o0, o1, n, f[a])
            return upsample_need(o0, o1, f[a])

        outs, (nh, nw) = self._plans(hw, lambda a, n: n * f[a], need_fn)
        xr = fetch_region(x, self._sp, hw, nh, nw, None)
        y = F.interpolate(xr, scale_factor=f, mode=self.mode,
                          align_corners=False if self.mode == "bilinear" else None)
        r, c = self._sp.coords
        (a0, a1), (b0, b1) = (intervals(outs[0], self._sp.grid.rows)[r],
                              intervals(outs[1], self._sp.grid.cols)[c])
        h0, w0 = a0 - nh[r][0] * f[0], b0 - nw[c][0] * f[1]
        return y[:, :, h0:h0 + a1 - a0, w0:w0 + b1 - b0]


class _TileBatchNorm(torch.autograd.Function):
    """Batch norm over the whole image from tiles: the sums of ``x`` and of ``(x - mean)²`` and,
    in the backward, of ``dy`` and ``dy·(x - mean)`` are all-reduced over the group (the
    SyncBatchNorm scheme, whose torch kernels are CUDA-only, here in plain tensor ops). Saves
    only ``x``, like the serial layer. Weight and bias gradients are this tile's part (summed
    over the tiles by ``SpatialModel.reduce_gradients``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, n, eps, group):
        s1 = x.sum((0, 2, 3))
        if group is not False:
            with record("sp allreduce", s1.numel() * s1.element_size()):
                torch.distributed.all_reduce(s1, group=group)
        mean = s1 / n
        xc = x - mean[None, :, None, None]
        s2 = (xc * xc).sum((0, 2, 3))
        if group is not False:
            with record("sp allreduce", s2.numel() * s2.element_size()):
                torch.distributed.all_reduce(s2, group=group)
        var = s2 / n
        invstd = torch.rsqrt(var + eps)
        y = xc.mul_(invstd[None, :, None, None])
        if weight is not None:  # float32 affine on a bfloat16 tile (bf16-mixed): in its dtype,
            # not through a float32 copy of the tile
            y = y.mul_(weight.to(y.dtype)[None, :, None, None]).add_(
                bias.to(y.dtype)[None, :, None, None])
        ctx.save_for_backward(x, mean, invstd, weight)
        ctx.n, ctx.group = n, group
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, gy, _gmean, _gvar):
        x, mean, invstd, weight = ctx.saved_tensors
        xmu = x - mean[None, :, None, None]
        local = torch.stack([gy.sum((0, 2, 3)), (gy * xmu).sum((0, 2, 3))])
        total = local.clone()
        if ctx.group is not False:
            with record("sp allreduce", total.numel() * total.element_size()):
                torch.distributed.all_reduce(total, group=ctx.group)
        sum_dy, sum_dy_xmu = total[0] / ctx.n, total[1] / ctx.n
        scale = invstd if weight is None else invstd * weight
        # in place: the working set is gy, xmu and gx (three tiles, what the memory model
        # counts), not a fourth for gy - sum_dy
        xmu.mul_((invstd * invstd * sum_dy_xmu)[None, :, None, None])
        gx = gy - sum_dy[None, :, None, None]
        gx.sub_(xmu)
        del xmu
        gx = gx.mul_(scale.to(gx.dtype)[None, :, None, None])
        gw = local[1] * invstd if weight is not None and ctx.needs_input_grad[1] else None
        gb = local[0] if ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None


class SpatialBatchNorm2d(_SpatialMixin, nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are summed over the tile group: the serial
    batch statistics, and running statistics equal to the serial layer's."""

    def forward(self, x):
        if not self.training and self.track_running_stats:
            return super().forward(x)
        hw = self._global_hw(x)
        n = x.shape[0] * hw[0] * hw[1]
        group = self._sp.group if self._sp.grid.tiles > 1 else False
        y, mean, var = _TileBatchNorm.apply(x, self.weight, self.bias, n, self.eps, group)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = self.momentum if self.momentum is not None \
                    else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - m).add_(mean, alpha=m)
                self.running_var.mul_(1 - m).add_(var * (n / max(n - 1, 1)), alpha=m)
        return y


def global_pool_sum(x: torch.Tensor, sg: SpatialGroup) -> torch.Tensor:
    """Sum over the whole image of every channel, the same on every tile; its gradient is the
    local one (the layers after it run replicated)."""
    return _ReplicatedSum.apply(x.sum((2, 3), keepdim=True), sg.group) if sg.grid.tiles > 1 \
        else x.sum((2, 3), keepdim=True)


class _ReplicatedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        y = x.clone()
        with record("sp allreduce", y.numel() * y.element_size()):
            torch.distributed.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class SpatialAdaptiveAvgPool2d(_SpatialMixin, nn.AdaptiveAvgPool2d):
    """Global average pooling (output 1×1) over the tiles: the result is on every tile."""

    def forward(self, x):
        if _pair(self.output_size) != (1, 1):
            raise UsageError(f"spatial AdaptiveAvgPool2d: only output size 1 is supported, got "
                             f"{self.output_size}; join the tiles before this layer")
        hw = self._global_hw(x)
        return global_pool_sum(x, self._sp) / (hw[0] * hw[1])


SPATIAL_TYPES = {nn.Conv2d: SpatialConv2d, nn.MaxPool2d: SpatialMaxPool2d,
                 nn.AvgPool2d: SpatialAvgPool2d, nn.ConvTranspose2d: SpatialConvTranspose2d,
                 nn.Upsample: SpatialUpsample, nn.BatchNorm2d: SpatialBatchNorm2d,
                 nn.AdaptiveAvgPool2d: SpatialAdaptiveAvgPool2d}

# element-wise layers: a tile is computed alone, no exchange (PReLU's weight is per channel)
POINTWISE_TYPES = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Sigmoid,
                   nn.Tanh, nn.Hardswish, nn.Hardsigmoid, nn.Mish, nn.PReLU, nn.Identity,
                   nn.Softplus)


def make_spatial(module: nn.Module, sg: SpatialGroup, input_hw) -> nn.Module:
    """Turn ``module`` (exactly one of :data:`SPATIAL_TYPES`) into its spatial class in place:
    same parameters and buffers, ``input_hw`` the global (H, W) inputs it was seen with."""
    cls = SPATIAL_TYPES.get(type(module))
    if cls is None:
        raise UsageError(f"{type(module).__name__} has no spatial version; supported: "
                         f"{sorted(t.__name__ for t in SPATIAL_TYPES)}")
    if isinstance(module, nn.Conv2d) and module.padding_mode != "zeros":
        raise UsageError(f"spatial Conv2d: padding_mode {module.padding_mode!r} is not "
                         f"supported (only zeros)")
    if isinstance(module, nn.MaxPool2d) and module.return_indices:
        raise UsageError("spatial MaxPool2d: return_indices is not supported")
    module.__class__ = cls
    module._sp = sg
    module._sp_hw = tuple(tuple(hw) for hw in input_hw)
    return module


def geometry_of(module: nn.Module):
    """The pure :class:`outcore.cost.spatial.LayerGeometry` of a torch layer (for capture and the
    planner's halo / memory costs); None for layers with no spatial version."""
    from outcore.cost.spatial import LayerGeometry
    if isinstance(module, nn.Conv2d):
        pads = (_conv_pads(module, 0)[0], _conv_pads(module, 1)[0])
        return LayerGeometry(kind="conv", kernel=module.kernel_size, stride=module.stride,
                             padding=pads, dilation=module.dilation,
                             same=module.padding == "same")
    if isinstance(module, (nn.MaxPool2d, nn.AvgPool2d)):
        k = _pair(module.kernel_size)
        return LayerGeometry(kind="conv" if isinstance(module, nn.MaxPool2d) else "pool",
                             kernel=k, stride=_pair(module.stride or k),
                             padding=_pair(module.padding),
                             dilation=_pair(getattr(module, "dilation", 1)),
                             ceil_mode=module.ceil_mode)
    if isinstance(module, nn.ConvTranspose2d):
        return LayerGeometry(kind="conv_transpose", kernel=module.kernel_size,
                             stride=module.stride, padding=module.padding,
                             dilation=module.dilation, output_padding=module.output_padding)
    if isinstance(module, nn.Upsample) and module.scale_factor is not None:
        f = module.scale_factor
        f = (int(f), int(f)) if isinstance(f, (int, float)) else tuple(int(v) for v in f)
        return LayerGeometry(kind="upsample", factor=f, bilinear=module.mode == "bilinear")
    if isinstance(module, nn.BatchNorm2d):
        return LayerGeometry(kind="batchnorm")
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return LayerGeometry(kind="global_pool")
    if isinstance(module, POINTWISE_TYPES):
        return LayerGeometry(kind="pointwise")
    return None
