"""Tensor parallelism at the graph level, for models captured through ``torch.export``.

A plan's pieces are cut from the model's traced graph. A torch.fx trace calls each ``nn.Linear``
as a module, so DTensor's ``parallelize_module``
(:func:`outcore.parallel.tensor.parallel.split_for_plan`) acts inside the pieces through the
module's hooks. A ``torch.export`` graph (Hugging Face LMs) calls ``aten.linear`` /
``aten.embedding`` on the weights directly: no module hook runs, and torch.export cannot re-capture
a DTensor-parallelised model either (checked with torch 2.14: "non-fx-graphable type DTensorSpec").
So the split is written into the exported graph itself, node for node (the node names, and so the
plan's pieces, stay the same):

* the weights of the layout's split layers become ``DTensor`` shards (``Shard(0)``: rows of a
  column-split Linear's weight and bias, vocabulary rows of an Embedding; ``Shard(1)``: columns
  of a row-split Linear's weight, whose bias stays whole and is added once, after the reduce);
  being DTensors, they are gathered whole, checkpointed and all-reduced across copies by the
  runtime's existing code;
* each split call's target becomes a function here that runs on the local shard with
  Megatron-LM's conjugate operators (Shoeybi et al. 2019, section 3, figure 3): ``f`` (identity
  forward, all-reduce of the gradient backward) at a column-split layer's input, ``g``
  (all-reduce forward, identity backward) at a row-split layer's output, an all-gather for a
  layer split alone;
* a fused q/k/v projection (one Linear cut into equal chunks, :func:`outcore.graph.tensor_pairs.
  chunks_of`) is sharded chunk by chunk: each rank holds its heads of every chunk
  (``_StridedShard``); Hugging Face's ``Conv1D`` (``addmm`` with an ``[in, out]`` weight) is
  split like a Linear with its weight's dimensions swapped;
* constant sizes inside a pair that carry the split are divided by ``tp``: a reshape's last size
  equal to a split (or chunk) width, the size before it equal to the head count, a ``split``'s
  chunk size (HF code mostly reshapes with ``-1``, which needs nothing).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
from torch import nn
from torch.nn import functional as F

from outcore.core.collectives import record
from outcore.core.comm import settled
from outcore.core.values import local as _local
from outcore.errors import UsageError
from outcore.graph.tensor_pairs import TensorLayout, is_conv1d, out_features

log = logging.getLogger(__name__)

__all__ = ["split_graph", "tp_colwise_linear", "tp_rowwise_linear", "tp_colwise_gather_linear",
           "tp_rowwise_alone_linear", "tp_vocab_embedding", "tp_embed_dim_embedding",
           "tp_colwise_conv1d", "tp_rowwise_conv1d", "tp_colwise_gather_conv1d",
           "tp_rowwise_alone_conv1d", "chunkwise_shard", "slice_head_operands", "set_tensor_mesh",
           "tp_add_heads_left", "tp_add_heads_right", "tp_sdpa_heads", "split_style"]

_SHAPE_TARGETS = ("view", "reshape", "_unsafe_view", "expand")


# ------------------------------------------------------------------------------ collectives


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t)


def _all_reduce(t: torch.Tensor, group: Any) -> torch.Tensor:
    out = t.contiguous().clone()
    if not _is_fake(out):  # shape propagation (FakeTensorMode) runs no collective
        with settled(out), record("tp allreduce", out.numel() * out.element_size()):
            dist.all_reduce(out, group=group)
    return out


class CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad, ctx.group), None


class ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class GatherFromTP(torch.autograd.Function):
    """All-gather along the last dimension forward; this rank's slice of the gradient back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.rank, ctx.width = rank, x.shape[-1]
        x = x.contiguous()
        if _is_fake(x):
            return torch.cat([x] * size, dim=-1)
        parts = [torch.empty_like(x) for _ in range(size)]
        with settled(x, *parts), record("tp allgather", x.numel() * x.element_size() * size):
            dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        lo = ctx.rank * ctx.width
        return grad[..., lo:lo + ctx.width].contiguous(), None


def _mesh(w: torch.Tensor) -> Any:
    """The tensor-parallel mesh of a split weight: its own (a DTensor), or this process's
    when the weight arrived from another pipeline stage as its local shard (a tied weight:
    GPT-2's embedding read again by the LM head on a later stage)."""
    return w.device_mesh if hasattr(w, "device_mesh") else _HEADS_MESH[-1]


def _group(w: torch.Tensor) -> Any:
    return _mesh(w).get_group()


# ------------------------------------------------------------------------------ split calls
# (graph targets: aten.linear(input, weight, bias=None), aten.embedding(weight, indices, ...))


def tp_colwise_linear(x: torch.Tensor, w: torch.Tensor,
                      b: torch.Tensor | None = None) -> torch.Tensor:
    """Column-split Linear of a pair: replicated input, output features sharded."""
    return F.linear(CopyToTP.apply(x, _group(w)), _local(w), _local(b))


def tp_rowwise_linear(x: torch.Tensor, w: torch.Tensor,
                      b: torch.Tensor | None = None) -> torch.Tensor:
    """Row-split Linear of a pair: sharded input, output summed over the group, bias once."""
    y = ReduceFromTP.apply(F.linear(x, _local(w)), _group(w))
    return y if b is None else y + _local(b)


def tp_colwise_gather_linear(x: torch.Tensor, w: torch.Tensor,
                             b: torch.Tensor | None = None) -> torch.Tensor:
    """A Linear split alone by columns: its output all-gathered."""
    return GatherFromTP.apply(tp_colwise_linear(x, w, b), _group(w))


def tp_rowwise_alone_linear(x: torch.Tensor, w: torch.Tensor,
                            b: torch.Tensor | None = None) -> torch.Tensor:
    """A Linear split alone by rows: the replicated input sliced to this rank's features."""
    width = _local(w).shape[1]
    lo = _mesh(w).get_local_rank() * width
    x = CopyToTP.apply(x, _group(w))[..., lo:lo + width]
    return tp_rowwise_linear(x, w, b)


def tp_vocab_embedding(w: torch.Tensor, ids: torch.Tensor, padding_idx: int = -1,
                       scale_grad_by_freq: bool = False, sparse: bool = False) -> torch.Tensor:
    """Embedding split by vocabulary rows: rows outside this shard look up zeros, then the
    lookups are summed over the group (Megatron's vocabulary-parallel embedding)."""
    local = _local(w)
    lo = _mesh(w).get_local_rank() * local.shape[0]
    outside = (ids < lo) | (ids >= lo + local.shape[0])
    pad = padding_idx - lo if 0 <= padding_idx - lo < local.shape[0] else -1
    out = torch.ops.aten.embedding(local, (ids - lo).masked_fill(outside, 0), pad,
                                   scale_grad_by_freq, sparse)
    return ReduceFromTP.apply(out.masked_fill(outside.unsqueeze(-1), 0.0), _group(w))


def tp_embed_dim_embedding(w: torch.Tensor, ids: torch.Tensor, padding_idx: int = -1,
                           scale_grad_by_freq: bool = False, sparse: bool = False) -> torch.Tensor:
    """Embedding split by embedding columns: the lookups all-gathered."""
    out = torch.ops.aten.embedding(_local(w), ids, padding_idx, scale_grad_by_freq, sparse)
    return GatherFromTP.apply(out, _group(w))


# Hugging Face's Conv1D (GPT-2): aten.addmm(bias, input, weight) with an [in, out] weight


def tp_colwise_conv1d(b: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Column-split ``Conv1D`` of a pair (weight split by its columns, the outputs)."""
    return torch.addmm(_local(b), CopyToTP.apply(x, _group(w)), _local(w))


def tp_rowwise_conv1d(b: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Row-split ``Conv1D`` of a pair (weight split by its rows, the inputs): bias once."""
    return ReduceFromTP.apply(x @ _local(w), _group(w)) + _local(b)


def tp_colwise_gather_conv1d(b: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A ``Conv1D`` split alone by its outputs: the output all-gathered."""
    return GatherFromTP.apply(tp_colwise_conv1d(b, x, w), _group(w))


def tp_rowwise_alone_conv1d(b: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A ``Conv1D`` split alone by its inputs: the replicated input sliced to this rank's."""
    width = _local(w).shape[0]
    lo = _mesh(w).get_local_rank() * width
    return tp_rowwise_conv1d(b, CopyToTP.apply(x, _group(w))[..., lo:lo + width], w)


# per-head operands ([..., heads, n, n], whole: a relative position bias) added to split scores


_HEADS_MESH: list[Any] = []  # this process's tensor-parallel mesh (set by the split passes)


def current_tensor_mesh() -> Any:
    """This process's 1-D tensor-parallel mesh (the latest split pass's)."""
    return _HEADS_MESH[-1]


def set_tensor_mesh(mesh: Any) -> None:
    """Record this process's 1-D tensor-parallel mesh (the split passes call it; per-head
    operands are sliced over it)."""
    _HEADS_MESH.append(mesh)


def _local_heads(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` sliced to this rank's heads (as many as ``like``, a split tensor, has), after
    Megatron's ``f``: its gradient is summed over the group (every rank used other heads)."""
    local, mesh = like.shape[-3], _HEADS_MESH[-1]
    if t.shape[-3] == local:
        return t
    return CopyToTP.apply(t, mesh.get_group()).narrow(-3, mesh.get_local_rank() * local, local)


def tp_add_heads_left(a: torch.Tensor, b: Any, alpha: Any = 1) -> torch.Tensor:
    """``a + b`` with ``a`` a whole per-head operand and ``b`` split scores."""
    return torch.add(_local_heads(a, b), b, alpha=alpha)


def tp_add_heads_right(a: Any, b: torch.Tensor, alpha: Any = 1) -> torch.Tensor:
    """``a + b`` with ``a`` split scores and ``b`` a whole per-head operand."""
    return torch.add(a, _local_heads(b, a), alpha=alpha)


def tp_sdpa_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  attn_mask: torch.Tensor | None = None, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Scaled dot-product attention on split heads with a whole per-head ``attn_mask``."""
    mask = None if attn_mask is None else _local_heads(attn_mask, q)
    return F.scaled_dot_product_attention(q, k, v, mask, *args, **kwargs)


def slice_head_operands(gm: fx.GraphModule, graph: Any, layout: TensorLayout) -> None:
    """Make the consumers of the layout's per-head operands (``Pair.sliced``) slice them to
    this rank's heads (their targets change; no node is added, so pieces stay the same)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    for pair in layout.pairs:
        for u, v, _ in pair.sliced:
            n, operand = nodes[graph.name_of(v)], nodes[graph.name_of(u)]
            if "scaled_dot_product_attention" in str(n.target):
                n.target = tp_sdpa_heads
                continue
            at = [j for j, a in enumerate(n.args[:2]) if a is operand]
            if len(at) != 1:
                raise UsageError(f"cannot slice {operand.name} to this rank's heads in {n.name}; "
                                 "use --tp 1")
            n.target = tp_add_heads_left if at[0] == 0 else tp_add_heads_right
    gm.recompile()


# style -> (target, weight shard dim, bias shard dim or None)
_STYLES = {"colwise": (tp_colwise_linear, 0, 0), "rowwise": (tp_rowwise_linear, 1, None),
           "colwise_gather": (tp_colwise_gather_linear, 0, 0),
           "rowwise_alone": (tp_rowwise_alone_linear, 1, None),
           "vocab": (tp_vocab_embedding, 0, None), "embed_dim": (tp_embed_dim_embedding, 1, None)}
_CONV1D_STYLES = {"colwise": (tp_colwise_conv1d, 1, 0), "rowwise": (tp_rowwise_conv1d, 0, None),
                  "colwise_gather": (tp_colwise_gather_conv1d, 1, 0),
                  "rowwise_alone": (tp_rowwise_alone_conv1d, 0, None)}


def split_style(style: str) -> tuple[Any, int, int | None]:
    """The function a Linear or Embedding split in ``style`` runs, and the dimensions
    its weight and bias are sharded along (None: kept whole)."""
    return _STYLES[style]


# ------------------------------------------------------------------------------ the pass


def split_graph(gm: fx.GraphModule, graph: Any, layout: TensorLayout, mesh: Any) -> None:
    """Rewrite ``gm`` (the exported trace whose node names are ``graph``'s) in place so that
    this rank runs its shard of ``layout`` over the 1-D ``mesh`` (see the module docstring)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    sharded: dict[str, tuple[int, int]] = {}
    for s in layout.splits:
        if s.style == "whole":
            continue
        n = nodes[graph.name_of(s.node)]
        conv1d = is_conv1d(graph, s.node)
        target, w_dim, b_dim = (_CONV1D_STYLES if conv1d else _STYLES)[s.style]
        weight_at, bias_at = (2, 0) if conv1d else (0 if s.kind == "embedding" else 1, 2)
        chunks = layout.chunks(s)
        _shard_param(gm, n.args[weight_at], w_dim, mesh, sharded, s.module, chunks)
        if s.kind == "linear" and b_dim is not None and len(n.args) > bias_at and \
                n.args[bias_at] is not None:
            _shard_param(gm, n.args[bias_at], b_dim, mesh, sharded, s.module, chunks)
        n.target = target
    for pair in layout.pairs:
        _local_sizes(gm, graph, pair, nodes, layout.tp)
    set_tensor_mesh(mesh)
    slice_head_operands(gm, graph, layout)


def chunkwise_shard(whole: torch.Tensor, dim: int, chunks: int, size: int,
                    rank: int) -> torch.Tensor:
    """Shard ``rank`` of ``size`` of ``whole`` along ``dim`` when ``dim`` holds ``chunks`` equal
    parts: the rank's ``1/size`` of each part, in order (a view; ``chunks = 1``: a plain
    contiguous shard)."""
    parts = whole.unflatten(dim, (chunks, -1))
    return parts.chunk(size, dim=dim + 1)[rank].flatten(dim, dim + 1)


def _shard_param(gm: fx.GraphModule, node: Any, dim: int, mesh: Any,
                 sharded: dict[str, tuple[int, int]], module: str, chunks: int = 1) -> None:
    """Replace the parameter ``node`` reads by this rank's shard along ``dim`` (a DTensor).
    With ``chunks > 1`` (a fused projection) the rank holds its ``1/tp`` of each of the
    ``chunks`` equal parts of ``dim``, in order (DTensor's ``_StridedShard``, which gathers
    them back into place)."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if not isinstance(node, fx.Node) or node.op != "get_attr":
        raise UsageError(f"cannot split {module}: its weight is computed in the graph, not read "
                         "as a parameter; keep it whole (raise the split threshold) or use --tp 1")
    target = str(node.target)
    if target in sharded:  # a tied weight read by two split calls: one shard for both
        if sharded[target] != (dim, chunks):
            raise UsageError(f"{target} is shared by layers split along different dimensions; "
                             "untie them or use --tp 1")
        return
    owner, _, attr = target.rpartition(".")
    mod = gm.get_submodule(owner) if owner else gm
    whole = getattr(mod, attr)
    size = mesh.size()
    if whole.shape[dim] % (size * chunks):
        raise UsageError(f"{target} has {whole.shape[dim]} rows along dimension {dim}, not a "
                         f"multiple of tp={size}" + (f" x {chunks} chunks" if chunks > 1 else ""))
    chunk = chunkwise_shard(whole.detach(), dim, chunks, size, mesh.get_local_rank()).clone()
    place = _StridedShard(dim, split_factor=chunks) if chunks > 1 else Shard(dim)
    shard = nn.Parameter(DTensor.from_local(chunk, mesh, [place], run_check=False),
                         requires_grad=whole.requires_grad)
    if attr in mod._parameters:
        mod._parameters[attr] = shard
    else:
        setattr(mod, attr, shard)
    sharded[target] = (dim, chunks)


def _local_sizes(gm: fx.GraphModule, graph: Any, pair: Any, nodes: dict[str, fx.Node],
                 tp: int) -> None:
    """Inside a pair, constant sizes that carry the split get the local ones: a reshape's last
    size equal to a split (or chunk) width; a head count among the sizes a reshape changes
    (with grouped-query attention: the query's or the key/value's); a ``split``'s chunk size.
    An ``expand`` keeps every size it does not broadcast (``-1``)."""
    widths: set[int] = set()
    for c, k in zip(pair.columns, pair.chunks or (1,) * len(pair.columns)):
        out = _out_features(graph, c)
        widths |= {out, out // k}
    heads = {w // pair.head_dim for w in widths} if pair.head_dim else set()
    for i in pair.region:
        n = nodes[graph.name_of(i)]
        if n.op != "call_function" or len(n.args) < 2:
            continue
        name, sizes = str(n.target), n.args[1]
        if "split" in name:  # aten.split(x, chunk, dim) / split_with_sizes(x, [chunks], dim)
            new = _divide(sizes, widths, tp) if isinstance(sizes, int) else \
                type(sizes)(_divide(v, widths, tp) for v in sizes)
        elif "expand" in name and isinstance(sizes, (list, tuple)):
            new = _expand_sizes(graph, i, sizes)
        elif any(t in name for t in _SHAPE_TARGETS) and isinstance(sizes, (list, tuple)):
            if graph.attr(i, "shape") == (graph.attr(i, "in_shapes") or [None])[0]:
                # a reshape to its input's own shape: which size is split cannot be seen
                n.target, n.args = torch.ops.aten.alias.default, (n.args[0],)
                continue
            new = _reshape_sizes(graph, i, sizes, widths, heads - {max(pair.chunks or (1,))}, tp)
        else:
            continue
        if new != sizes:
            log.debug("%s: sizes %s -> %s", n.name, sizes, new)
            n.args = (n.args[0], new, *n.args[2:])


def _expand_sizes(graph: Any, i: int, sizes: Any) -> Any:
    """An ``expand``'s sizes with ``-1`` (keep) wherever it does not broadcast."""
    ins = (graph.attr(i, "in_shapes") or [None])[0]
    if not ins:
        return sizes
    lead = len(sizes) - len(ins)
    return type(sizes)(-1 if j >= lead and ins[j - lead] == v and v != 1 else v
                       for j, v in enumerate(sizes))


def _reshape_sizes(graph: Any, i: int, sizes: Any, widths: set[int], heads: set[int],
                   tp: int) -> Any:
    """A reshape's sizes with the split ones divided: the last if a split width, and the
    first head count among the sizes it changes (those not kept from its input at either
    end: not the batch or sequence sizes)."""
    out, ins = graph.attr(i, "shape"), (graph.attr(i, "in_shapes") or [None])[0]
    new = [_divide(v, widths, tp) if j == len(sizes) - 1 else v for j, v in enumerate(sizes)]
    if not heads or not out or not ins or len(out) != len(sizes):
        return type(sizes)(new)
    lo = 0
    while lo < min(len(out), len(ins)) and out[lo] == ins[lo]:
        lo += 1
    hi = len(out)
    while hi > lo and len(ins) - (len(out) - hi) - 1 >= lo and \
            out[hi - 1] == ins[len(ins) - (len(out) - hi) - 1]:
        hi -= 1
    for j in range(lo, hi):
        if isinstance(new[j], int) and new[j] in heads and new[j] % tp == 0:
            new[j] //= tp
            break
    return type(sizes)(new)


def _divide(v: Any, values: set[int], tp: int) -> Any:
    return v // tp if isinstance(v, int) and v in values and v % tp == 0 else v


def _out_features(graph: Any, module: str) -> int:
    """Output features of the Linear (or Conv1D) ``module`` of ``graph``."""
    i = next(i for i in range(graph.num_nodes) if graph.module_of(i) == module
             and graph.op_of(i) in ("linear", "addmm"))
    return int(out_features(graph, i))
