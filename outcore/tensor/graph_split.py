"""Tensor parallelism at the graph level, for models captured through ``torch.export``.

A plan's pieces are cut from the model's traced graph. A torch.fx trace calls each ``nn.Linear``
as a module, so DTensor's ``parallelize_module`` (:func:`outcore.tensor.parallel.split_for_plan`)
acts inside the pieces through the module's hooks. A ``torch.export`` graph (Hugging Face LMs)
calls ``aten.linear`` / ``aten.embedding`` on the weights directly: no module hook runs, and
torch.export cannot re-capture a DTensor-parallelised model either (checked with torch 2.14:
"non-fx-graphable type DTensorSpec"). So the split is written into the exported graph itself,
node for node (the node names, and so the plan's pieces, stay the same):

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
* constant sizes of reshapes inside a pair that carry the head count or the split width are
  divided by ``tp`` (HF code mostly reshapes with ``-1``, which needs nothing).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
from torch import nn
from torch.nn import functional as F

from outcore.errors import UsageError
from outcore.graph.tensor_pairs import TensorLayout

log = logging.getLogger(__name__)

__all__ = ["split_graph", "tp_colwise_linear", "tp_rowwise_linear", "tp_colwise_gather_linear",
           "tp_rowwise_alone_linear", "tp_vocab_embedding", "tp_embed_dim_embedding"]

_SHAPE_TARGETS = ("view", "reshape", "_unsafe_view", "expand")


# ------------------------------------------------------------------------------ collectives


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t)


def _all_reduce(t: torch.Tensor, group: Any) -> torch.Tensor:
    out = t.contiguous().clone()
    if not _is_fake(out):  # shape propagation (FakeTensorMode) runs no collective
        dist.all_reduce(out, group=group)
    return out


class _CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather along the last dimension forward; this rank's slice of the gradient back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.rank, ctx.width = rank, x.shape[-1]
        x = x.contiguous()
        if _is_fake(x):
            return torch.cat([x] * size, dim=-1)
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        lo = ctx.rank * ctx.width
        return grad[..., lo:lo + ctx.width].contiguous(), None


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.to_local() if t is not None and hasattr(t, "to_local") else t


def _group(w: torch.Tensor) -> Any:
    return w.device_mesh.get_group()


# ------------------------------------------------------------------------------ split calls
# (graph targets: aten.linear(input, weight, bias=None), aten.embedding(weight, indices, ...))


def tp_colwise_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """Column-split Linear of a pair: replicated input, output features sharded."""
    return F.linear(_CopyToTP.apply(x, _group(w)), _local(w), _local(b))


def tp_rowwise_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """Row-split Linear of a pair: sharded input, output summed over the group, bias once."""
    y = _ReduceFromTP.apply(F.linear(x, _local(w)), _group(w))
    return y if b is None else y + _local(b)


def tp_colwise_gather_linear(x: torch.Tensor, w: torch.Tensor,
                             b: torch.Tensor | None = None) -> torch.Tensor:
    """A Linear split alone by columns: its output all-gathered."""
    return _GatherFromTP.apply(tp_colwise_linear(x, w, b), _group(w))


def tp_rowwise_alone_linear(x: torch.Tensor, w: torch.Tensor,
                            b: torch.Tensor | None = None) -> torch.Tensor:
    """A Linear split alone by rows: the replicated input sliced to this rank's features."""
    width = _local(w).shape[1]
    lo = w.device_mesh.get_local_rank() * width
    x = _CopyToTP.apply(x, _group(w))[..., lo:lo + width]
    return tp_rowwise_linear(x, w, b)


def tp_vocab_embedding(w: torch.Tensor, ids: torch.Tensor, padding_idx: int = -1,
                       scale_grad_by_freq: bool = False, sparse: bool = False) -> torch.Tensor:
    """Embedding split by vocabulary rows: rows outside this shard look up zeros, then the
    lookups are summed over the group (Megatron's vocabulary-parallel embedding)."""
    local = _local(w)
    lo = w.device_mesh.get_local_rank() * local.shape[0]
    outside = (ids < lo) | (ids >= lo + local.shape[0])
    pad = padding_idx - lo if 0 <= padding_idx - lo < local.shape[0] else -1
    out = torch.ops.aten.embedding(local, (ids - lo).masked_fill(outside, 0), pad,
                                   scale_grad_by_freq, sparse)
    return _ReduceFromTP.apply(out.masked_fill(outside.unsqueeze(-1), 0.0), _group(w))


def tp_embed_dim_embedding(w: torch.Tensor, ids: torch.Tensor, padding_idx: int = -1,
                           scale_grad_by_freq: bool = False, sparse: bool = False) -> torch.Tensor:
    """Embedding split by embedding columns: the lookups all-gathered."""
    out = torch.ops.aten.embedding(_local(w), ids, padding_idx, scale_grad_by_freq, sparse)
    return _GatherFromTP.apply(out, _group(w))


# style -> (target, weight shard dim, bias shard dim or None)
_STYLES = {"colwise": (tp_colwise_linear, 0, 0), "rowwise": (tp_rowwise_linear, 1, None),
           "colwise_gather": (tp_colwise_gather_linear, 0, 0),
           "rowwise_alone": (tp_rowwise_alone_linear, 1, None),
           "vocab": (tp_vocab_embedding, 0, None), "embed_dim": (tp_embed_dim_embedding, 1, None)}


# ------------------------------------------------------------------------------ the pass


def split_graph(gm: fx.GraphModule, graph: Any, layout: TensorLayout, mesh: Any) -> None:
    """Rewrite ``gm`` (the exported trace whose node names are ``graph``'s) in place so that
    this rank runs its shard of ``layout`` over the 1-D ``mesh`` (see the module docstring)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    sharded: dict[str, int] = {}
    for s in layout.splits:
        if s.style == "whole":
            continue
        n = nodes[graph.name_of(s.node)]
        target, w_dim, b_dim = _STYLES[s.style]
        weight_at = 0 if s.kind == "embedding" else 1
        _shard_param(gm, n.args[weight_at], w_dim, mesh, sharded, s.module)
        if s.kind == "linear" and b_dim is not None and len(n.args) > 2 and n.args[2] is not None:
            _shard_param(gm, n.args[2], b_dim, mesh, sharded, s.module)
        n.target = target
    for pair in layout.pairs:
        _local_sizes(gm, graph, pair, nodes, layout.tp)
    gm.recompile()


def _shard_param(gm: fx.GraphModule, node: Any, dim: int, mesh: Any, sharded: dict[str, int],
                 module: str) -> None:
    """Replace the parameter ``node`` reads by this rank's shard along ``dim`` (a DTensor)."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(node, fx.Node) or node.op != "get_attr":
        raise UsageError(f"cannot split {module}: its weight is computed in the graph, not read "
                         "as a parameter; keep it whole (raise the split threshold) or use --tp 1")
    target = str(node.target)
    if target in sharded:  # a tied weight read by two split calls: one shard for both
        if sharded[target] != dim:
            raise UsageError(f"{target} is shared by layers split along different dimensions; "
                             "untie them or use --tp 1")
        return
    owner, _, attr = target.rpartition(".")
    mod = gm.get_submodule(owner) if owner else gm
    whole = getattr(mod, attr)
    size = mesh.size()
    if whole.shape[dim] % size:
        raise UsageError(f"{target} has {whole.shape[dim]} rows along dimension {dim}, not a "
                         f"multiple of tp={size}")
    chunk = whole.detach().chunk(size, dim=dim)[mesh.get_local_rank()].clone()
    shard = nn.Parameter(DTensor.from_local(chunk, mesh, [Shard(dim)], run_check=False),
                         requires_grad=whole.requires_grad)
    if attr in mod._parameters:
        mod._parameters[attr] = shard
    else:
        setattr(mod, attr, shard)
    sharded[target] = dim


def _local_sizes(gm: fx.GraphModule, graph: Any, pair: Any, nodes: dict[str, fx.Node],
                 tp: int) -> None:
    """Inside a pair, a reshape to a constant head count or split width gets the local one."""
    # (a DTensor's shape is the whole tensor's)
    widths = {int(gm.get_parameter(str(_weight_node(nodes, graph, c).target)).shape[0])
              for c in _column_nodes(graph, pair)}
    values = set(widths)
    if pair.heads:
        head_dim = max(widths) // pair.heads
        values |= {w // head_dim for w in widths}
    for i in pair.region:
        n = nodes[graph.name_of(i)]
        if n.op != "call_function" or not any(t in str(n.target) for t in _SHAPE_TARGETS) or \
                len(n.args) < 2 or not isinstance(n.args[1], (list, tuple)):
            continue
        sizes = [v // tp if isinstance(v, int) and v in values and v % tp == 0 else v
                 for v in n.args[1]]
        if sizes != list(n.args[1]):
            log.debug("%s: sizes %s -> %s", n.name, list(n.args[1]), sizes)
            n.args = (n.args[0], type(n.args[1])(sizes), *n.args[2:])


def _column_nodes(graph: Any, pair: Any) -> list[int]:
    cols = set(pair.columns)
    return [i for i in range(graph.num_nodes) if graph.op_of(i) == "linear"
            and graph.module_of(i) in cols]


def _weight_node(nodes: dict[str, fx.Node], graph: Any, i: int) -> fx.Node:
    return nodes[graph.name_of(i)].args[1]
