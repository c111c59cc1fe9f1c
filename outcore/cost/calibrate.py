"""Measure grids of layers on the device at hand, to fit the regression (imports torch).

Each layer is timed in isolation with the profiler's :func:`outcore.cost.profile.time_node`
(forward with autograd recording, then backward from a random output gradient, median of
``repeat`` runs), so the samples mean the same as a profiled graph's node times.

Grids are random (seeded) draws from the value lists below, kept when the forward work falls in
a range, so that the default grids measure in about two minutes on one CPU thread:

* :func:`conv2d_grid`: dense convolutions, plus a fraction of depthwise ones (``groups`` =
  channels), which CPU backends run with entirely different kernels;
* :func:`linear_grid`: linear layers on 2-D inputs;
* :func:`op_grid`: pooling, batch norm, ReLU and addition, whose CPU kernels can run far below
  the memory roofline (3×3 pooling at ~1% of it on one thread here), so they are worth measuring.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from outcore.cost.profile import time_node
from outcore.cost.regression import CostModel, Sample, fit

log = logging.getLogger(__name__)

CONV_BATCH = (1, 2, 4, 8)
CONV_CHANNELS_IN = (3, 8, 16, 32, 64, 96, 128, 192, 256)
CONV_CHANNELS_OUT = (8, 16, 32, 64, 96, 128, 192, 256)
CONV_KERNEL = (1, 3, 5, 7)
CONV_IMAGE = (7, 14, 20, 28, 40, 56, 80, 112)
CONV_STRIDE = (1, 1, 1, 2)
LINEAR_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
LINEAR_FEATURES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
OP_BATCH = (1, 2, 4, 8, 16)
OP_CHANNELS = (8, 16, 32, 64, 128, 256)
OP_IMAGE = (7, 14, 16, 28, 32, 56, 112)
OPS = ("maxpool2d", "avgpool2d", "batchnorm2d", "relu", "add")


class _Add(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


@dataclass(frozen=True)
class LayerConfig:
    """One layer to measure: op name, constructor config, input shapes."""

    op: str
    config: dict[str, Any] = field(default_factory=dict)
    in_shapes: tuple[tuple[int, ...], ...] = ()

    def build(self) -> nn.Module:
        c = self.config
        if self.op == "conv2d":
            return nn.Conv2d(c["in_channels"], c["out_channels"], c["kernel_size"],
                             stride=c.get("stride", 1), padding=c.get("padding", 0),
                             groups=c.get("groups", 1))
        if self.op == "linear":
            return nn.Linear(c["in_features"], c["out_features"])
        if self.op == "maxpool2d":
            return nn.MaxPool2d(c["kernel_size"], c["stride"], c["padding"])
        if self.op == "avgpool2d":
            return nn.AvgPool2d(c["kernel_size"], c["stride"], c["padding"])
        if self.op == "batchnorm2d":
            return nn.BatchNorm2d(c["num_features"])
        if self.op == "relu":
            return nn.ReLU()
        if self.op == "add":
            return _Add()
        raise ValueError(f"no builder for op {self.op!r}")

    @property
    def work(self) -> float:
        """Forward FLOPs (2 per multiply-add) for conv/linear, output elements otherwise."""
        c, x = self.config, self.in_shapes[0]
        if self.op == "conv2d":
            n, cin, h, w = x
            k, s, p = c["kernel_size"], c.get("stride", 1), c.get("padding", 0)
            ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
            return 2.0 * n * c["out_channels"] * ho * wo * cin // c.get("groups", 1) * k * k
        if self.op == "linear":
            return 2.0 * math.prod(x[:-1]) * c["in_features"] * c["out_features"]
        return float(math.prod(x))

    def capture_config(self) -> dict[str, Any]:
        """The config as :mod:`outcore.graph.capture` records it (conv tuples as lists)."""
        c = self.config
        if self.op == "conv2d":
            k, s, p = c["kernel_size"], c.get("stride", 1), c.get("padding", 0)
            return {"in_channels": c["in_channels"], "out_channels": c["out_channels"],
                    "kernel_size": [k, k], "stride": [s, s], "padding": [p, p],
                    "dilation": [1, 1], "groups": c.get("groups", 1)}
        if self.op == "maxpool2d":
            return {**c, "dilation": 1}
        return dict(c)


def conv2d_grid(count: int = 240, *, seed: int = 0, depthwise: float = 0.15,
                min_flops: float = 2e5, max_flops: float = 1.2e9) -> list[LayerConfig]:
    """``count`` distinct random conv2d layers (same padding), a ``depthwise`` fraction of them
    with ``groups = in = out channels``, forward FLOPs in ``[min_flops, max_flops]``."""
    rng = random.Random(seed)
    out: dict[tuple[Any, ...], LayerConfig] = {}
    n_depthwise = int(round(depthwise * count))
    for _ in range(count * 200):
        if len(out) >= count:
            break
        dw = sum(1 for lay in out.values() if lay.config.get("groups", 1) > 1) < n_depthwise
        n, cin, cout = rng.choice(CONV_BATCH), rng.choice(CONV_CHANNELS_IN), \
            rng.choice(CONV_CHANNELS_OUT)
        k, size, s = rng.choice(CONV_KERNEL), rng.choice(CONV_IMAGE), rng.choice(CONV_STRIDE)
        if dw:
            cin = cout = rng.choice(CONV_CHANNELS_OUT)
            k = rng.choice((3, 5, 7))
            min_work = min_flops / 10
        else:
            min_work = min_flops
        if k > size:
            continue
        config = {"in_channels": cin, "out_channels": cout, "kernel_size": k, "stride": s,
                  "padding": k // 2, "groups": cin if dw else 1}
        layer = LayerConfig("conv2d", config, ((n, cin, size, size),))
        if min_work <= layer.work <= max_flops:
            out.setdefault((n, cin, cout, k, size, s, dw), layer)
    return list(out.values())


def linear_grid(count: int = 120, *, seed: int = 0, min_flops: float = 1e4,
                max_flops: float = 1e9) -> list[LayerConfig]:
    """``count`` distinct random linear layers (2-D inputs) with forward FLOPs in range."""
    rng = random.Random(seed + 1)
    out: dict[tuple[int, int, int], LayerConfig] = {}
    for _ in range(count * 200):
        if len(out) >= count:
            break
        rows, fin, fout = rng.choice(LINEAR_ROWS), rng.choice(LINEAR_FEATURES), \
            rng.choice(LINEAR_FEATURES)
        layer = LayerConfig("linear", {"in_features": fin, "out_features": fout}, ((rows, fin),))
        if min_flops <= layer.work <= max_flops:
            out.setdefault((rows, fin, fout), layer)
    return list(out.values())


def op_grid(count_per_op: int = 30, *, seed: int = 0, ops: Sequence[str] = OPS,
            max_elements: int = 2**20) -> list[LayerConfig]:
    """``count_per_op`` random shapes for each of ``ops`` (pooling 2×2/3×3, stride 1 or 2)."""
    rng = random.Random(seed + 2)
    out: list[LayerConfig] = []
    for op in ops:
        seen: set[tuple[Any, ...]] = set()
        for _ in range(count_per_op * 200):
            if len(seen) >= count_per_op:
                break
            n, c, size = rng.choice(OP_BATCH), rng.choice(OP_CHANNELS), rng.choice(OP_IMAGE)
            shape = (n, c, size, size)
            if math.prod(shape) > max_elements:
                continue
            config: dict[str, Any] = {}
            if op in ("maxpool2d", "avgpool2d"):
                k, s = rng.choice(((3, 1), (3, 2), (2, 2)))
                config = {"kernel_size": k, "stride": s, "padding": 1 if k == 3 else 0}
            elif op == "batchnorm2d":
                config = {"num_features": c}
            key = (shape, tuple(sorted(config.items())))
            if key in seen:
                continue
            seen.add(key)
            out.append(LayerConfig(op, config, (shape,) * (2 if op == "add" else 1)))
    return out


def measure_layers(layers: Sequence[LayerConfig], *, device: str = "cpu", warmup: int = 3,
                   repeat: int = 5, seed: int = 0,
                   progress: Callable[[int, int], None] | None = None) -> list[Sample]:
    """Time every layer's forward and backward on ``device``; one :class:`Sample` each."""
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for k, layer in enumerate(layers):
        torch.manual_seed(seed + k)
        mod = layer.build().to(dev)
        xs = tuple(torch.randn(s, generator=gen).to(dev) for s in layer.in_shapes)
        with torch.no_grad():
            out_shape = tuple(mod(*xs).shape)
        params = list(mod.parameters())
        fwd, bwd = time_node(mod, (xs, {}), params, dev, warmup, repeat)
        samples.append(Sample(layer.op, layer.capture_config(),
                              tuple(tuple(s) for s in layer.in_shapes), out_shape, fwd, bwd,
                              "float32", sum(p.numel() * p.element_size() for p in params),
                              f"calibrate:{device}"))
        if progress:
            progress(k + 1, len(layers))
    return samples


def default_layers(quick: bool = False, seed: int = 0) -> list[LayerConfig]:
    """The default calibration set: conv2d, linear and op grids (smaller with ``quick``)."""
    return (conv2d_grid(80 if quick else 240, seed=seed) +
            linear_grid(40 if quick else 120, seed=seed) +
            op_grid(10 if quick else 30, seed=seed))


def calibrate(device: str = "cpu", *, quick: bool = False, seed: int = 0,
              repeat: int = 5) -> tuple[CostModel, list[Sample]]:
    """Measure :func:`default_layers` on ``device`` and fit a :class:`CostModel` on them."""
    samples = measure_layers(default_layers(quick, seed), device=device,
                             repeat=3 if quick else repeat, seed=seed)
    return fit(samples, device=device), samples
