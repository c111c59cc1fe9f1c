"""Models built without their weights: shapes for capture and planning, no memory.

A model that does not fit one process still has to be captured and planned in one. Built in
:func:`weightless`, every parameter is created as usual (the model's own code, its own
initialisation) and moved to the ``meta`` device as soon as it is registered, one at a time (as
Accelerate's ``init_empty_weights`` does), then replaced by a fake CPU tensor of the same shape,
dtype and strides: a ``FakeTensorMode`` tensor that has no storage. Buffers stay real (they are
small, and models compute them at build time: rotary frequencies, position ids). Capture then
traces and records the model in that fake mode (:func:`outcore.graph.capture.weightless_mode`),
which is how it records every model anyway, so the graph is the one the real model gives: the
same nodes, bytes and saved activations (``tests/zoo/test_weightless.py``), and the device the
kernels are chosen for is the CPU, not ``meta`` (attention kernels save other tensors there).

Parameters only, not factory functions: a default ``meta`` device would also move the tensors a
model computes at build time and reads back (``torch.linspace(...).item()`` in timm's drop-path
rates), which cannot be read on ``meta``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from outcore.graph.capture import weightless_mode

__all__ = ["fake_inputs", "parameters_on_meta", "probe", "weightless"]

_lock = threading.Lock()
_depth = [0]
_register = nn.Module.register_parameter


def _register_on_meta(self: nn.Module, name: str, param: Any) -> None:
    _register(self, name, param)
    p = self._parameters.get(name)
    if p is not None and p.device.type != "meta":
        self._parameters[name] = nn.Parameter(p.detach().to("meta"),
                                              requires_grad=p.requires_grad)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Within the block every parameter a module registers moves to the ``meta`` device as it
    is registered: at most one parameter is ever allocated."""
    with _lock:
        _depth[0] += 1
        nn.Module.register_parameter = _register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        with _lock:
            _depth[0] -= 1
            if not _depth[0]:
                nn.Module.register_parameter = _register  # type: ignore[method-assign]


def weightless(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()``'s model with fake CPU tensors for parameters (see the module docstring).
    Parameters shared between modules (tied embeddings) stay shared."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with parameters_on_meta():
        model = build()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in made:
                with mode:
                    empty = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device="cpu")
                made[id(p)] = nn.Parameter(empty, requires_grad=p.requires_grad)
            module._parameters[name] = made[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None and b.device.type == "meta":  # a buffer the model made on meta
                with mode:
                    module._buffers[name] = torch.empty_strided(b.shape, b.stride(),
                                                                dtype=b.dtype, device="cpu")
    return model


def fake_inputs(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """``inputs`` as fake tensors of a :func:`weightless` model's mode (as they are for any
    other model)."""
    mode = weightless_mode(model)
    return inputs if mode is None else tuple(mode.from_tensor(x) for x in inputs)


def probe(build: Callable[[], Any]) -> None:
    """Build once to fail early on bad options, without the weights; a build that cannot run
    that way runs for real (its own error, if any, is the one raised)."""
    try:
        with parameters_on_meta():
            build()
            return
    except Exception:  # the model's code may read a parameter back: build it for real
        pass
    build()
