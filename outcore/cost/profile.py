"""Measure per-node forward and backward time on the device at hand.

On a host device each fx node is timed where it runs, inside whole training steps of the traced
model (:mod:`outcore.cost.profile_in_step`). On an accelerator (or where such a step fails) each
node is timed in isolation on the real inputs it sees in a forward pass of the example input:
forward with autograd recording, then backward from a random output gradient (median of
``repeat`` runs after ``warmup``). The sum of node times is checked against a timed whole-model
training step; the ratio is stored in ``graph.meta['profile']``.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from outcore.cost.analytical import needs_grad
from outcore.cost.profile_in_step import affordable, step_loss, time_nodes_in_step
from outcore.errors import GraphError, ModelError
from outcore.graph.capture import retrace
from outcore.graph.ir import Graph
from outcore.hardware.allocator import keep_heap
from outcore.hardware.precision import autocast

log = logging.getLogger(__name__)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _split_timeit(fwd: Callable[[Any], Any], bwd: Callable[[Any], None], warmup: int,
                  repeat: int, device: torch.device,
                  setup: Callable[[], Any] = lambda: None) -> tuple[float, float]:
    """Median seconds of ``x = fwd(setup())`` and of ``bwd(x)``, timed in turn in one loop
    (each forward right after the last backward, as training runs them); setup is not timed."""
    f_times, b_times = [], []
    for k in range(warmup + repeat):
        arg = setup()
        _sync(device)
        t0 = time.perf_counter()
        x = fwd(arg)
        _sync(device)
        t1 = time.perf_counter()
        bwd(x)
        _sync(device)
        if k >= warmup:
            f_times.append(t1 - t0)
            b_times.append(time.perf_counter() - t1)
    return statistics.median(f_times), statistics.median(b_times)


def _timeit(fn: Callable[[], Any], warmup: int, repeat: int, device: torch.device,
            setup: Callable[[], Any] | None = None) -> float:
    """Median seconds of ``fn(setup())`` (``fn()`` without setup) over ``repeat`` runs; setup
    is not timed."""
    def run(arg: Any) -> None:
        fn(arg) if setup else fn()

    return _split_timeit(run, lambda _: None, warmup, repeat, device,
                         setup or (lambda: None))[0]


class FixedInput:
    """A recorded input that is model state (a parameter or buffer read by ``get_attr``): the
    timed op gets the tensor itself, not a fresh copy requiring grad, so that batch norm's
    running statistics stay non-differentiable buffers and parameters get their gradients."""

    def __init__(self, value: Any):
        self.value = value


class NoGradInput:
    """A recorded input that does not require grad in training (it depends on no parameter:
    the model's input, or what is computed from it alone): timed without its gradient, as a
    training step's backward does not compute it (a first convolution's backward on an image
    computes the weight's gradient only)."""

    def __init__(self, value: torch.Tensor):
        self.value = value


class _EnvRecorder(fx.Interpreter):
    """Runs the graph and keeps every node's real inputs (detached) for isolated timing;
    ``grad``: whether each named value needs a gradient in a training step
    (:func:`outcore.cost.analytical.needs_grad`; a value not named there is assumed to)."""

    def __init__(self, gm: fx.GraphModule, grad: dict[str, bool] | None = None):
        super().__init__(gm)
        self.inputs: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self.grad = grad or {}

    def run_node(self, n: fx.Node) -> Any:
        if n.op in ("call_module", "call_function", "call_method"):
            self.inputs[n.name] = recorded_inputs(n, self.env, self.grad)
        return super().run_node(n)


def recorded_inputs(n: fx.Node, env: dict[fx.Node, Any], grad: dict[str, bool]
                    ) -> tuple[Any, Any]:
    """``n``'s ``(args, kwargs)`` from the interpreter's values ``env``, as a lone timing of
    it takes them: model state read by ``get_attr`` as :class:`FixedInput`, tensors copied
    (a later in-place op of the forward must not change what this node is timed on: T5's
    bucket indices grow past the embedding otherwise), those needing no gradient in training
    (``grad[name]`` false) as :class:`NoGradInput`."""
    def value(a: fx.Node) -> Any:
        v = env[a]
        if a.op == "get_attr" and isinstance(v, torch.Tensor):
            return FixedInput(v)
        if not isinstance(v, torch.Tensor):
            return v
        copy = v.detach().clone()
        return copy if grad.get(a.name, True) else NoGradInput(copy)
    return fx.map_arg(n.args, value), fx.map_arg(n.kwargs, value)


def node_callable(gm: fx.GraphModule, n: fx.Node) -> Callable[..., Any]:
    if n.op == "call_module":
        return gm.get_submodule(str(n.target))
    if n.op == "call_method":
        return lambda self_, *a, **k: getattr(self_, str(n.target))(*a, **k)
    return n.target  # type: ignore[return-value]


def _fresh_inputs(saved: tuple[tuple[Any, ...], dict[str, Any]]) -> tuple[Any, list[torch.Tensor]]:
    """Inputs as non-leaf tensors requiring grad (in-place ops stay legal), plus the leaves."""
    leaves: list[torch.Tensor] = []

    def make(v: Any) -> Any:
        if isinstance(v, FixedInput):
            return v.value
        if isinstance(v, NoGradInput):
            return v.value.clone()
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            leaf = v.detach().clone().requires_grad_(True)
            leaves.append(leaf)
            return leaf.clone()
        if isinstance(v, torch.Tensor):  # timed in-place ops must not drift integer inputs
            return v.clone()
        return v

    return tree_map(make, saved), leaves


def time_or_forward_only(n: Any, fn: Callable[..., Any],
                          saved: tuple[tuple[Any, ...], dict[str, Any]],
                          params: Sequence[torch.Tensor], device: torch.device, warmup: int,
                          repeat: int) -> tuple[float, float]:
    """:func:`time_node`; an op autograd refuses on inputs that require grad (a mixture of
    experts' routing counts: ``histc`` and friends on float scores give ``Autograd not support
    dtype: Int``) ran on inputs outside autograd in the model: it is timed forward only."""
    try:
        return time_node(fn, saved, params, device, warmup, repeat)
    except RuntimeError as first:
        try:
            times = time_node(fn, saved, params, device, warmup, repeat, backward=False)
        except RuntimeError:
            raise ModelError(f"profiling node {n.name} ({n.target}) failed: {first}") from first
        log.debug("node %s (%s) timed forward only: %s", n.name, n.target, first)
        return times


def time_node(fn: Callable[..., Any], saved: tuple[tuple[Any, ...], dict[str, Any]],
              params: Sequence[torch.Tensor], device: torch.device, warmup: int,
              repeat: int, *, backward: bool = True) -> tuple[float, float]:
    """(forward seconds, backward seconds) of one node on its recorded inputs
    (``backward=False``: the forward outside autograd, and no backward)."""

    def setup_fwd() -> Any:
        return _fresh_inputs(saved)[0]

    def run_fwd(inp: Any) -> Any:
        args, kwargs = inp
        return fn(*args, **kwargs)

    if not backward:
        with torch.no_grad():
            return _timeit(run_fwd, warmup, repeat, device, setup_fwd), 0.0
    with torch.enable_grad():
        fwd = _timeit(run_fwd, warmup, repeat, device, setup_fwd)
        probe = run_fwd(setup_fwd())
        outs = [t for t in tree_leaves(probe) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not outs:
            return fwd, 0.0
        grads = [torch.randn_like(t) for t in outs]

        def setup_bwd() -> Any:
            out = run_fwd(setup_fwd())
            return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]

        def run_bwd(tensors: list[torch.Tensor]) -> None:
            torch.autograd.backward(tensors, grads)

        bwd = _timeit(run_bwd, warmup, repeat, device, setup_bwd)
    for p in params:
        p.grad = None
    return fwd, bwd


def backward_call_s(device: torch.device, warmup: int, repeat: int) -> float:
    """Fixed cost of one ``torch.autograd.backward`` call (on a one-element graph).

    Timing each node's backward separately pays it once per node, while a training step's
    backward pays it once per piece: it is subtracted from every node's backward time."""
    x = torch.ones(1, device=device, requires_grad=True)

    def setup() -> torch.Tensor:
        return x * 1.0

    return _timeit(lambda y: torch.autograd.backward([y], [torch.ones_like(y)]), warmup,
                   max(repeat, 5), device, setup)


def time_step(model: nn.Module, inputs: tuple[torch.Tensor, ...], device: torch.device,
              warmup: int, repeat: int) -> tuple[float, float]:
    """Median seconds of the forward and of the backward of one whole training step of
    ``model`` on ``inputs`` (``repeat`` steps or more: ``profile_in_step.affordable``), each
    forward right after the last backward as the runtime runs them, without the loss this
    timing needs (the simulator charges the runtime's own loss on its own:
    ``outcore.schedule.costs.loss_cost_s``)."""

    def backward(loss: torch.Tensor) -> None:
        loss.backward()

    def forward(_: Any) -> torch.Tensor:
        return step_loss(model(*inputs))

    fwd, bwd = _split_timeit(forward, backward, warmup, 1, device)  # sizes the timed runs
    runs = affordable(repeat, fwd + bwd)
    if runs > 1:
        fwd, bwd = _split_timeit(forward, backward, 0, runs, device)
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        out = tree_map(lambda v: v.detach() if isinstance(v, torch.Tensor) else v,
                       model(*inputs))

    def fresh_output() -> Any:
        return tree_map(lambda v: v.clone().requires_grad_(True) if isinstance(v, torch.Tensor)
                        and v.is_floating_point() else v, out)

    def loss_backward(loss: Any) -> None:
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.backward()

    loss_f, loss_b = _split_timeit(step_loss, loss_backward, warmup, repeat, device,
                                   fresh_output)
    return max(fwd - loss_f, 0.5 * fwd), max(bwd - loss_b, 0.5 * bwd)


def time_optimizer_step(model: nn.Module, inputs: tuple[torch.Tensor, ...],
                        device: torch.device, warmup: int, repeat: int) -> float:
    """Median seconds of the runtime's optimizer action on ``model``'s parameters (the
    non-finite check, a multi-tensor Adam step, clearing the gradients), each right after a
    forward + backward, as the runtime's follows a rank's last backward: there it runs up to
    2x slower than repeated at once (resnet_k, 35 tensors: 0.85-0.91 ms against 0.54 ms here;
    not the data caches: after touching 16 MB, 0.60 ms). Adam with a zero learning rate: the
    weights do not change."""
    from outcore.hardware.nonfinite import any_nonfinite

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return 0.0
    opt = torch.optim.Adam(params, lr=0.0, foreach=True)  # as the runtime's, plain tensors

    def backward() -> None:
        step_loss(model(*inputs)).backward()

    def step(_: Any) -> None:
        any_nonfinite([p.grad for p in params if p.grad is not None])
        opt.step()
        opt.zero_grad(set_to_none=True)

    try:
        return _timeit(step, warmup, repeat, device, backward)
    finally:
        model.zero_grad(set_to_none=True)


def _time_nodes(g: Graph, gm: fx.GraphModule, fx_nodes: dict[str, fx.Node],
                inputs: tuple[torch.Tensor, ...], dev: torch.device, warmup: int, repeat: int,
                progress: Callable[[int, int], None] | None) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of every node of ``g``, each timed alone on the inputs a
    recorded run of ``gm`` gave it."""
    out_grad, _ = needs_grad(g)
    rec = _EnvRecorder(gm, {g.name_of(i): bool(out_grad[i]) for i in range(g.num_nodes)})
    with torch.no_grad():
        rec.run(*inputs)
    fwd = np.zeros(g.num_nodes)
    bwd = np.zeros(g.num_nodes)
    for i in range(g.num_nodes):
        n = fx_nodes[g.name_of(i)]
        if n.name in rec.inputs:
            fn = node_callable(gm, n)
            params = list(fn.parameters()) if isinstance(fn, nn.Module) else []
            fwd[i], bwd[i] = time_or_forward_only(n, fn, rec.inputs[n.name], params, dev,
                                                   warmup, repeat)
        if progress:
            progress(i + 1, g.num_nodes)
    return fwd, bwd


def _node_times(g: Graph, gm: fx.GraphModule, fx_nodes: dict[str, fx.Node],
                inputs: tuple[torch.Tensor, ...], dev: torch.device, warmup: int, repeat: int,
                progress: Callable[[int, int], None] | None
                ) -> tuple[np.ndarray, np.ndarray, str]:
    """Every node's forward and backward seconds, and how they were timed: inside whole
    training steps on a host device (``"in_step"``, :mod:`outcore.cost.profile_in_step`), each
    node alone on an accelerator or where a step of the traced module fails (``"alone"``)."""
    if dev.type == "cpu":
        names = [g.name_of(i) for i in range(g.num_nodes)]
        try:
            fwd, bwd = time_nodes_in_step(gm, names, inputs, warmup, repeat, progress)
            return fwd, bwd, "in_step"
        except Exception as e:  # noqa: BLE001 - any failure: the lone timing still works
            log.info("timing the nodes inside a step failed (%s: %s); timing each alone",
                     type(e).__name__, e)
    fwd, bwd = _time_nodes(g, gm, fx_nodes, inputs, dev, warmup, repeat, progress)
    return fwd, bwd, "alone"


def profile(g: Graph, model: nn.Module, example_inputs: Any, *, device: str | None = None,
            warmup: int = 2, repeat: int = 5, leaves: tuple[str, ...] = (),
            progress: Callable[[int, int], None] | None = None,
            calibrate: bool = True) -> Graph:
    """Fill ``fwd_s`` and ``bwd_s`` of a layer-level graph by timing each node on ``device``.

    Args:
        g: a graph captured from ``model`` at layer level (``depth=None``).
        model: the model (moved to ``device`` for timing, then back).
        example_inputs: the input the graph was captured with (tensor or tuple).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``; default CUDA when present, else CPU.
        warmup, repeat: runs discarded, and runs whose median is kept.
        progress: called as ``progress(done, total)`` after each node.
        calibrate: scale the nodes' forward times by (a timed step's forward / their sum), and
            the backward times likewise, so that each pass adds up to that pass of a real
            training step of the traced module, which the workers run in pieces
            (``meta['profile']['scale_fwd']``, ``['scale_bwd']``); the uncalibrated sum and
            its ratio to the step are recorded either way.

    Returns the graph with times filled, ``meta['costs'] = 'profiled'`` and
    ``meta['profile'] = {device, step_s, sum_s, ratio, ..., adam_step_s}`` (the optimizer action
    after a backward, :func:`time_optimizer_step`, with ``adam_param_bytes`` and
    ``adam_tensors``, what it updated: the simulator scales its CPU model by it).
    """
    if "depth" in g.meta and g.meta.get("fine_nodes"):
        raise GraphError("profile a layer-level graph (captured without --depth), then collapse")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    meta = dict(g.meta)
    if leaves:
        meta["forced_leaves"] = list(meta.get("forced_leaves", ())) + list(leaves)
    traced = retrace(model, inputs, meta)
    gm = traced.gm
    fx_nodes = {n.name: n for n in gm.graph.nodes}
    missing = [g.name_of(i) for i in range(g.num_nodes) if g.name_of(i) not in fx_nodes]
    if missing:
        raise GraphError(f"graph {g.name!r} does not match the model (no layer {missing[0]!r});"
                         " capture and profile the same model")
    original = next((p.device for p in model.parameters()), torch.device("cpu"))
    model.to(dev)
    gm.to(dev)
    inputs = tuple(x.to(dev) for x in inputs)
    keep_heap()  # time the layers as the workers will run them (outcore.hardware.allocator)
    try:
        with autocast(g.meta.get("precision"), dev):  # in the precision the workers run
            fwd, bwd, timed = _node_times(g, gm, fx_nodes, inputs, dev, warmup, repeat, progress)
            # the traced module, as the workers run it (hf:mixtral's traced step is 1.2x its eager
            # one: calibrating to the eager step under-predicted every run of it by 1.2-1.4x)
            step_fwd_s, step_bwd_s = time_step(gm, inputs, dev, warmup, repeat)
            optimizer_s = time_optimizer_step(model, inputs, dev, warmup, repeat)
            stepped = [p for p in model.parameters() if p.requires_grad]
            call_s = backward_call_s(dev, warmup, repeat) if timed == "alone" else 0.0
            bwd = np.where(bwd > 0, np.maximum(bwd - call_s, 0.25 * bwd), 0.0)
    except ModelError:
        raise
    except RuntimeError as e:
        raise ModelError(f"profiling failed on {dev}: {e}") from e
    finally:
        model.to(original)
    sum_fwd, sum_bwd = float(fwd.sum()), float(bwd.sum())
    sum_s, step_s = sum_fwd + sum_bwd, step_fwd_s + step_bwd_s
    ratio = sum_s / step_s if step_s > 0 else float("nan")
    scale_fwd = scale_bwd = 1.0
    if calibrate and sum_fwd > 0 and step_fwd_s > 0:
        # per-node timing in isolation carries per-call costs a whole step does not and misses
        # what a step's order does to each pass (a forward after a backward runs colder than
        # one repeated at once: 1.3-1.9x on the zoo MLP): scale the node times of each pass so
        # that they add up to that pass of a step
        scale_fwd = step_fwd_s / sum_fwd
        scale_bwd = step_bwd_s / sum_bwd if sum_bwd > 0 else scale_fwd
        fwd, bwd = fwd * scale_fwd, bwd * scale_bwd
    meta = {**g.meta, "costs": "profiled",
            "profile": {"device": str(dev), "step_s": step_s, "step_fwd_s": step_fwd_s,
                        "step_bwd_s": step_bwd_s, "sum_s": sum_s, "ratio": ratio,
                        "scale_fwd": scale_fwd, "scale_bwd": scale_bwd,
                        "backward_call_s": call_s, "nodes_timed": timed,
                        "warmup": warmup, "repeat": repeat,
                        "adam_step_s": optimizer_s,
                        # what that step updated: the whole model, one copy
                        "adam_param_bytes": sum(p.numel() * p.element_size() for p in stepped),
                        "adam_tensors": len(stepped)}}
    log.info("profiled %d nodes on %s: sum of nodes %.4fs, whole step %.4fs (ratio %.2f, "
             "forward times scaled by %.2f, backward by %.2f)", g.num_nodes, dev, sum_s,
             step_s, ratio, scale_fwd, scale_bwd)
    return g.replace(fwd_s=fwd, bwd_s=bwd, meta=meta)

