"""Profiling a model bigger than the device: one layer at a time, identical layers timed once.

:func:`outcore.cost.profile.profile` moves the whole model to the device and times every node
on the inputs one recorded forward gave it; a model that does not fit the device (the case
outcore exists for) cannot be profiled so. Here the traced model runs forward node by node on
the device, keeping only the activations a later node still reads (what fx's interpreter
frees at their last use): each node's parameters and buffers are put on the device for it
alone (copies; a model built without its weights, :mod:`outcore.zoo.weightless`, gets random
values there, which times the same), its forward and backward are timed on its real inputs as
the whole-model profile times them (:func:`outcore.cost.profile.time_node`), and the copies
are dropped. The device holds one layer's parameters, its inputs and what it times with.

A node whose *signature* was timed already is not timed again: the operator or module (its
class, configuration and parameter shapes), its inputs' shapes, dtypes and whether they need a
gradient, and its other arguments. The 32 decoder layers of a Llama are timed once; each node
of the others reuses the time of its first twin, and the graph says which (``meta['profile']
['same_as']``).

No whole training step can run, so nothing is calibrated to one (the whole-model profile scales
the nodes' sums to a timed step): the times are what the nodes take alone, less the fixed cost
of a backward call.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
import torch
import torch.fx as fx
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.func import functional_call
from torch.utils._pytree import tree_leaves, tree_map

from outcore.cost.analytical import needs_grad
from outcore.cost.profile import (
    backward_call_s,
    node_callable,
    recorded_inputs,
    time_or_forward_only,
)
from outcore.errors import GraphError, ModelError
from outcore.graph.capture import retrace
from outcore.graph.ir import Graph
from outcore.hardware.allocator import keep_heap
from outcore.hardware.precision import autocast

log = logging.getLogger(__name__)

__all__ = ["LayerTimes", "profile_by_layer", "signature", "time_layers"]


class LayerTimes:
    """Per node of the graph (its index order): forward and backward seconds, and for a node
    that reused another's timing, that node's name."""

    def __init__(self, n: int):
        self.fwd = np.zeros(n)
        self.bwd = np.zeros(n)
        self.same_as: dict[str, str] = {}
        self.timed = 0


def _hollow(t: torch.Tensor) -> bool:
    """A tensor with no values to copy: a weightless model's fake or meta parameter."""
    return isinstance(t, FakeTensor) or t.device.type == "meta"


def _on_device(t: torch.Tensor, device: torch.device, grad: bool) -> torch.Tensor:
    """``t``'s values on ``device`` (random ones for a hollow tensor), a leaf of its own."""
    if _hollow(t):
        out = torch.empty(tuple(t.shape), dtype=t.dtype, device=device)
        if out.is_floating_point():
            out.normal_(0.0, 0.02)
        else:  # integer buffers (position ids, counters): valid indices
            out.zero_()
    else:
        out = t.detach().to(device, copy=True)
    return out.requires_grad_(grad and out.is_floating_point())


def _module_call(module: nn.Module, device: torch.device
                 ) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """``module`` as a function of its inputs with copies of its parameters and buffers on
    ``device`` (the module itself untouched), and the parameter copies."""
    tensors = {k: _on_device(p, device, p.requires_grad)
               for k, p in module.named_parameters(remove_duplicate=False)}
    params = list({id(t): t for t in tensors.values()}.values())
    tensors.update({k: _on_device(b, device, False)
                    for k, b in module.named_buffers(remove_duplicate=False)})

    def call(*args: Any, **kwargs: Any) -> Any:
        return functional_call(module, tensors, args, kwargs, tie_weights=False, strict=False)

    return call, params


def _describe(v: Any, grad: bool) -> Any:
    if isinstance(v, torch.Tensor):
        return ("T", tuple(v.shape), str(v.dtype), grad and v.is_floating_point())
    if isinstance(v, (int, float, bool, str, type(None), slice, torch.dtype, torch.device)):
        return repr(v)
    return type(v).__qualname__


def signature(n: fx.Node, module: nn.Module | None, value: Callable[[fx.Node], Any],
              grad: Callable[[fx.Node], bool]) -> str:
    """What a node's time depends on: its operator or module (class, configuration, parameter
    and buffer shapes), its inputs (shapes, dtypes, needing a gradient) and its other
    arguments. ``value(arg_node)``: that input's value; ``grad(arg_node)``: whether it needs a
    gradient in training."""
    if module is not None:
        what: Any = (type(module).__qualname__, str(module),
                     tuple((k, tuple(t.shape), str(t.dtype), t.requires_grad)
                           for k, t in module.named_parameters(remove_duplicate=False)),
                     tuple((k, tuple(t.shape), str(t.dtype))
                           for k, t in module.named_buffers(remove_duplicate=False)))
    else:
        what = (n.op, str(n.target))

    def node(a: fx.Node) -> Any:
        return tuple(_describe(x, grad(a)) for x in tree_leaves(value(a)))

    described = fx.map_arg((n.args, n.kwargs), node)
    return repr((what, tree_map(lambda x: _describe(x, False)
                                if isinstance(x, torch.Tensor) else x, described)))


class _LayerRunner(fx.Interpreter):
    """Runs the traced model forward on ``device`` one node at a time, timing each node (or
    reusing its twin's time) before its output is made."""

    def __init__(self, gm: fx.GraphModule, g: Graph, device: torch.device, warmup: int,
                 repeat: int, progress: Callable[[int, int], None] | None):
        super().__init__(gm, garbage_collect_values=True)
        self.gm, self.device, self.warmup, self.repeat = gm, device, warmup, repeat
        self.progress = progress
        self.index = {g.name_of(i): i for i in range(g.num_nodes)}
        out_grad, _ = needs_grad(g)
        self.grad = {g.name_of(i): bool(out_grad[i]) for i in range(g.num_nodes)}
        self.times = LayerTimes(g.num_nodes)
        self.first: dict[str, tuple[str, float, float]] = {}
        self.attrs: dict[str, Any] = {}
        self.done = 0
        self.calls = sum(1 for n in gm.graph.nodes
                         if n.op in ("call_module", "call_function", "call_method"))

    def fetch_attr(self, target: str) -> Any:
        if target not in self.attrs:
            value = super().fetch_attr(target)
            self.attrs[target] = _on_device(value, self.device, False) \
                if isinstance(value, torch.Tensor) else value
        return self.attrs[target]

    def placeholder(self, target: Any, args: Any, kwargs: Any) -> Any:
        value = super().placeholder(target, args, kwargs)
        return tree_map(lambda t: t.to(self.device) if isinstance(t, torch.Tensor) else t,
                        value)

    def run_node(self, n: fx.Node) -> Any:
        if n.op not in ("call_module", "call_function", "call_method"):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        module = self.module.get_submodule(str(n.target)) if n.op == "call_module" else None
        # a module runs on copies of its tensors on the device; the rest as the profile runs it
        fn, params = _module_call(module, self.device) if module is not None \
            else (node_callable(self.gm, n), [])
        i = self.index.get(n.name)
        if i is not None:
            key = signature(n, module, lambda a: self.env[a],
                            lambda a: self.grad.get(a.name, True))
            twin = self.first.get(key)
            if twin is None:
                inputs = recorded_inputs(n, self.env, self.grad)
                f, b = time_or_forward_only(n, fn, inputs, params, self.device, self.warmup,
                                             self.repeat)
                del inputs
                self.first[key] = (n.name, f, b)
                self.times.timed += 1
            else:
                name, f, b = twin
                self.times.same_as[n.name] = name
            self.times.fwd[i], self.times.bwd[i] = f, b
        with torch.no_grad():
            out = fn(*args, **kwargs)
        del params, fn
        self.done += 1
        if self.progress:
            self.progress(self.done, self.calls)
        return out


def time_layers(g: Graph, gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...],
                device: torch.device, warmup: int, repeat: int,
                progress: Callable[[int, int], None] | None = None) -> LayerTimes:
    """Forward and backward seconds of every node of ``g`` (captured from ``gm``'s model),
    one node at a time on ``device`` (see the module docstring)."""
    runner = _LayerRunner(gm, g, device, warmup, repeat, progress)
    with torch.no_grad():
        runner.run(*inputs)
    log.info("profiled %d nodes layer by layer on %s: %d timed, %d the same as one timed",
             g.num_nodes, device, runner.times.timed, len(runner.times.same_as))
    return runner.times


def profile_by_layer(g: Graph, model: nn.Module, example_inputs: Any, *,
                     device: str | None = None, warmup: int = 2, repeat: int = 5,
                     progress: Callable[[int, int], None] | None = None) -> Graph:
    """Fill ``fwd_s`` and ``bwd_s`` of a layer-level graph one layer at a time on ``device``,
    identical layers timed once (:mod:`outcore.cost.profile_layers`): for a model that does not
    fit the device, or one built without its weights (its layers get random values on the
    device, one at a time). ``meta['profile']`` says ``nodes_timed: "by_layer"``, how many
    nodes were timed and which reused an identical one's time (``same_as``)."""
    if "depth" in g.meta and g.meta.get("fine_nodes"):
        raise GraphError("profile a layer-level graph (captured without --depth), then collapse")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    gm = retrace(model, inputs, dict(g.meta)).gm
    missing = [g.name_of(i) for i in range(g.num_nodes)
               if g.name_of(i) not in {n.name for n in gm.graph.nodes}]
    if missing:
        raise GraphError(f"graph {g.name!r} does not match the model (no layer {missing[0]!r});"
                         " capture and profile the same model")
    keep_heap()
    try:
        with autocast(g.meta.get("precision"), dev):  # in the precision the workers run
            times = time_layers(g, gm, inputs, dev, warmup, repeat, progress)
        call_s = backward_call_s(dev, warmup, repeat)
    except ModelError:
        raise
    except RuntimeError as e:
        raise ModelError(f"profiling layer by layer failed on {dev}: {e}") from e
    fwd, bwd = times.fwd, np.where(times.bwd > 0, np.maximum(times.bwd - call_s, 0.25 * times.bwd),
                                   0.0)
    sum_s = float(fwd.sum() + bwd.sum())
    meta = {**g.meta, "costs": "profiled",
            "profile": {"device": str(dev), "nodes_timed": "by_layer", "sum_s": sum_s,
                        "step_s": None, "ratio": None, "scale_fwd": 1.0, "scale_bwd": 1.0,
                        "backward_call_s": call_s, "warmup": warmup, "repeat": repeat,
                        "timed": times.timed, "reused": len(times.same_as),
                        "same_as": times.same_as}}
    return g.replace(fwd_s=fwd, bwd_s=bwd, meta=meta)
