"""Megatron pairing of a layer graph: which layers to split over a tensor-parallel group, and how.

Megatron-LM (Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using
Model Parallelism", 2019, section 3) splits the first weight matrix of an MLP block by columns and
the second by rows, so the element-wise non-linearity between them runs on local shards and the
block needs one all-reduce forward (of its output) and one backward (of its input's gradient). Its
attention block does the same with the query/key/value projections (split by heads) and the output
projection. This module finds those pairs in a captured :class:`~outcore.graph.ir.Graph` from the
dataflow alone, never from module names:

* **region**: starting at a column candidate's output, the connected set of nodes whose ops act on
  the split dimension only element-wise (activations, dropout, arithmetic with scalars, broadcast
  operands) or, once a reshape has split the features into ``(heads, head_dim)``, head-batched
  (matmul, softmax, scaled-dot-product attention, slicing within a head);
* **columns**: every split-candidate ``Linear`` feeding the region (q, k and v; a GLU's gate and
  up projections); **rows**: every ``Linear`` the region feeds. Nothing else may consume the region.

A **fused** projection (one Linear computing q, k and v, or GPT-2's ``Conv1D`` ``c_attn``, or
Phi-3's gate and up projection, whose chunks need no heads) feeds
the region through a split of its output into ``k`` equal chunks (``split`` / ``chunk`` along the
features, or a reshape to ``[..., k, heads, head_dim]``): each rank must hold its share of every
chunk, not one contiguous ``1/tp`` of the rows. Such a pair records ``chunks`` and is found only
where the caller shards rows chunk by chunk (``fused=True``: a plan's split, in the model or in
its exported graph); elsewhere it is not paired. GPT-2's ``Conv1D`` (an ``addmm``
with an ``[in, out]`` weight) is a Linear here, its weight's dimensions swapped.

Linears that do not pair are split alone (column split with an all-gather of the output, or row
split of a replicated input with an all-reduce) or left whole when their parameters are smaller
than a threshold; ``Embedding`` tables are split by vocabulary rows (all-reduce of the lookup).
AxoNN (Singh & Bhatele, IPDPS 2022; Singh et al., SC 2024) splits every layer alone on a grid;
pairing saves its gathers. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np

from outcore.graph.ir import Graph
from outcore.graph.tensor_ties import shared_bytes, untie_conflicts

__all__ = ["Pair", "Split", "TensorLayout", "find_layout", "chunks_of", "is_conv1d", "out_features",
           "HEAD_OPS", "ELEMENTWISE_OPS", "DEFAULT_MIN_SPLIT_BYTES"]

# Layers (pairs: their Linears together) under this many parameter bytes stay whole by default:
# their collectives would cost more than splitting them saves.
DEFAULT_MIN_SPLIT_BYTES = 1 << 20

ELEMENTWISE_OPS = frozenset({
    "gelu", "relu", "tanh", "sigmoid", "silu", "mish", "elu", "leakyrelu", "leaky_relu", "softplus",
    "hardtanh", "relu6", "gelu_new", "newgeluactivation", "geluactivation", "siluactivation",
    "dropout", "identity", "neg", "mul", "add", "sub", "truediv", "div", "pow", "exp", "sqrt",
    "rsqrt", "abs", "clamp", "square", "erf", "reciprocal", "mul_", "add_", "iadd", "imul",
    "contiguous", "clone", "to", "float", "type_as", "_to_copy", "alias", "detach", "dropout_",
    "native_dropout", "lift_fresh_copy", "where", "masked_fill",
})
SHAPE_OPS = frozenset({"view", "reshape", "_unsafe_view", "unflatten", "flatten", "transpose",
                       "permute", "unsqueeze", "squeeze", "expand", "t"})
HEAD_OPS = frozenset({"matmul", "bmm", "baddbmm", "softmax", "_softmax", "log_softmax",
                      "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                      "_scaled_dot_product_efficient_attention",
                      "_scaled_dot_product_flash_attention_for_cpu", "slice", "getitem", "cat",
                      "split", "chunk", "select", "narrow", "split_with_sizes",
                      "repeat_interleave", "unbind"})
_CONST_OPS = frozenset({"param", "constant", "get_attr", "scalar_tensor", "full", "ones",
                        "zeros", "arange", "sym_size", "size"})


@dataclass(frozen=True, kw_only=True)
class Pair:
    """A Megatron pair: column-split Linears feeding row-split Linears through ``region``.

    Attributes:
        columns, rows: module paths of the column- and row-split Linears.
        region: node indices between them (run on local shards).
        heads: number of attention heads split across the group (``None``: an MLP-style pair;
            with grouped-query attention, the key/value heads).
        head_dim: width of one head (``None``: an MLP-style pair).
        param_bytes: parameters of all its Linears, bytes (before splitting).
        out_bytes: bytes of the rows' outputs (the forward all-reduce).
        in_bytes: bytes of the columns' (replicated) input (the backward all-reduce).
        chunks: per column (in ``columns``' order), how many equal chunks its output is split
            into before the heads (1: not fused; 3: a fused q/k/v projection).
        sliced: (operand, consumer, operand bytes) of per-head operands from outside the pair
            (``[..., heads, n, n]``: Swin's and T5's relative position bias added to the
            scores; node indices), which each rank slices to its heads (their gradient summed
            over the group: one all-reduce backward).
    """

    columns: tuple[str, ...]
    rows: tuple[str, ...]
    region: tuple[int, ...]
    heads: int | None
    param_bytes: int
    out_bytes: int
    in_bytes: int
    chunks: tuple[int, ...] = ()
    head_dim: int | None = None
    sliced: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True, kw_only=True)
class Split:
    """How one module is split.

    ``style``: ``colwise`` / ``rowwise`` (inside a pair), ``colwise_gather`` (alone: output
    all-gathered), ``rowwise_alone`` (alone: replicated input sliced, output all-reduced),
    ``vocab`` (Embedding split by rows, lookup all-reduced), ``embed_dim`` (Embedding split by
    columns, output all-gathered) or ``whole`` (replicated; ``reason`` says why).
    """

    module: str
    kind: str
    style: str
    node: int
    param_bytes: int
    in_bytes: int = 0
    out_bytes: int = 0
    pair: int | None = None
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class TensorLayout:
    """The tensor-parallel layout of a graph over ``tp`` ranks: pairs and per-module splits."""

    tp: int
    pairs: tuple[Pair, ...]
    splits: tuple[Split, ...]

    def split(self, module: str) -> Split | None:
        return next((s for s in self.splits if s.module == module), None)

    def chunks(self, s: Split) -> int:
        """Equal chunks of split ``s``'s output features (a fused projection's), else 1."""
        if s.pair is None or s.style != "colwise":
            return 1
        pair = self.pairs[s.pair]
        return pair.chunks[pair.columns.index(s.module)] if pair.chunks else 1

    @property
    def split_modules(self) -> tuple[str, ...]:
        return tuple(s.module for s in self.splits if s.style != "whole")

    def summary(self) -> str:
        """One line per pair and per split: what is split and how (for plan notes and logs)."""
        lines = [f"pair {i}: {', '.join(p.columns)} -> {', '.join(p.rows)}"
                 + (f" ({p.heads} heads)" if p.heads else "")
                 + (f" (fused: {max(p.chunks)} chunks)" if max(p.chunks, default=1) > 1 else "")
                 for i, p in enumerate(self.pairs)]
        lines += [f"{s.module}: {s.style}" + (f" ({s.reason})" if s.reason else "")
                  for s in self.splits if s.pair is None]
        return "\n".join(lines)


# ------------------------------------------------------------------------------ helpers


def _module_type(g: Graph, i: int) -> str:
    return str(g.meta.get("module_types", {}).get(g.module_of(i), ""))


# (op, module type) of the calls that are Linears: ``nn.Linear``, and Hugging Face's ``Conv1D``
# (GPT-2: ``addmm(bias, x, weight)`` with an ``[in, out]`` weight) in an exported graph
_LINEAR = frozenset({("linear", "Linear")})
_LINEARS = _LINEAR | {("addmm", "Conv1D")}


def _candidate(g: Graph, i: int, kind: str, linears: frozenset = _LINEARS) -> bool:
    """Node ``i`` is a call of a real ``nn.Linear`` (or ``Conv1D``, if in ``linears``) /
    ``nn.Embedding`` module."""
    if kind == "linear":
        return (g.op_of(i), _module_type(g, i)) in linears
    return g.op_of(i) == kind and _module_type(g, i) == "Embedding"


def is_conv1d(g: Graph, i: int) -> bool:
    """Node ``i`` calls a ``Conv1D`` (its weight is ``[in, out]``)."""
    return _module_type(g, i) == "Conv1D"


def _shape(g: Graph, i: int) -> list[int] | None:
    s = g.attr(i, "shape")
    return s if isinstance(s, list) and all(isinstance(v, int) for v in s) else None


def _numel(shape: list[int] | None) -> int | None:
    return None if shape is None else prod(shape)


_WEIGHT_DIMS = {"out_features": 0, "in_features": 1, "num_embeddings": 0, "embedding_dim": 1}


def _config(g: Graph, i: int, key: str) -> int | None:
    """A layer hyperparameter of node ``i``: its module's (torch.fx captures), else read off
    its weight's shape (a ``torch.export`` graph calls ``aten.linear`` / ``aten.embedding`` on
    ``param`` nodes: the weight is the 2-D one, ``[out, in]`` / ``[rows, dim]``; a ``Conv1D``'s
    is ``[in, out]``)."""
    value = (g.attr(i, "config") or {}).get(key)
    if isinstance(value, int):
        return value
    weight = _weight_shape(g, i)
    if weight is None or key not in _WEIGHT_DIMS:
        return None
    dim = _WEIGHT_DIMS[key]
    return weight[1 - dim] if is_conv1d(g, i) else weight[dim]


def out_features(g: Graph, i: int) -> int | None:
    """Output features of the Linear (or ``Conv1D``) node ``i`` calls."""
    return _config(g, i, "out_features")


def _param_preds(g: Graph, i: int) -> list[int]:
    return [int(p) for p in g.predecessors(i) if g.op_of(int(p)) == "param"]


def _weight_shape(g: Graph, i: int) -> list[int] | None:
    shapes = [s for p in _param_preds(g, i) for s in [_shape(g, p)] if s and len(s) == 2]
    return shapes[0] if len(shapes) == 1 else None


def _param_bytes(g: Graph, i: int) -> int:
    """Parameter bytes of the layer node ``i`` calls: its own (a module call), those it
    shares with another module (a tied output layer), and those of the ``param`` nodes it
    reads (an ATen call in a ``torch.export`` graph)."""
    return int(g.param_bytes[i]) + int(shared_bytes(g, i)) + \
        int(sum(g.param_bytes[p] for p in _param_preds(g, i)))


def _in_bytes(g: Graph, i: int) -> int:
    preds = [int(p) for p in g.predecessors(i) if g.op_of(int(p)) not in _CONST_OPS]
    return int(max((g.out_bytes[p] for p in preds), default=0))


def _head_view(g: Graph, i: int, width: int, tp: int) -> int | None:
    """Heads ``H`` if node ``i`` reshapes a ``[..., width]`` tensor into ``[..., H, width/H]``
    with ``H`` a multiple of ``tp``."""
    if g.op_of(i) not in ("view", "reshape", "_unsafe_view", "unflatten"):
        return None
    out, ins = _shape(g, i), g.attr(i, "in_shapes") or []
    if out is None or not ins or not ins[0] or ins[0][-1] != width or len(out) < 2 or \
            len(out) != len(ins[0]) + 1:
        return None
    heads, dim = out[-2], out[-1]
    return heads if heads * dim == width and heads % tp == 0 and dim > 1 else None


# ------------------------------------------------------------------------------ regions


@dataclass
class _Walk:
    region: set[int]
    columns: set[int]
    rows: set[int]
    ok: bool = True
    why: str = ""
    sliced: list[tuple[int, int]] = field(default_factory=list)


# ops that may add a per-head operand (``[..., heads, n, n]``: a relative position bias) to
# split attention scores: the runtime slices the operand to the rank's heads
HEAD_OPERAND_OPS = frozenset({"add", "add_", "iadd", "scaled_dot_product_attention"})


def _spans_heads(g: Graph, u: int, v: int, heads: int | None) -> bool:
    """Does ``u``, broadcast against ``v`` (dimensions aligned from the right), have a
    dimension of ``heads`` where ``v`` may hold its heads (the second or third from the end:
    ``[.., heads, n, n]`` scores, ``[.., heads, head_dim]`` values), so it differs per head?"""
    su, sv = _shape(g, u), _shape(g, v)
    if not heads or heads <= 1 or su is None or sv is None:
        return False
    return any(len(su) >= k and len(sv) >= k and su[-k] == sv[-k] == heads for k in (2, 3))


def _head_operand(g: Graph, u: int, v: int, heads: int | None) -> bool:
    """May ``u`` (outside the region, not split) feed ``v`` as a per-head operand that each
    rank slices to its heads? Its size before the last two is the head count."""
    su = _shape(g, u)
    return heads is not None and heads > 1 and su is not None and len(su) >= 3 and \
        su[-3] == heads and g.op_of(v) in HEAD_OPERAND_OPS


def _external_ok(g: Graph, u: int, v: int, heads_mode: bool) -> bool:
    """May node ``u`` (outside the region) feed region node ``v``? Constants always; otherwise
    only a broadcast operand that does not span the split dimension."""
    if g.op_of(u) in _CONST_OPS and g.op_of(u) != "param":
        return True
    if g.out_bytes[u] == 0 and _shape(g, u) is None:  # not a tensor (sizes read off x.shape)
        return True
    su, sv = _shape(g, u), _shape(g, v)
    if su is None or sv is None:
        return False
    if not heads_mode:  # split dimension is the last one
        return len(su) == 0 or su[-1] == 1 and len(sv) > 0 and sv[-1] != 1
    nu, nv = _numel(su), _numel(sv)
    return nu is not None and nv is not None and nu * 2 <= nv and len(su) < len(sv) or \
        (len(su) == len(sv) and len(sv) in (3, 4) and su[-3] == 1)  # a mask: [b, 1, n, n]


def _walk(g: Graph, start: int, used: set[int], tp: int, linears: frozenset) -> _Walk:
    """Grow the region from column candidate ``start`` (see the module docstring)."""
    w = _Walk(set(), {start}, set())
    todo = [int(s) for s in g.successors(start)]
    pending_externals: list[tuple[int, int]] = []
    while todo and w.ok:
        v = todo.pop()
        if v in w.region or v in w.rows:
            continue
        if _candidate(g, v, "linear", linears):
            if v in used or v in w.columns:
                w.ok, w.why = False, f"{g.name_of(v)} already split"
                break
            w.rows.add(v)
            continue
        op = g.op_of(v)
        if op not in ELEMENTWISE_OPS and op not in SHAPE_OPS and op not in HEAD_OPS:
            w.ok, w.why = False, f"{g.name_of(v)} ({op}) consumes the split tensor"
            break
        w.region.add(v)
        todo.extend(int(s) for s in g.successors(v))
        for u in (int(p) for p in g.predecessors(v)):
            if u in w.region or u in w.columns:
                continue
            if _candidate(g, u, "linear", linears) and u not in used and u not in w.rows:
                w.columns.add(u)
                todo.extend(int(s) for s in g.successors(u))
            elif g.op_of(u) in ELEMENTWISE_OPS | SHAPE_OPS | HEAD_OPS and \
                    _numel(_shape(g, u)) is not None and \
                    (_numel(_shape(g, u)) == _numel(_shape(g, v)) or g.op_of(v) == "expand"):
                # a same-size operand chain (k's transpose), or the key/value heads that
                # grouped-query attention repeats: absorb it
                todo.append(u)
                pending_externals.append((u, v))
            else:
                pending_externals.append((u, v))
    if not w.ok:
        return w
    heads = _heads(g, w, tp)
    needs_heads = any(g.op_of(v) in HEAD_OPS and not _feature_chunk(g, v, w.columns)
                      for v in w.region)
    for u, v in pending_externals:
        if u in w.region or u in w.columns:
            continue
        if _head_operand(g, u, v, heads):  # (before the broadcast rule: [h, 1, n] spans heads)
            w.sliced.append((u, v))
            continue
        if _external_ok(g, u, v, heads is not None) and not _spans_heads(g, u, v, heads):
            continue
        w.ok, w.why = False, f"{g.name_of(u)} feeds {g.name_of(v)} unsplit"
        return w
    if not w.rows:
        w.ok, w.why = False, "no row-split partner"
    elif needs_heads and heads is None:
        w.ok, w.why = False, "head-batched ops without a head split divisible by tp"
    else:
        uneven = [v for v in w.region if g.op_of(v) in _CHUNK_OPS and not _parts_divide(g, v, tp)]
        if uneven:  # Falcon's multi-query q/k/v: its heads split [heads, 1, 1]
            w.ok, w.why = False, f"{g.name_of(uneven[0])} splits into parts not divisible by tp"
    return w


def _feature_chunk(g: Graph, v: int, columns: set[int]) -> bool:
    """Is ``v`` the cut of a fused column's output into its equal feature chunks (Phi-3's
    ``gate_up_proj(x).chunk(2, -1)``), or one chunk of it? It needs no heads: each rank cuts
    its rows of every chunk the same way."""
    op = g.op_of(v)
    if op == "getitem":
        return any(_feature_chunk(g, int(u), columns) for u in g.predecessors(v))
    return op in _CHUNK_OPS and any(int(c) in columns and chunks_of(g, int(c)) > 1
                                    for c in g.predecessors(v))


def _parts_divide(g: Graph, v: int, tp: int) -> bool:
    """Whether every part a split node ``v`` makes divides by ``tp`` along the dimension it
    splits (True where its shapes are not known)."""
    parts, ins = g.attr(v, "shape"), (g.attr(v, "in_shapes") or [None])[0]
    if not ins or not isinstance(parts, list) or \
            not all(isinstance(x, list) and len(x) == len(ins) for x in parts):
        return True
    dims = [d for d in range(len(ins)) if any(x[d] != ins[d] for x in parts)]
    return all(x[d] % tp == 0 for x in parts for d in dims)


def _fused_head_view(g: Graph, i: int, width: int, chunks: int, tp: int) -> int | None:
    """Heads ``H`` if node ``i`` reshapes a fused ``[..., width]`` projection into
    ``[..., chunks, H, width / (chunks H)]`` with ``H`` a multiple of ``tp``."""
    if chunks <= 1 or g.op_of(i) not in ("view", "reshape", "_unsafe_view", "unflatten"):
        return None
    out, ins = _shape(g, i), g.attr(i, "in_shapes") or []
    if out is None or not ins or not ins[0] or ins[0][-1] != width or len(out) < 3 or \
            len(out) != len(ins[0]) + 2 or out[-3] != chunks:
        return None
    heads, dim = out[-2], out[-1]
    return heads if chunks * heads * dim == width and heads % tp == 0 and dim > 1 else None


_CHUNK_OPS = frozenset({"split", "split_with_sizes", "chunk"})


def chunks_of(g: Graph, c: int) -> int:
    """Into how many equal chunks Linear ``c``'s output is cut along its features before any
    other use (1: none): a ``split`` / ``chunk`` into equal parts (GPT-2's
    ``c_attn(x).split(width, 2)``), or a reshape to ``[..., k, heads, head_dim]`` (a fused
    q/k/v projection reshaped at once), reached through reshapes that keep the features."""
    width = _config(g, c, "out_features")
    todo, seen = [int(s) for s in g.successors(c)], set()
    while width and todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        op, shape = g.op_of(v), g.attr(v, "shape")
        if op in _CHUNK_OPS:
            parts = shape if isinstance(shape, list) and len(shape) > 1 and \
                all(isinstance(x, list) and x for x in shape) else []
            return len(parts) if parts and all(x[-1] * len(parts) == width for x in parts) else 1
        out = _shape(g, v)
        if op not in SHAPE_OPS or not out:
            continue
        if len(out) >= 3 and out[-3] > 1 and out[-3] * out[-2] * out[-1] == width and \
                _fused_head_view(g, v, width, out[-3], 1):
            return out[-3]
        if out[-1] == width:
            todo.extend(int(s) for s in g.successors(v))
    return 1


def _heads(g: Graph, w: _Walk, tp: int) -> int | None:
    """The fewest heads a column's output is viewed as (grouped-query attention: the key and
    value projections' head count)."""
    found = [h for h, _ in _head_views(g, w, tp)]
    return min(found) if found else None


def _head_dim(g: Graph, w: _Walk, tp: int) -> int | None:
    dims = {width // h for h, width in _head_views(g, w, tp)}
    return dims.pop() if len(dims) == 1 else None


def _head_views(g: Graph, w: _Walk, tp: int) -> list[tuple[int, int]]:
    """(heads, chunk width) of every head view of a column's output in the region."""
    found = []
    for c in w.columns:
        width, k = _config(g, c, "out_features"), chunks_of(g, c)
        if not width:
            continue
        for v in sorted(w.region):
            h = _head_view(g, v, width // k, tp) or _fused_head_view(g, v, width, k, tp)
            if h:
                found.append((h, width // k))
    return found


def _pair_ok(g: Graph, w: _Walk, tp: int) -> str:
    """Why the walk cannot be split ``tp`` ways ('' if it can)."""
    for c in w.columns:  # every head view of every column (GQA: the key/value heads too)
        width, k = _config(g, c, "out_features"), chunks_of(g, c)
        for v in w.region:
            if width and (_head_view(g, v, width // k, 1) or
                          _fused_head_view(g, v, width, k, 1)) and \
                    not (_head_view(g, v, width // k, tp) or
                         _fused_head_view(g, v, width, k, tp)):
                return f"{g.module_of(c)}'s heads are not a multiple of {tp}"
    for v in w.region:  # (recorded by torch.fx captures; an exported graph's are constants)
        computed = set(g.attr(v, "computed_sizes") or ())
        out, ins = _shape(g, v), (g.attr(v, "in_shapes") or [[]])[0]
        into_heads = out is not None and ins is not None and len(out) > len(ins)
        if computed & ({-1, -2} if into_heads else {-1}):
            return (f"{g.name_of(v)} reshapes to a head count or width computed from its "
                    "input's shape, which the split cannot divide")
    for c in w.columns:
        features = _config(g, c, "out_features")
        if not features or features % tp:
            return f"{g.module_of(c)} has {features} output features, not a multiple of {tp}"
    for r in w.rows:
        inp = _config(g, r, "in_features")
        if not inp or inp % tp:
            return f"{g.module_of(r)} has {inp} input features, not a multiple of {tp}"
        if any(int(p) not in w.region and int(p) not in w.columns
               and g.op_of(int(p)) not in _CONST_OPS for p in g.predecessors(r)):
            return f"{g.module_of(r)} also reads an unsplit tensor"
    return ""


# ------------------------------------------------------------------------------ layout


def find_layout(g: Graph, tp: int, *, min_split_bytes: int = DEFAULT_MIN_SPLIT_BYTES,
                min_pair_bytes: int | None = None, fused: bool = False,
                conv1d: bool = False) -> TensorLayout:
    """The tensor-parallel layout of ``g`` over ``tp`` ranks.

    Args:
        g: a captured graph (``outcore.capture``; shapes make attention pairs findable).
        tp: tensor-parallel degree (>= 1).
        min_pair_bytes: pairs whose Linears together hold fewer parameter bytes stay whole
            (default: ``min_split_bytes``).
        min_split_bytes: Linears (pairs: all their Linears together) and Embeddings with
            fewer parameter bytes stay whole: their collectives would cost more than they save.
        fused: pair fused projections (only where the caller shards their rows chunk by
            chunk: plans do, see the module docstring).
        conv1d: split Hugging Face ``Conv1D`` layers too (only where the caller splits their
            ``addmm`` calls: a plan's exported-graph split; DTensor's styles take only
            ``nn.Linear``).
    """
    kinds = _LINEARS if conv1d else _LINEAR
    # only nodes of these ops can be candidates (read from the graph's op index, not node by
    # node: a 50k-node graph without a Linear took 17 ms per degree the search tried)
    ops = np.sort(np.concatenate([g.nodes_with_op(op) for op in {op for op, _ in kinds}]))
    linears = [i for i in ops.tolist() if _candidate(g, i, "linear", kinds)]
    embeds = [i for i in g.nodes_with_op("embedding").tolist() if _candidate(g, i, "embedding")]
    calls: dict[str, int] = {}
    for i in linears + embeds:
        calls[g.module_of(i)] = calls.get(g.module_of(i), 0) + 1
    reused = {m for m, c in calls.items() if c > 1}
    used: set[int] = {i for i in linears if g.module_of(i) in reused}
    pairs: list[Pair] = []
    splits: list[Split] = []
    for i in linears:
        if i in used or tp <= 1:
            continue
        w = _walk(g, i, used, tp, kinds)
        if not w.ok or _pair_ok(g, w, tp):
            continue
        pb = sum(_param_bytes(g, j) for j in w.columns | w.rows)
        if pb < (min_split_bytes if min_pair_bytes is None else min_pair_bytes):
            continue
        chunks = tuple(chunks_of(g, c) for c in sorted(w.columns))
        if max(chunks) > 1 and not fused:
            continue  # its fused projection is split alone below (output gathered)
        k = len(pairs)
        pairs.append(Pair(columns=tuple(g.module_of(c) for c in sorted(w.columns)),
                          rows=tuple(g.module_of(r) for r in sorted(w.rows)),
                          region=tuple(sorted(w.region)), heads=_heads(g, w, tp),
                          head_dim=_head_dim(g, w, tp),
                          param_bytes=pb, out_bytes=int(sum(g.out_bytes[r] for r in w.rows)),
                          in_bytes=max(_in_bytes(g, c) for c in w.columns), chunks=chunks,
                          sliced=tuple((u, v, int(g.out_bytes[u]))
                                       for u, v in sorted(set(w.sliced)))))
        for j, style in [(c, "colwise") for c in w.columns] + [(r, "rowwise") for r in w.rows]:
            splits.append(_split(g, j, "linear", style, pair=k))
        used |= w.columns | w.rows
    for i in linears:
        if i not in used:
            splits.append(_alone(g, i, tp, min_split_bytes, reused))
            used.add(i)
    seen: set[str] = set()
    for i in embeds:
        if g.module_of(i) not in seen:
            seen.add(g.module_of(i))
            splits.append(_embedding(g, i, tp, min_split_bytes, reused))
    splits.sort(key=lambda s: s.node)
    return untie_conflicts(g, TensorLayout(tp=tp, pairs=tuple(pairs), splits=tuple(splits)))


def _split(g: Graph, i: int, kind: str, style: str, **kw: Any) -> Split:
    return Split(module=g.module_of(i), kind=kind, style=style, node=i,
                 param_bytes=_param_bytes(g, i), in_bytes=_in_bytes(g, i),
                 out_bytes=int(g.out_bytes[i]), **kw)


def _alone(g: Graph, i: int, tp: int, min_bytes: int, reused: set[str]) -> Split:
    out, inp = _config(g, i, "out_features"), _config(g, i, "in_features")
    if tp <= 1:
        return _split(g, i, "linear", "whole", reason="tp = 1")
    if g.module_of(i) in reused:
        return _split(g, i, "linear", "whole", reason="called more than once")
    if _param_bytes(g, i) < min_bytes:
        return _split(g, i, "linear", "whole", reason=f"{_param_bytes(g, i)} B < threshold")
    if out and out % tp == 0:
        return _split(g, i, "linear", "colwise_gather")
    if inp and inp % tp == 0:
        return _split(g, i, "linear", "rowwise_alone")
    return _split(g, i, "linear", "whole", reason=f"{inp}x{out} not divisible by {tp}")


def _embedding(g: Graph, i: int, tp: int, min_bytes: int, reused: set[str]) -> Split:
    rows, dim = _config(g, i, "num_embeddings"), _config(g, i, "embedding_dim")
    if tp <= 1:
        return _split(g, i, "embedding", "whole", reason="tp = 1")
    if _param_bytes(g, i) < min_bytes:
        return _split(g, i, "embedding", "whole",
                      reason=f"{_param_bytes(g, i)} B < threshold")
    if rows and rows % tp == 0:
        return _split(g, i, "embedding", "vocab")
    if dim and dim % tp == 0:
        return _split(g, i, "embedding", "embed_dim")
    return _split(g, i, "embedding", "whole", reason=f"{rows}x{dim} not divisible by {tp}")
