"""Worker and reference for the spatial tests: the same seed, batches and optimizer steps, run
by plain PyTorch on whole images or by :func:`outcore.spatial.spatialize` on tiles."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from tests.spatial.nets import ResNetStyle, UNet


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
    from outcore.spatial import spatialize
    model = build(name, dtype)
    sm = spatialize(copy.deepcopy(model), grid, example=torch.empty(shape, dtype=dtype),
                    join=join)
    losses, grads, state, bufs = train(sm, name, shape, steps, dtype, sm.reduce_gradients)
    return {"rank": ctx.rank, "losses": losses, "grads": grads, "state": state, "bufs": bufs}
