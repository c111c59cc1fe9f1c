"""Analytical per-node forward/backward time: FLOPs and bytes against a device spec (roofline).

For every node (Williams, Waterman & Patterson, "Roofline", CACM 52(4), 2009)::

    t = max(flops / (peak × efficiency), bytes / mem_bandwidth) + kernels × launch_s

*Forward FLOPs* are capture's ``attrs['flops']`` (``torch.utils.flop_counter``, 2 FLOPs per
multiply-add); when absent they are derived from the layer config and shapes (conv, linear,
matmul, LSTM) or counted per output element for element-wise ops (table ``_ELEMENT_FLOPS``).
*Backward FLOPs* follow the usual rule (Kaplan et al. 2020, "Scaling Laws for Neural Language
Models", §2.1; Hobbhahn & Sevilla, "What's the backward-forward FLOP ratio for neural networks?",
Epoch AI 2021): a layer with weights, or with two differentiable tensor inputs (matmul), computes
one gradient per operand of its product, each costing as much as the forward: 2× forward; an
element-wise / normalisation / pooling op computes one gradient: 1× forward. A weighted layer
whose input needs no gradient (the first layer) computes the weight gradient only: 1×. A node
nothing upstream of which needs a gradient (no parameters on any path from the inputs) has no
backward (the profiler times each node on inputs that need a gradient by the same rule,
:func:`needs_grad`).

*Bytes* moved by the forward are inputs + output + parameters (from ``in_shapes``, ``out_bytes``,
``param_bytes``; normalisations and softmax read their input twice); the backward of a weighted
layer moves about twice that (gradient w.r.t. input and w.r.t. weights each stream the output
gradient, one operand and one result), other backwards move forward bytes + one output gradient.

*Fallback* for nodes without attrs (graphs from files, collapsed blocks): no FLOPs are known, the
node is taken as memory-bound, reading one tensor of its output size and writing its output:
``bytes = 2 × out_bytes + param_bytes``. View-like ops (``getitem``, ``view``, ``flatten``, ...)
and graph inputs/outputs/parameters cost 0.

Pure numpy: no torch.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from outcore.graph.algorithms import topological_order
from outcore.graph.ir import Graph
from outcore.hardware.presets import device_preset
from outcore.hardware.spec import DeviceSpec

if TYPE_CHECKING:  # pragma: no cover
    from outcore.cost.regression import CostModel

log = logging.getLogger(__name__)

#: Ops that move no data and launch no kernel (aliases, bookkeeping, graph boundary).
ZERO_COST_OPS = frozenset({
    "input", "output", "param", "constant", "getitem", "getattr", "size", "dim", "view",
    "reshape", "flatten", "transpose", "permute", "t", "squeeze", "unsqueeze", "expand",
    "expand_as", "view_as", "split", "chunk", "unbind", "narrow", "select", "identity",
    "detach", "unflatten", "movedim", "as_strided", "numel", "type_as_view",
})
#: Ops with weights or two differentiable operands of a product: backward = 2 × forward FLOPs.
MATRIX_OPS = frozenset({
    "conv1d", "conv2d", "conv3d", "convtranspose1d", "convtranspose2d", "convtranspose3d",
    "linear", "bilinear", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "lstm", "gru",
    "rnn", "lstmcell", "grucell", "rnncell", "multiheadattention",
    "scaled_dot_product_attention",
})
#: Approximate FLOPs per output element of element-wise and reduction ops (forward).
_ELEMENT_FLOPS = {
    "relu": 1, "relu6": 2, "leakyrelu": 2, "add": 1, "sub": 1, "mul": 1, "truediv": 1, "div": 1,
    "iadd": 1, "neg": 1, "tanh": 8, "sigmoid": 8, "gelu": 12, "silu": 10, "hardswish": 4,
    "elu": 8, "softmax": 5, "log_softmax": 6, "logsoftmax": 6, "batchnorm1d": 8,
    "batchnorm2d": 8, "batchnorm3d": 8, "layernorm": 8, "groupnorm": 8, "instancenorm2d": 8,
    "dropout": 2, "dropout2d": 2, "exp": 4, "log": 4, "sqrt": 2, "pow": 4, "cat": 0,
    "stack": 0, "embedding": 0, "contiguous": 0, "clone": 0, "to": 0, "float": 0,
}
#: Ops that read their input twice in the forward (statistics, then normalisation).
_TWO_PASS_OPS = frozenset({"batchnorm1d", "batchnorm2d", "batchnorm3d", "layernorm", "groupnorm",
                           "instancenorm2d", "softmax", "log_softmax", "logsoftmax"})
_POOL_OPS = frozenset({"maxpool1d", "maxpool2d", "maxpool3d", "avgpool1d", "avgpool2d",
                       "avgpool3d", "adaptiveavgpool1d", "adaptiveavgpool2d",
                       "adaptivemaxpool2d", "adaptiveavgpool3d"})
_ITEMSIZE = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8,
             "double": 8, "int64": 8, "long": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
             "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8}
# operators that draw random numbers, by name fragment (outcore.core.randomness runs them
# sample by sample, and on a tensor-parallel shard draws each sample whole)
RANDOM_OPS = ("dropout", "drop_path", "droppath", "stochastic_depth", "stochasticdepth",
              "bernoulli")
HALF_DTYPES = frozenset({"float16", "half", "bfloat16", "float8_e4m3fn", "float8_e5m2"})


def itemsize(dtype: str, default: int = 4) -> int:
    """Bytes per element of a dtype named as torch prints it (``"bfloat16"``); ``default``
    for a name it does not know."""
    return _ITEMSIZE.get(dtype, default)

_NON_DIFF = frozenset({"int64", "long", "int32", "int16", "int8", "uint8", "bool"})
_DETACHING = frozenset({"detach", "detach_"})  # ops whose output leaves autograd


@dataclass(frozen=True)
class Work:
    """What one node does: FLOPs and bytes of its forward and backward, and kernel counts."""

    fwd_flops: float
    bwd_flops: float
    fwd_bytes: float
    bwd_bytes: float
    fwd_kernels: int = 1
    bwd_kernels: int = 1
    matrix: bool = False
    dtype: str = "float32"


def _prod(xs: Sequence[int]) -> int:
    return int(math.prod(int(x) for x in xs)) if xs else 1


def _pair(v: Any, default: int = 1) -> tuple[int, ...]:
    if v is None:
        return (default,)
    return tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else (int(v),)


def first_shape(shape: Any) -> list[int] | None:
    """The first tensor shape in a (possibly nested) recorded shape (``[]`` for a scalar)."""
    if not isinstance(shape, (list, tuple)):
        return None
    if all(isinstance(x, int) for x in shape):
        return list(shape)
    for s in shape:
        found = first_shape(s)
        if found is not None:
            return found
    return None


def kernel_elems(config: dict[str, Any], spatial: int) -> int:
    """Elements of a convolution kernel window (``kernel_size`` int or per-dimension list)."""
    k = _pair(config.get("kernel_size", 1))
    return _prod(k * spatial if len(k) == 1 else k)


def matrix_flops(op: str, config: dict[str, Any], in_shapes: Sequence[Sequence[int]],
                 out_shape: Sequence[int] | None) -> float:
    """Forward FLOPs (2 per multiply-add) of a conv/linear/matmul/LSTM from its config and shapes.

    Returns 0 when the shapes needed are unknown. Bias additions are not counted (as in
    ``torch.utils.flop_counter``).
    """
    x = list(in_shapes[0]) if in_shapes else None
    if op.startswith("conv") and "transpose" not in op:
        if not out_shape or x is None:
            return 0.0
        cin = int(config.get("in_channels", x[1] if len(x) > 1 else 1))
        groups = max(int(config.get("groups", 1)), 1)
        kernel = kernel_elems(config, spatial=max(len(out_shape) - 2, 1))
        return 2.0 * _prod(out_shape) * (cin // groups) * kernel
    if op == "linear":
        if x is None:
            return 0.0
        fin = int(config.get("in_features", x[-1]))
        fout = int(config.get("out_features", out_shape[-1] if out_shape else 0))
        return 2.0 * _prod(x[:-1]) * fin * fout
    if op in ("matmul", "mm", "bmm") and len(in_shapes) >= 2 and out_shape:
        k = int(in_shapes[0][-1])
        return 2.0 * _prod(out_shape) * k
    if op in ("lstm", "gru", "rnn") and x is not None:
        gates = {"lstm": 4, "gru": 3, "rnn": 1}[op]
        hidden = int(config.get("hidden_size", 0))
        inp = int(config.get("input_size", x[-1]))
        layers = int(config.get("num_layers", 1))
        steps = _prod(x[:-1])  # batch × sequence
        per_layer = 2.0 * gates * hidden * (inp + hidden)
        deeper = 2.0 * gates * hidden * (2 * hidden) * (layers - 1)
        return steps * (per_layer + deeper)
    return 0.0


def work(op: str, attrs: dict[str, Any] | None, *, param_bytes: float, out_bytes: float,
         needs_input_grad: bool = True) -> Work:
    """FLOPs and bytes of one node from its op name and capture attrs (see module docstring).

    Args:
        op: the node's op name (``conv2d``, ``relu``, ...).
        attrs: capture's per-node dict (``flops``, ``in_shapes``, ``shape``, ``config``,
            ``dtype``), or None/{} for graphs without them.
        param_bytes, out_bytes: the node's parameter and output bytes.
        needs_input_grad: whether the node's tensor inputs need a gradient.
    """
    attrs = attrs or {}
    op = op.lower()
    dtype = str(attrs.get("dtype", "float32"))
    itemsize = _ITEMSIZE.get(dtype, 4)
    in_shapes = [s for s in attrs.get("in_shapes", []) if isinstance(s, list)]
    out_shape = first_shape(attrs.get("shape"))
    has_shapes = bool(in_shapes) or "in_shapes" in attrs
    if has_shapes:
        in_bytes = float(sum(_prod(s) for s in in_shapes) * itemsize)
    else:  # fallback: one input the size of the output
        in_bytes = float(out_bytes)
    out_elems = (out_bytes / itemsize if out_bytes else
                 float(_prod(out_shape)) if out_shape is not None else 0.0)
    matrix = op in MATRIX_OPS
    flops = float(attrs.get("flops", 0) or 0)
    if matrix and not flops:
        flops = matrix_flops(op, attrs.get("config", {}), in_shapes, out_shape)
    elif not matrix and has_shapes:
        if op in _POOL_OPS:
            flops = float(max(sum(_prod(s) for s in in_shapes), out_elems))
        else:
            flops = float(_ELEMENT_FLOPS.get(op, 1)) * out_elems
    passes = 2.0 if op in _TWO_PASS_OPS else 1.0
    has_weights = param_bytes > 0
    if op == "embedding":  # gathers rows: reads as many weight bytes as it writes
        fwd_bytes = in_bytes + 2.0 * float(out_bytes)
        return Work(0.0, float(out_elems), fwd_bytes, float(param_bytes) + 2.0 * float(out_bytes),
                    1, 1, False, dtype)
    fwd_bytes = passes * in_bytes + float(out_bytes) + float(param_bytes)
    grads = 0
    if matrix and has_weights:  # weight gradient, plus input gradient when needed
        grads = 1 + (1 if needs_input_grad else 0)
    elif matrix and len(in_shapes) >= 2:  # product of two tensors: one gradient per operand
        grads = 2
    if grads:
        bwd_flops, bwd_bytes, bwd_kernels = grads * flops, grads * fwd_bytes, grads
    else:
        bwd_flops, bwd_bytes, bwd_kernels = flops, fwd_bytes + float(out_bytes), 1
    return Work(flops, bwd_flops, fwd_bytes, bwd_bytes, 1, bwd_kernels, matrix, dtype)


def roofline_s(flops: float, nbytes: float, kernels: int, device: DeviceSpec, *,
               matrix: bool = True, dtype: str = "float32") -> float:
    """``max(flops / (peak × efficiency), bytes / bandwidth) + kernels × launch_s``, seconds.

    Half-precision matrix work runs at ``peak_flops_tc`` when the device has one.
    """
    peak = device.peak_flops
    if matrix and dtype in HALF_DTYPES and device.peak_flops_tc > 0:
        peak = device.peak_flops_tc
    compute = flops / (peak * device.efficiency) if flops > 0 else 0.0
    memory = nbytes / device.mem_bandwidth if nbytes > 0 else 0.0
    return max(compute, memory) + kernels * device.launch_s


def node_times(w: Work, device: DeviceSpec) -> tuple[float, float]:
    """(forward seconds, backward seconds) of a :class:`Work` on ``device``."""
    fwd = roofline_s(w.fwd_flops, w.fwd_bytes, w.fwd_kernels, device, matrix=w.matrix,
                     dtype=w.dtype)
    bwd = 0.0
    if w.bwd_kernels > 0:
        bwd = roofline_s(w.bwd_flops, w.bwd_bytes, w.bwd_kernels, device, matrix=w.matrix,
                         dtype=w.dtype)
    return fwd, bwd


def layer_times(op: str, attrs: dict[str, Any] | None, device: DeviceSpec | str, *,
                param_bytes: float, out_bytes: float,
                needs_input_grad: bool = True) -> tuple[float, float]:
    """(forward seconds, backward seconds) of one layer on ``device`` by the roofline."""
    if op.lower() in ZERO_COST_OPS:
        return 0.0, 0.0
    w = work(op, attrs, param_bytes=param_bytes, out_bytes=out_bytes,
             needs_input_grad=needs_input_grad)
    return node_times(w, _resolve(device))


def needs_grad(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Per node: (its output needs a gradient, one of its inputs needs a gradient).

    An output needs a gradient when the node owns parameters or an input does (the graph's inputs
    do not; integer and boolean outputs, and a ``detach``'s, never do). Without op names every
    node is assumed to.
    """
    n = g.num_nodes
    out_grad = np.zeros(n, dtype=bool)
    in_grad = np.zeros(n, dtype=bool)
    if g.ops is None:
        return np.ones(n, dtype=bool), np.ones(n, dtype=bool)
    for i in topological_order(g).tolist():
        preds = g.predecessors(i)
        in_grad[i] = bool(out_grad[preds].any()) if preds.size else False
        op = g.ops[i]
        differentiable = str(g.attr(i, "dtype", "float32")) not in _NON_DIFF
        out_grad[i] = differentiable and op != "input" and op not in _DETACHING and (
            in_grad[i] or g.param_bytes[i] > 0 or op == "param")
    return out_grad, in_grad


def _resolve(device: DeviceSpec | str) -> DeviceSpec:
    return device if isinstance(device, DeviceSpec) else device_preset(device)


def estimate(g: Graph, device: DeviceSpec | str, *, model: "CostModel | None" = None) -> Graph:
    """Fill ``fwd_s``/``bwd_s`` of every node of ``g`` analytically for ``device``.

    Args:
        g: any graph; capture attrs (``flops``, ``in_shapes``, ``shape``, ``config``) make the
            estimate sharper, nodes without them fall back to a memory-bound estimate.
        device: a :class:`DeviceSpec` or a preset name (``"a100"``, ``"cpu"``, path to .json).
        model: a fitted :class:`outcore.cost.regression.CostModel`; nodes whose op it covers are
            predicted by it, the rest by the roofline.

    Returns a new graph with ``meta['costs'] = 'estimated:<device>'`` and
    ``meta['estimate'] = {device, method counts, regression summary}``.
    """
    spec = _resolve(device)
    if g.meta.get("fine_nodes"):
        log.warning("graph %r is collapsed (depth %s): blocks have no FLOP counts and are costed "
                    "as memory-bound; estimate the layer-level graph, then collapse it",
                    g.name, g.meta.get("depth"))
    out_grad, in_grad = needs_grad(g)
    fwd = np.zeros(g.num_nodes)
    bwd = np.zeros(g.num_nodes)
    counts = {"zero": 0, "roofline": 0, "fallback": 0, "regression": 0}
    for i in range(g.num_nodes):
        op = g.op_of(i).lower()
        attrs = g.attrs[i] if g.attrs is not None else {}
        if op in ZERO_COST_OPS:
            counts["zero"] += 1
            continue
        w = work(op, attrs, param_bytes=float(g.param_bytes[i]), out_bytes=float(g.out_bytes[i]),
                 needs_input_grad=bool(in_grad[i]))
        predicted = None
        if model is not None and "in_shapes" in attrs:
            predicted = model.predict(op, attrs.get("config", {}), attrs["in_shapes"],
                                      first_shape(attrs.get("shape")),
                                      dtype=str(attrs.get("dtype", "float32")),
                                      param_bytes=int(g.param_bytes[i]))
        if predicted is not None:
            fwd[i], bwd[i] = predicted
            if w.matrix and not in_grad[i] and g.param_bytes[i] > 0:
                bwd[i] *= 0.5  # weight gradient only (the model was fitted with input grads)
            counts["regression"] += 1
        else:
            fwd[i], bwd[i] = node_times(w, spec)
            counts["roofline" if ("in_shapes" in attrs or "flops" in attrs) else "fallback"] += 1
        if not out_grad[i]:
            bwd[i] = 0.0
    meta = {**g.meta, "costs": f"estimated:{spec.name}",
            "estimate": {"device": spec.name, "nodes": counts,
                         "regression": model.summary() if model is not None else None}}
    log.info("estimated %d nodes for %s: %s; forward %.4g s, backward %.4g s", g.num_nodes,
             spec.name, counts, fwd.sum(), bwd.sum())
    return g.replace(fwd_s=fwd, bwd_s=bwd, meta=meta)


def draws_random(op: str) -> bool:
    """Whether operator ``op`` (a graph node's op name) draws random numbers."""
    return any(k in op.lower() for k in RANDOM_OPS)
