"""Worker and reference for the spatial tests: the same seed, batches and optimizer steps, run
by plain PyTorch on whole images or by :func:`outcore.parallel.spatial.spatialize` on tiles."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from tests.parallel.spatial.nets import ResNetStyle, UNet


def build(name: str, dtype):
    torch.manual_seed(0)
    model = {"resnet": ResNetStyle, "unet": UNet,
             "unet-nearest": lambda: UNet(up_mode="nearest")}[name]()
    return model.to(dtype)


def batch(name: str, step: int, shape, dtype):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if name == "resnet":
        y = torch.randint(0, 5, (shape[0],), generator=g)
    else:
        y = torch.randint(0, 3, (shape[0],) + tuple(shape[2:]), generator=g)
    return x, y


def train(model, name, shape, steps, dtype, before_step=None):
    """Losses, the gradients after the first backward, and the final state."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, grads = [], None
    for step in range(steps):
        x, y = batch(name, step, shape, dtype)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if before_step is not None:
            before_step()
        if grads is None:
            grads = {k: p.grad.detach().clone() for k, p in named(model).items()}
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    state = {k: v.detach().clone() for k, v in named(model).items()}
    bufs = {k: v.detach().clone() for k, v in
            getattr(model, "module", model).named_buffers()}
    return losses, grads, state, bufs


def named(model):
    return dict(getattr(model, "module", model).named_parameters())


def reference(name, shape, steps, dtype=torch.float32):
    return train(build(name, dtype), name, shape, steps, dtype)


def spatial_worker(ctx, name, grid, shape, steps, join, dtype=torch.float32):
    from outcore.parallel.spatial import spatialize
    model = build(name, dtype)
    sm = spatialize(copy.deepcopy(model), grid, example=torch.empty(shape, dtype=dtype),
                    join=join)
    losses, grads, state, bufs = train(sm, name, shape, steps, dtype, sm.reduce_gradients)
    return {"rank": ctx.rank, "losses": losses, "grads": grads, "state": state, "bufs": bufs}


# one layer at a time, odd image size, borders crossed: (name, constructor source)
LAYERS = [
    "nn.Conv2d(4, 4, 3, 1, 1)",
    "nn.Conv2d(4, 4, 5, stride=2, padding=1)",
    "nn.Conv2d(4, 4, 3, stride=3)",
    "nn.Conv2d(4, 4, 3, padding=2, dilation=2)",
    "nn.Conv2d(4, 4, 5, padding=6, dilation=3)",
    "nn.Conv2d(4, 6, 3, padding=1, groups=2)",
    "nn.Conv2d(4, 4, (3, 1), stride=(2, 1), padding=(1, 0))",
    "nn.Conv2d(4, 4, 4, padding='same')",
    "nn.Conv2d(4, 4, 1, stride=2)",
    "nn.MaxPool2d(3, 2, 1)",
    "nn.MaxPool2d(2, ceil_mode=True)",
    "nn.MaxPool2d(3, stride=2, padding=1, dilation=2)",
    "nn.AvgPool2d(3, 2, 1)",
    "nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)",
    "nn.AvgPool2d(2, ceil_mode=True)",
    "nn.AvgPool2d(3, 2, 1, divisor_override=4)",
    "nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1)",
    "nn.ConvTranspose2d(4, 4, 2, stride=2)",
    "nn.ConvTranspose2d(4, 4, 3, padding=1)",
    "nn.ConvTranspose2d(4, 4, 1, stride=2)",
    "nn.ConvTranspose2d(4, 2, 3, stride=2, dilation=2, groups=2)",
    "nn.Upsample(scale_factor=2)",
    "nn.Upsample(scale_factor=3, mode='nearest')",
    "nn.Upsample(scale_factor=2, mode='bilinear')",
    "nn.Upsample(scale_factor=3, mode='bilinear')",
    "nn.Upsample(size=(26, 22))",
    "nn.BatchNorm2d(4)",
    "nn.BatchNorm2d(4, momentum=None)",
    "nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.PReLU(4), nn.AdaptiveAvgPool2d(1))",
]


def layers_worker(ctx, grid, hw=(13, 11)):
    """For every layer: the spatial output, input gradient and parameter gradients (summed over
    tiles) against the serial layer's, as max errors relative to the largest serial entry."""
    import torch.distributed as dist
    from torch import nn  # noqa: F401 (used by eval)

    from outcore.parallel.spatial import spatialize
    errors = {}
    for src in LAYERS:
        torch.manual_seed(1)
        serial = eval(src).double()
        x = torch.randn((2, 4) + tuple(hw), dtype=torch.float64, requires_grad=True)
        sm = spatialize(copy.deepcopy(serial), grid, example=x.detach())
        y = serial(x)
        w = torch.randn(y.shape, dtype=torch.float64)
        (y * w).sum().backward()
        xs = x.detach().clone().requires_grad_(True)
        ys = sm(xs)
        (ys * w).sum().backward()
        sm.reduce_gradients()
        gx = xs.grad.clone()
        dist.all_reduce(gx)
        pairs = [("out", ys, y), ("dx", gx, x.grad)]
        pairs += [(k, p.grad, dict(serial.named_parameters())[k].grad)
                  for k, p in sm.module.named_parameters()]
        pairs += [(k, b, dict(serial.named_buffers())[k]) for k, b in sm.module.named_buffers()]
        errors[src] = {k: ((a.double() - b.double()).abs().max().item() /
                           max(b.double().abs().max().item(), 1e-12)) for k, a, b in pairs}
    return errors


def suite_worker(ctx, grid, jobs, shape, steps):
    """Several checks in one process group (spawning workers is the slow part): ``jobs`` holds
    ``("layers",)`` and ``("train", model name, join)`` entries."""
    out = {}
    for job in jobs:
        if job[0] == "layers":
            out[job] = layers_worker(ctx, grid)
        else:
            out[job] = spatial_worker(ctx, job[1], grid, shape, steps, job[2])
    return out


def gather_worker(ctx, grid, dst):
    """gather_tiles to every rank and to one rank: values and the input gradient."""
    import torch.distributed as dist

    from outcore.parallel.spatial import SpatialGroup, TileGrid, gather_tiles, scatter_image
    sg = SpatialGroup(TileGrid.parse(grid))
    x = torch.randn(2, 3, 13, 11, generator=torch.Generator().manual_seed(5),
                    dtype=torch.float64)
    w = torch.randn(2, 3, 13, 11, generator=torch.Generator().manual_seed(6),
                    dtype=torch.float64)
    out = {}
    for mode in (None, dst):
        tile = scatter_image(x, sg).clone().requires_grad_(True)
        full = gather_tiles(tile, sg, (13, 11), dst=mode)
        if mode is None or sg.tile == mode:
            out[(mode, "value")] = (full - x).abs().max().item()
            (full * w).sum().backward()
        else:
            out[(mode, "value")] = float(full.numel())
            torch.autograd.backward(full, torch.empty(0, dtype=full.dtype))
        g = torch.zeros_like(x)
        r0, r1, c0, c1 = sg.grid.region(sg.tile, 13, 11)
        g[:, :, r0:r1, c0:c1] = tile.grad
        dist.all_reduce(g)
        out[(mode, "grad")] = (g - w).abs().max().item()
    return out


def subgroup_worker(ctx, name, grid, shape, steps, join):
    """Two tile groups of 2 in a world of 4, interleaved ({0, 2} and {1, 3}: group rank and
    global rank differ), as when spatial parallelism sits inside a larger mesh."""
    import torch.distributed as dist

    from outcore.parallel.spatial import spatialize
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group = groups[ctx.rank % 2]
    model = build(name, torch.float32)
    sm = spatialize(model, grid, example=torch.empty(shape), group=group, join=join)
    losses, grads, state, bufs = train(sm, name, shape, steps, torch.float32,
                                       sm.reduce_gradients)
    return {"rank": ctx.rank, "tile": sm.sg.tile, "losses": losses, "grads": grads,
            "state": state, "bufs": bufs}
