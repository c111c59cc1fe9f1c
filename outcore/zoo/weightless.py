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
import functools
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_any, tree_map

from outcore.graph.capture import weightless_mode
from outcore.graph.capture.export import remember_values

__all__ = ["built_in_part", "fake_inputs", "parameters_on_meta", "probe", "registered",
           "weightless"]

_lock = threading.Lock()
_depth = [0]
_register = nn.Module.register_parameter
# while a build runs under parameters_on_meta: every registration (module, name) in order, and
# which of them (by index) stay real
_registrations: list[list[Any]] = []
_kept: list[set[int] | None] = []
# a weightless model -> per parameter registration of its build, in order, the names the finished
# model knows the registered tensor by (none: a tensor it does not hold)
_ORDER: weakref.WeakKeyDictionary[nn.Module, list[tuple[str, ...]]] = weakref.WeakKeyDictionary()


def _register_on_meta(self: nn.Module, name: str, param: Any) -> None:
    _register(self, name, param)
    index = len(_registrations[-1]) if _registrations else None
    keep = _kept[-1] if _kept else None
    p = self._parameters.get(name)
    if p is not None and p.device.type != "meta" and not (keep is not None and index in keep):
        p = self._parameters[name] = nn.Parameter(p.detach().to("meta"),
                                                  requires_grad=p.requires_grad)
    if _registrations:
        _registrations[-1].append(p)


@contextlib.contextmanager
def parameters_on_meta(keep: set[int] | None = None) -> Iterator[list[Any]]:
    """Within the block every parameter a module registers moves to the ``meta`` device as it
    is registered (at most one parameter is ever allocated), except the registrations whose
    index is in ``keep``. Yields the registered tensors in order."""
    with _lock:
        _depth[0] += 1
        nn.Module.register_parameter = _register_on_meta  # type: ignore[method-assign]
    _registrations.append([])
    _kept.append(keep)
    try:
        yield _registrations[-1]
    finally:
        _registrations.pop()
        _kept.pop()
        with _lock:
            _depth[0] -= 1
            if not _depth[0]:
                nn.Module.register_parameter = _register  # type: ignore[method-assign]


def _qualified(model: nn.Module, regs: list[Any]) -> list[tuple[str, ...]]:
    """Each registered tensor's names in ``model`` (several when tied; none when ``model``
    does not hold it)."""
    names: dict[int, list[str]] = {}
    for qual, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(qual)
    return [tuple(sorted(names.get(id(p), ()))) for p in regs]


def registered(model: nn.Module) -> list[tuple[str, ...]] | None:
    """The parameter registrations of a :func:`weightless` model's build, by qualified name
    (what :func:`built_in_part` needs), or None for another model."""
    return _ORDER.get(model)


def weightless(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()``'s model with fake CPU tensors for parameters (see the module docstring).
    Parameters shared between modules (tied embeddings) stay shared."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with parameters_on_meta() as regs:
        model = build()
    order = _qualified(model, regs)
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
    _ORDER[model] = order
    return model


def built_in_part(build: Callable[[], nn.Module], keep: set[str],
                  order: list[tuple[str, ...]]) -> nn.Module:
    """``build()``'s model with only the parameters named in ``keep`` allocated, each with the
    value the whole model built from the same random state would give it; the others stay on
    ``meta``. ``order`` is :func:`registered` of a :func:`weightless` build of the same model.

    Parameters are kept or moved to ``meta`` as they are registered (by the index of their
    registration, which ``order`` names), and every random draw the model's initialisation
    makes on a ``meta`` parameter is drawn on a scratch CPU tensor of its shape, so the random
    stream advances as in the whole build (:class:`_DrawsOnMeta`). Raises :class:`ModelError`
    when the build registers other parameters than ``order`` says or leaves a kept one on
    ``meta``: the caller then builds the model whole.
    """
    from outcore.errors import ModelError

    indices = {i for i, names in enumerate(order) if keep.intersection(names)}
    draws = _DrawsOnMeta()
    with parameters_on_meta(indices) as regs, draws, _init_on_scratch(draws):
        model = build()
    draws.buffers.clear()
    if _qualified(model, regs) != order:
        raise ModelError("the model registered other parameters than in its first build")
    params = dict(model.named_parameters(remove_duplicate=False))
    meta = sorted(n for n in keep if n not in params or params[n].device.type == "meta")
    if meta:
        raise ModelError(f"{len(meta)} kept parameters were not built ({meta[0]}, ...)")
    return model


# random ops: each draws from the CPU generator on a real tensor, nothing on a meta one
_RANDOM = frozenset({
    "uniform_", "normal_", "bernoulli_", "bernoulli", "random_", "exponential_", "cauchy_",
    "log_normal_", "geometric_", "normal", "rand", "randn", "randint", "randperm", "rand_like",
    "randn_like", "randint_like", "multinomial", "poisson"})


class _DrawsOnMeta(TorchDispatchMode):
    """Each random op on a ``meta`` tensor (or made on the ``meta`` device) also runs on
    scratch CPU tensors of the same shapes (zeros), whose result is dropped: the CPU generator
    then advances exactly as when the tensor is real. The scratch is one buffer per dtype, as
    large as the largest draw, reused by every draw and freed after the build: a build that
    allocated a scratch per draw left the allocator holding blocks it could not reuse."""

    def __init__(self) -> None:
        super().__init__()
        self.buffers: dict[torch.dtype, torch.Tensor] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ in _RANDOM and _on_meta(args, kwargs):
            func(*tree_map(self._scratch, args), **tree_map(self._scratch, kwargs))
        return func(*args, **kwargs)

    def _scratch(self, x: Any) -> Any:
        if isinstance(x, torch.device) and x.type == "meta":
            return torch.device("cpu")
        if not (isinstance(x, torch.Tensor) and x.device.type == "meta"):
            return x
        n = x.numel()
        buf = self.buffers.get(x.dtype)
        if buf is None or buf.numel() < n:
            self.buffers.pop(x.dtype, None)
            buf = self.buffers[x.dtype] = torch.empty(n, dtype=x.dtype)
        return buf[:n].view(x.shape).zero_()


# torch.nn.init functions that return early on a meta tensor although they draw (PyTorch 2.14):
# a truncated normal drawn by rejection (as many draws as its values need), orthogonal, sparse
_SKIP_META = ("_no_grad_trunc_normal_", "orthogonal_", "sparse_")


@contextlib.contextmanager
def _init_on_scratch(draws: _DrawsOnMeta) -> Iterator[None]:
    """Within the block those functions run on a scratch CPU tensor when given a ``meta`` one,
    so they draw what they draw for the real tensor (Hugging Face PVT's and CvT's
    ``trunc_normal_``, skipped on ``meta``, gave the ranks that build a part other weights than
    the whole build). Patched
    where callers look them up: ``torch.nn.init`` and Hugging Face's table of the originals."""
    def on_scratch(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                fn(draws._scratch(tensor), *args, **kwargs)
                return tensor
            return fn(tensor, *args, **kwargs)
        return run

    tables: list[dict[str, Any]] = [vars(torch.nn.init)]
    hf = getattr(sys.modules.get("transformers.initialization"), "TORCH_INIT_FUNCTIONS", None)
    if isinstance(hf, dict):
        tables.append(hf)
    saved = [(t, name, t[name]) for t in tables for name in _SKIP_META if callable(t.get(name))]
    for table, name, fn in saved:
        table[name] = on_scratch(fn)
    try:
        yield
    finally:
        for table, name, fn in saved:
            table[name] = fn


def _on_meta(args: tuple, kwargs: dict) -> bool:
    return tree_any(lambda x: (isinstance(x, torch.Tensor) and x.device.type == "meta")
                    or (isinstance(x, torch.device) and x.type == "meta"), (args, kwargs))


def fake_inputs(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """``inputs`` as fake tensors of a :func:`weightless` model's mode (as they are for any
    other model)."""
    mode = weightless_mode(model)
    if mode is None:
        return inputs
    fakes = tuple(mode.from_tensor(x) for x in inputs)
    for fake, x in zip(fakes, inputs):
        remember_values(fake, x)  # for a capture that must run the model on values
    return fakes


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
