"""Operators' scratch memory: what a layer takes inside its forward and backward beyond the
tensors the graph shows (oneDNN's channel-blocked copies of a convolution's tensors, a batch
norm's backward buffer, a half-precision reduction's float32 copy, a bfloat16 matrix
product's packed blocks), as measured with the CPU allocator. The memory model
(:mod:`outcore.schedule.costs`) and the spatial tiles' walk (:mod:`outcore.schedule.spatial`)
add it on CPU devices."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from outcore.cost.analytical import HALF_DTYPES, draws_random, itemsize as dtype_itemsize
from outcore.graph.ir import Graph

__all__ = ["attention_scratch", "broadcast_scratch", "gather_scratch",
           "matmul_broadcast_scratch", "matmul_scratch", "workspace", "workspace_bytes"]


def workspace_bytes(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the memory its forward and its backward take inside the operator beyond
    their outputs (scratch buffers the tensors of the graph do not show; :func:`workspace`).
    Counted for CPU devices, where it was measured; an accelerator's (cuDNN's workspaces,
    capped by the library) is not modelled yet."""
    n = g.num_nodes
    fwd, bwd = np.zeros(n), np.zeros(n)
    if g.ops is None or not n:
        return fwd, bwd
    largest_in = np.zeros(n)
    np.maximum.at(largest_in, g.dst, np.asarray(g.edge_bytes, np.float64))
    out = np.asarray(g.out_bytes, np.float64)
    shares = _TPShares.of(g)
    for i, f, b in _measured(g):  # measured at capture (a recurrent layer, a leaf module)
        fwd[i] += f * float(out[i])
        bwd[i] += b * float(out[i])
    for op, idx in g._nodes_by_op.items():
        if op.lower() in _MATMULS:
            for i in idx.tolist():
                fwd[i], bwd[i] = matmul_scratch(g, i, float(out[i]), shares)
        elif op == "scaled_dot_product_attention":
            for i in idx.tolist():
                fwd[i], bwd[i] = attention_scratch(g, i, float(out[i]))
        elif _workspace_kind(op):
            for i in idx.tolist():
                fwd[i], bwd[i] = workspace(g, i, float(largest_in[i]), float(out[i]))
        elif draws_random(op):
            # a random node runs sample by sample (outcore.core.randomness): forward, the
            # samples' parts live beside their join; one with p = 0 runs as it is. On a
            # tensor-parallel shard a sample is drawn whole (its shard placed in zeros, the
            # whole result, the shard's copy)
            sharded = set(g.meta.get("tp_sharded") or ())
            samples = max(1, int(g.batch_size or 1))
            for i in idx.tolist():
                cfg = g.attr(i, "config") or {}
                if cfg.get("p", cfg.get("drop_prob")) != 0:
                    whole = (2 * shares.tp + 1) * float(out[i]) / samples if i in sharded else 0
                    fwd[i] = float(out[i]) + whole
        elif any(k in op.lower() for k in _REDUCTIONS):
            # the CPU reduces a bfloat16 / float16 tensor through a float32 copy of it
            for i in idx.tolist():
                if any(str(g.attr(int(j), "dtype", "")) in HALF_DTYPES
                       for j in g.predecessors(i).tolist()):
                    fwd[i] = 2.0 * float(largest_in[i])
    return fwd, bwd


_REDUCTIONS = ("mean", "avg_pool", "avgpool", "sum")
_MATMULS = ("linear", "addmm", "mm", "matmul", "bmm", "baddbmm")


@dataclass(frozen=True)
class _TPShares:
    """Which products of a tensor-parallel rank's graph (:func:`outcore.cost.tensor.
    tensor_graph`) multiply 1/tp of their columns or of their inner dimension."""

    tp: int
    cols: frozenset[int]
    inner: frozenset[int]
    gathered: frozenset[int]

    @staticmethod
    def of(g: Graph) -> "_TPShares":
        def nodes(key: str) -> frozenset[int]:
            return frozenset(int(v) for v in g.meta.get(key) or ())
        return _TPShares(int(g.meta.get("tp") or 1), nodes("tp_split_cols"),
                         nodes("tp_split_inner"), nodes("tp_gathered"))


def attention_scratch(g: Graph, i: int, out_bytes: float) -> tuple[float, float]:
    """Node ``i``'s scratch (forward, backward) when it is a ``scaled_dot_product_attention``
    whose mask needs a gradient (a learned position bias, timm's TinyViT and Swin): the CPU
    then runs the math path, which makes the scores and their softmax in full, ``[..., L,
    S]``, where the fused kernel makes neither. Measured on the CPU (torch 2.14) over 2 to 16
    samples of 4 to 8 heads and 49 to 256 positions, as a bound: the forward holds twice the
    scores' bytes beyond what the graph shows (what it saves among them), the backward up to
    once beyond the gradients it returns. Zero otherwise: the fused kernel's backward takes
    1.1 to 1.3 times its output (measured alike), which the held-out models with fused
    attention hold inside their predictions without it."""
    ins: list[Any] = list(g.attr(i, "in_shapes") or ())
    shape = g.attr(i, "shape")
    if len(ins) < 4 or not isinstance(shape, (list, tuple)) or len(shape) < 2 or \
            not all(isinstance(s, (list, tuple)) and len(s) >= 2 for s in ins[:2]):
        return 0.0, 0.0
    from outcore.schedule.backward import requires_gradient

    if not _inputs_need(g, i, ins, requires_gradient(g))[3] or not shape[-1]:
        return 0.0, 0.0
    scores = out_bytes * float(ins[1][-2]) / float(shape[-1])
    return 2.0 * scores, 1.0 * scores


def _measured(g: Graph) -> list[tuple[int, float, float]]:
    """The nodes whose scratch the capture measured on real tensors (a recurrent layer's
    oneDNN kernel, a leaf module's inner tensors: :mod:`outcore.graph.capture.recorder`),
    each with its forward's and its backward's in its output's bytes."""
    if g.attrs is None:
        return []
    return [(i, float(a.get("fwd_scratch_share", 0.0)), float(a.get("bwd_scratch_share", 0.0)))
            for i, a in enumerate(g.attrs)
            if a.get("fwd_scratch_share") or a.get("bwd_scratch_share")]


def matmul_scratch(g: Graph, i: int, out_bytes: float,
                   shares: _TPShares | None = None) -> tuple[float, float]:
    """Node ``i``'s scratch (forward, backward) when it is a bfloat16 matrix product of an
    output of ``out_bytes``: oneDNN packs blocks of its operands and accumulates a block of
    the result in float32 in a buffer it takes from the CPU allocator for the call (float16
    and float32 products take none, torch 2.14). The backward's two products (the input's
    gradient and the weight's) run one after the other, so it holds the larger. On a
    tensor-parallel rank, its share of the product (``shares``: read from ``g`` if None)."""
    if str(g.attr(i, "dtype", "")) != "bfloat16" or g.attrs is None:
        return 0.0, 0.0
    shape = g.attr(i, "shape")
    ins = [s for s in (g.attr(i, "in_shapes") or ()) if s and len(s) >= 2]
    if not shape or len(shape) < 2 or not ins:
        return 0.0, 0.0
    shares = shares or _TPShares.of(g)
    n, k, tp = int(shape[-1]), int(ins[0][-1]), shares.tp
    cols = i in shares.cols
    sharded_out = cols and i not in shares.gathered
    batched = g.op_of(i).lower() in ("bmm", "baddbmm")
    # the rows of one product; a linear layer's every leading dimension, at this micro-batch
    m = int(shape[-2]) if batched else \
        int(out_bytes // max(2 * (-(-n // tp) if sharded_out else n), 1))
    if cols:
        n = -(-n // tp)
    if i in shares.inner:
        k = -(-k // tp)
    return _onednn_bf16(m, k, n), max(_onednn_bf16(m, n, k), _onednn_bf16(k, m, n),
                                       _onednn_bf16(n, m, k))


def _onednn_bf16(m: int, k: int, n: int) -> float:
    """A bound on the scratch of one bfloat16 product ``(m x k) @ (k x n)`` on one CPU thread
    (outcore's workers run one; each further thread takes its own): oneDNN works in blocks of
    at most 256 rows, 1024 of the inner dimension and 64 columns (256 once the inner
    dimension passes 512). Against the allocator over m in 8..2048, k and n in 16..4096 and
    either operand transposed: never below what it took, twice it at the median; 1.75 MiB
    at most, whatever the product."""
    if m < 2 or n < 2 or m * k * n <= 16 ** 3:  # torch multiplies these without oneDNN
        return 0.0
    rows, inner = min(m, 256), min(max(k, 32), 1024)
    cols = min(n, 64) if k <= 512 else min(n, 256)
    return float(2048 + 4 * rows * cols + 2 * inner * max(cols, 64) + 4 * rows * inner)


def gather_scratch(g: Graph) -> tuple[np.ndarray, np.ndarray] | None:
    """Per node of a tensor-parallel graph (:func:`outcore.cost.tensor.tensor_graph`), the
    memory a layer whose output is all-gathered takes beyond that output, on any device: its
    forward holds its local shard and the gathered parts beside the joined result, and its
    backward slices this rank's shard out of the whole gradient. None without such layers."""
    nodes = g.meta.get("tp_gathered") or ()
    if not nodes:
        return None
    tp = float(g.meta["tp"])
    fwd, bwd = np.zeros(g.num_nodes), np.zeros(g.num_nodes)
    idx = np.asarray(nodes, np.int64)
    out = np.asarray(g.out_bytes, np.float64)[idx]
    fwd[idx] = out + out / tp
    bwd[idx] = out / tp
    return fwd, bwd


# element-wise products and differences whose backward makes each input's gradient at the
# output's size before the engine sums it down to a broadcast input's shape
_BROADCAST_BACKWARD = frozenset({"mul", "mul_", "div", "div_", "truediv", "sub", "sub_",
                                 "rsub"})


def broadcast_scratch(g: Graph) -> np.ndarray | None:
    """Per node, the memory the backward of an element-wise product (or quotient, or
    difference) takes beyond the gradients the graph shows, on any device: the gradient of an
    input broadcast to the output's shape (an RMSNorm's weight, Mamba's ``A * dt`` of shapes
    ``[1, d, 1, n]`` and ``[b, d, l, 1]``) is made at the output's size and only then summed
    down to the input's. A product makes both inputs' gradients before either is summed, so
    their full sizes are held together. Inputs that need no gradient are not counted (an input
    order the graph cannot tell counts every broadcast input). None when no node has one."""
    if g.ops is None or g.attrs is None:
        return None
    from outcore.schedule.backward import requires_gradient

    needs = requires_gradient(g)
    out = np.zeros(g.num_nodes)
    for op, idx in g._nodes_by_op.items():
        if op.lower() not in _BROADCAST_BACKWARD:
            continue
        for i in idx.tolist():
            if not needs[i]:
                continue
            shape, ins = g.attr(i, "shape"), g.attr(i, "in_shapes")
            if not shape or not ins or not isinstance(shape, (list, tuple)):
                continue
            size = float(np.prod(shape, dtype=np.float64))
            for s, grad in zip(ins, _inputs_need(g, i, ins, needs)):
                if not isinstance(s, (list, tuple)):
                    continue
                part = float(np.prod(s, dtype=np.float64))
                if 0 < part < size and grad:
                    out[i] += float(g.out_bytes[i]) * (1.0 - part / size)
    return out if out.any() else None


def matmul_broadcast_scratch(g: Graph) -> tuple[np.ndarray, np.ndarray] | None:
    """Per node, the memory (forward, backward) a batched matrix product with a broadcast
    operand takes beyond the tensors the graph shows, on any device. ``a @ b`` with both
    operands of three or more dimensions expands each to the output's batch dimensions and
    copies it into one batch of matrices for ``bmm``: a broadcast operand (a table of shape
    ``[2, k, n]`` against ``[b, 2, m, k]``, Gemma 4's position embeddings) is copied at the
    output's batch size. The copy is saved for the backward when the other operand needs a
    gradient (then the graph's saved bytes hold it) and is scratch of the forward when not; the
    backward makes the broadcast operand's gradient at that size before summing it down.
    (With one operand of at most two dimensions torch folds the batch into the rows instead:
    no copy.) None when no node has such an operand."""
    if g.ops is None or g.attrs is None:
        return None
    from outcore.schedule.backward import requires_gradient

    needs = requires_gradient(g)
    fwd, bwd = np.zeros(g.num_nodes), np.zeros(g.num_nodes)
    for op, idx in g._nodes_by_op.items():
        if op.lower() not in ("matmul", "__matmul__"):
            continue
        for i in idx.tolist():
            shape, ins = g.attr(i, "shape"), g.attr(i, "in_shapes") or ()
            if not isinstance(shape, (list, tuple)) or len(shape) < 3 or len(ins) != 2 or \
                    not all(isinstance(s, (list, tuple)) and len(s) >= 3 for s in ins):
                continue
            batch = float(np.prod(shape[:-2], dtype=np.float64))
            matrix = float(shape[-2]) * float(shape[-1])
            grads = _inputs_need(g, i, ins, needs)
            for k, s in enumerate(ins):
                if float(np.prod(s[:-2], dtype=np.float64)) >= batch or not matrix:
                    continue
                copy = float(g.out_bytes[i]) * float(s[-2]) * float(s[-1]) / matrix
                if not grads[1 - k]:
                    fwd[i] += copy
                if grads[k] and needs[i]:
                    bwd[i] += copy
    return (fwd, bwd) if fwd.any() or bwd.any() else None


def _inputs_need(g: Graph, i: int, ins: Sequence[Any], needs: np.ndarray) -> list[bool]:
    """Per input of node ``i`` (``in_shapes`` order), whether it needs a gradient. The graph's
    edges do not say which argument each is, nor name a layer's own parameters: inputs are
    matched to predecessors by shape, and an input no predecessor matches (a parameter, a
    constant) is taken to need one, as is one that predecessors of differing needs match."""
    preds = g.predecessors(i).tolist()
    shapes = [g.attr(p, "shape") for p in preds]
    free = list(range(len(preds)))
    out = []
    for s in ins:
        same = [j for j in free if _same_shape(shapes[j], s)]
        if not same:
            out.append(True)
            continue
        free.remove(same[0])
        out.append(any(bool(needs[preds[j]]) for j in same))
    return out


def _same_shape(a: object, b: object) -> bool:
    return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and \
        [int(x) for x in a] == [int(x) for x in b]


def _workspace_kind(op: str) -> str:
    name = op.lower()
    if "conv" in name and "transpose" not in name:
        return "conv"
    if "batch_norm" in name or "batchnorm" in name:
        return "norm"
    if name in ("pow", "pow_"):
        return "pow"
    return ""


# oneDNN computes a convolution in blocks of this many channels (AVX-512; 8 on AVX2)
_CHANNEL_BLOCK = 16


def workspace(g: Graph, i: int, in_bytes: float, out_bytes: float) -> tuple[float, float]:
    """Node ``i``'s scratch memory (forward, backward) beside an input of ``in_bytes`` and an
    output of ``out_bytes``, measured with the CPU allocator (oneDNN, torch 2.14) and kept
    as the larger: a convolution copies its input and output into channel blocks of 16
    (a tensor of 4 channels takes 4 times its size), forward about the larger of those copies
    and 1.1 activations, backward both copies or two activations (measured 1.0-4.0 and
    1.9-6.9 activations for 3 to 64 channels) and its weight's size; a batch norm's backward
    one activation; a power's backward two (GPT-2's GELU, Llama's RMS norm). A
    bound: a plan that does not fit fails, one with room to spare does not. Zero for other
    operators (measured none for float32 linear layers and element-wise ops)."""
    kind = _workspace_kind(g.op_of(i))
    act = max(in_bytes, out_bytes)
    if kind == "norm":
        return 0.0, act
    if kind == "pow":  # grad * (n * x ** (n - 1)): both factors live beside the result
        return 0.0, 2.0 * act
    if kind != "conv":
        return 0.0, 0.0
    shape = g.attr(i, "shape") if g.attrs is not None else None
    ins = g.attr(i, "in_shapes") if g.attrs is not None else None
    if not shape or not ins or len(shape) < 3 or not ins[0] or len(ins[0]) < 3:
        return 2.0 * act, 3.0 * act  # no shapes: the bound over the channels measured
    pin, pout = _blocked(int(ins[0][1])) * in_bytes, _blocked(int(shape[1])) * out_bytes
    # the model's input has no gradient: the backward copies only the output's blocks
    grad_in = not all(g.op_of(int(p)) == "input" for p in g.predecessors(i))
    # and the backward holds a copy of the weight's gradient beside the one it returns (a
    # constant 77 KiB of a ResNet's peak at every batch size, 2.5 % of it at 2 samples)
    weight = float(g.param_bytes[i]) or sum(float(g.out_bytes[int(p)]) for p in
                                            g.predecessors(i) if g.op_of(int(p)) == "param")
    cfg = g.attr(i, "config") or {}
    kernel = _weight_shape(cfg, ins)
    padded = grad_in and len(kernel) > 2 and int(ins[0][1]) == kernel[1] and \
        _blocked(kernel[1]) > 1
    if padded:  # no groups: the gradient of an input of under 16 channels takes a copy of
        weight *= _blocked(kernel[1])  # the weight padded to 16 of them
    dtype = str(g.attr(i, "dtype", ""))
    half = dtype in HALF_DTYPES
    itemsize = dtype_itemsize(dtype)
    # the forward reorders the weight into oneDNN's blocks (a bfloat16 one its input too)
    copy = float(np.prod(kernel)) * itemsize if len(kernel) > 2 else weight
    fwd = max(1.1 * act, pin, pout) + copy + (in_bytes if half else 0.0)
    # one sample's input (in its producer's precision: float32 for an image) and output
    in_item = max([dtype_itemsize(str(g.attr(int(p), "dtype", "")), itemsize)
                   for p in g.predecessors(i) if g.op_of(int(p)) != "param"] or [itemsize])
    sample = float(np.prod(ins[0][1:])) * in_item + float(np.prod(shape[1:])) * itemsize
    bwd = max(2.0 * act, (pin if grad_in else 0.0) + pout) + weight + \
        _depthwise_nhwc(g, i, cfg, half) + \
        _backward_beyond_blocks(cfg, kernel, float(np.prod(ins[0][2:])), sample, half)
    if g.attr(i, "channels_last") and len(kernel) > 2 and kernel[1] > 1:
        # a channels-last input keeps its layout, unblocked, and the weight is copied to and
        # from it, twice forward and three times backward (measured exactly, plus under 16 KiB
        # in float32; bfloat16 also about one activation backward)
        fwd = 2.0 * copy + 16384.0
        bwd = 3.0 * copy + (act if half else 0.0) + 16384.0 + (weight if padded else 0.0)
    gemm = _gemm_conv(kernel, cfg, ins, shape, itemsize)
    if gemm[0] or gemm[1]:  # im2col and a product: no channel blocks (a ViT's 3-channel image
        return gemm          # would count 5.3 copies of itself)
    native = _native_columns(cfg, ins, shape, kernel, in_bytes, dtype)
    return max(fwd, native), max(bwd, native)


# oneDNN's backward of a strided convolution takes this much beside its blocked copies, and
# this much more per input pixel (of one channel of one sample): the most measured over 1x1
# and 3x3 kernels, 3 to 192 channels, 7 to 56 pixels square, 1 to 8 samples
_STRIDED_SCRATCH = 40 * 1024.0
_STRIDED_PER_PIXEL = 24.0
# and any other float32 one up to this much (a 3x3 of 3 channels at 8x8 pixels: 2 KiB)
_DIRECT_SCRATCH = 4 * 1024.0
# and in bfloat16 / float16, beside that, a part of one sample's input and output (float32
# accumulators): the most measured over the same shapes, per kernel kind
_HALF_SAMPLE_SHARE = {"1x1": 0.75, "1x1 strided": 0.4, "wider": 1.4}


def _backward_beyond_blocks(cfg: dict, kernel: list[int], pixels: float, sample_bytes: float,
                            half: bool) -> float:
    """What a direct convolution's backward takes beyond its blocked copies and weight
    gradients (:func:`workspace`), measured with the CPU allocator on one thread (oneDNN,
    torch 2.14): in float32, a strided one's scratch (:data:`_STRIDED_SCRATCH`, and
    :data:`_STRIDED_PER_PIXEL` for each of the input's ``pixels``), else
    :data:`_DIRECT_SCRATCH`; in half precision, strided or not, a share of one sample's
    input and output (``sample_bytes``; :data:`_HALF_SAMPLE_SHARE`) and
    :data:`_STRIDED_SCRATCH`. The channel blocks alone bounded 0.2-0.5 of the measured
    scratch of small strided convolutions, and 0.5 of bfloat16 3x3 ones of 96 channels at
    56 pixels."""
    strided = any(int(s) > 1 for s in cfg.get("stride") or ())
    if not half:
        return _STRIDED_SCRATCH + _STRIDED_PER_PIXEL * pixels if strided else _DIRECT_SCRATCH
    if len(kernel) > 2 and max(kernel[2:]) > 1:
        share = _HALF_SAMPLE_SHARE["wider"]
    else:
        share = _HALF_SAMPLE_SHARE["1x1 strided" if strided else "1x1"]
    return share * sample_bytes + _STRIDED_SCRATCH


def _native_columns(cfg: dict, ins: list, shape: list, kernel: list[int], in_bytes: float,
                    dtype: str) -> float:
    """The im2col buffer of a float32 convolution PyTorch runs without oneDNN, forward and
    backward alike: one that is not grouped, of a kernel at most 3 wide in some dimension,
    on one sample of at most 20480 elements (PyTorch's rule, ``use_mkldnn``): the input
    channels x kernel x output positions (measured exactly, beside the weight's gradient);
    0 otherwise. The blocked bound missed it, 0.36 of the measured scratch at 24 channels of
    28x28 pixels."""
    if dtype not in ("float32", "") or len(kernel) < 3 or not shape or len(shape) < 3:
        return 0.0
    if int(cfg.get("groups") or 1) > 1 or min(kernel[2:]) > 3:
        return 0.0
    if in_bytes / 4.0 > 20480:
        return 0.0
    per_sample = float(np.prod(ins[0][1:])) * 4.0 if ins and ins[0] else 0.0
    if per_sample and in_bytes > per_sample:  # more than one sample: oneDNN
        return 0.0
    return float(np.prod(kernel[1:])) * float(np.prod(shape[2:])) * 4.0


def _weight_shape(cfg: dict, ins: list) -> list[int]:
    """A convolution's weight shape (out channels, in channels per group, kernel...), from
    its layer's configuration or the functional call's second input; [] when neither."""
    kernel = list(cfg.get("kernel_size") or ())
    if kernel and cfg.get("in_channels") and cfg.get("out_channels"):
        groups = int(cfg.get("groups") or 1)
        return [int(cfg["out_channels"]), int(cfg["in_channels"]) // groups, *map(int, kernel)]
    if len(ins) > 1 and ins[1] and len(ins[1]) == len(ins[0]):
        return [int(d) for d in ins[1]]
    return []


# oneDNN's direct kernels take a kernel up to this wide; a wider one (a ViT's 16x16 patches, a
# 1-d convolution of 15 taps or more, RepLKNet's 31x31) runs as im2col and a matrix product
_DIRECT_WIDTH = 14


def _gemm_conv(weight: list[int], cfg: dict, ins: list, out_shape: list,
               itemsize: int) -> tuple[float, float]:
    """The scratch of a convolution oneDNN computes as im2col and a matrix product, per worker
    thread (workers run one): one sample's columns (in channels per group x kernel x output
    positions) in both directions, beside a float32 copy of the weight forward and four
    backward (measured exactly that plus 256 bytes in float32, for 1-d, 2-d and 3-d, grouped
    and depthwise kernels; bfloat16 takes at most as many bytes). oneDNN does so for a kernel
    wider than :data:`_DIRECT_WIDTH`, and for a dilated one that spans more than its input
    (SKNet's dilated 3x3 at the last stage's 1x1 pixels); (0, 0) for a direct kernel."""
    if len(weight) < 3 or len(out_shape) != len(weight) or not ins or \
            len(ins[0]) != len(weight):
        return 0.0, 0.0
    kernel = weight[2:]
    dilation = list(cfg.get("dilation") or [1] * len(kernel))
    spans = [(k - 1) * int(d) + 1 for k, d in zip(kernel, dilation)]
    dilated_past = any(int(d) > 1 and int(size) < span for size, span, d in
                       zip(ins[0][2:], spans, dilation))
    if kernel[-1] <= _DIRECT_WIDTH and not dilated_past:
        return 0.0, 0.0
    elements = float(np.prod(weight))
    columns = float(np.prod(weight[1:])) * float(np.prod(out_shape[2:])) * itemsize
    return 4.0 * elements + columns, 16.0 * elements + columns + 512.0


def _depthwise_nhwc(g: Graph, i: int, cfg: dict, half: bool) -> float:
    """The backward buffer of a depthwise convolution (one filter per channel) whose input is
    channels-last in memory (ConvNeXt's blocks, PVT's MLP): 1 KiB per weight element whatever
    the batch and image (float32; up to 1.29 times that in bfloat16), measured with the CPU
    allocator on 1 and 2 threads, for a kernel of 5 or more, and for a 3x3 one only on an
    input fewer rows high than the kernel (at 2x2, not at 3x3 or 2 wide x 8 high)."""
    kernel = list(cfg.get("kernel_size") or ())
    channels = int(cfg.get("in_channels") or 0)
    if not g.attr(i, "channels_last") or not channels or len(kernel) != 2 or \
            int(cfg.get("groups") or 1) != channels:
        return 0.0
    ins = g.attr(i, "in_shapes") or ()
    rows = int(ins[0][2]) if ins and len(ins[0]) == 4 else 0
    if max(kernel) < 5 and rows >= kernel[0]:
        return 0.0
    return channels * kernel[0] * kernel[1] * 1024.0 * (1.3 if half else 1.0)


def _blocked(channels: int) -> float:
    """How much larger a tensor of ``channels`` channels is in oneDNN's channel blocks."""
    if channels <= 0:
        return 1.0
    return -(-channels // _CHANNEL_BLOCK) * _CHANNEL_BLOCK / channels
