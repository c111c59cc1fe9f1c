"""In-place operations in a traced graph: which nodes write into their first argument, and the
order they impose on later readers.

An fx graph records ``random_tensor.div_(keep_prob); return x * random_tensor`` (timm's
DropPath) with ``mul`` reading ``bernoulli_``'s node, not ``div_``'s: in one process the
program order makes ``mul`` see the divided tensor, but cut into pieces, a piece that reads the
tensor from elsewhere (or a copy a writing piece made) would see it undivided.
:func:`thread_in_place` makes the order an edge of the graph: every reader after an in-place op
reads the op's result (the same tensor), so the partition, the profiler and the runtime all
see it.

A write through a view of an exported (ATen) graph (Pegasus-X's positional table: ``pe =
zeros(...); pe[:, :32] = sin(...); pe[:, 32:] = cos(...); return pe[None]``) changes the base
tensor, which the graph does not show: the reader of ``pe`` depends on ``zeros`` alone, and a
partition put it before the writes (the table stayed zeros on two devices). There the base's
later readers read :func:`written_base` instead: a copy of the base with the view's part set
to what was written, an edge from the write. In one process it equals the base (which holds
the write already); cut into pieces it holds the write wherever it runs. Writes through a view
of a torch.fx graph (``x.view(...).mul_(2)``, then ``x`` read) stay ordered only inside one
piece.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch import nn

__all__ = ["setitem_", "thread_in_place", "writes_first_arg", "written_base"]

# Python operators that write into their first argument; all but setitem return it
_WRITING_OPERATORS = ("iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand",
                      "ior", "ixor", "ilshift", "irshift", "imatmul", "setitem")


def writes_first_arg(n: fx.Node, root: nn.Module) -> bool:
    """Whether ``n`` may write into a tensor it is given (its first argument, as a rule)."""
    if n.op not in ("call_function", "call_method", "call_module"):
        return False
    if n.kwargs.get("inplace"):
        return True
    if n.op == "call_module":
        try:
            return bool(getattr(root.get_submodule(str(n.target)), "inplace", False))
        except AttributeError:
            return False
    if isinstance(n.target, torch._ops.OpOverload):  # ATen (torch.export): the schema says
        args = n.target._schema.arguments
        return bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return name.endswith("_") and not name.endswith("__") or name in _WRITING_OPERATORS


def setitem_(x, index, value):
    """``x[index] = value``, returning ``x`` (what a traced ``operator.setitem`` becomes, so that
    later readers of ``x`` can read it)."""
    x[index] = value
    return x


def _returns_first_arg(n: fx.Node) -> bool:
    """Whether ``n``'s result is the tensor it wrote (``x.add_(1)`` is ``x``; asked only of
    nodes that write, and a traced ``x[i] = v`` is :func:`setitem_` by then): ATen ops by
    their schema; torch's functions, operators and tensor methods by the ``_`` convention; a
    user's function whose name ends in ``_`` may return anything, so it is not threaded."""
    if isinstance(n.target, torch._ops.OpOverload):
        rets = n.target._schema.returns
        return len(rets) == 1 and rets[0].alias_info is not None and rets[0].alias_info.is_write
    if n.op == "call_function":
        module = getattr(n.target, "__module__", None) or ""
        return module.split(".")[0] in ("torch", "_operator", "operator") \
            or n.target is setitem_
    return True


def thread_in_place(graph: fx.Graph, root: nn.Module) -> int:
    """Make every node that reads a tensor after an in-place op wrote it read the op's result.

    Only direct writes (the written tensor is the op's first argument) are threaded; a traced
    ``x[i] = v`` becomes :func:`setitem_`, which returns ``x``. Returns how many uses were
    moved."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    moved = 0
    for w in list(graph.nodes):
        if w.op == "call_function" and w.target is operator.setitem:
            w.target = setitem_
        if not w.args or not isinstance(w.args[0], fx.Node) or not writes_first_arg(w, root) \
                or not _returns_first_arg(w):
            continue
        x = w.args[0]
        for r in list(x.users):
            if r is not w and order[r] > order[w]:
                r.replace_input_with(x, w)
                moved += 1
    return moved + _thread_view_writes(graph, root)


def written_base(base: torch.Tensor, value: torch.Tensor, chain: tuple) -> torch.Tensor:
    """``base`` with the part that ``chain`` views (``((op name, args, kwargs), ...)``, ATen
    view ops from the base down) set to ``value``: a new tensor, differentiable in both."""
    out = base.clone()
    view = out
    for name, args, kwargs in chain:
        view = _aten_op(name)(view, *args, **kwargs)
    view.copy_(value)
    return out


def _aten_op(name: str) -> torch._ops.OpOverload:
    space, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, space), op), overload)


def _aliasing_view(n: fx.Node) -> bool:
    """An ATen op whose result is a view of its first argument (slice, select, view,
    unsqueeze, transpose, expand, ...), writing nothing."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return False
    schema = n.target._schema
    if not schema.arguments or len(schema.returns) != 1:
        return False
    arg, ret = schema.arguments[0].alias_info, schema.returns[0].alias_info
    return arg is not None and ret is not None and not arg.is_write and not ret.is_write \
        and isinstance(n.args[0], fx.Node)


def _thread_view_writes(graph: fx.Graph, root: nn.Module) -> int:
    """For each ATen write into a view of another node's tensor (in graph order), make the
    base's readers after it read :func:`written_base` (see the module docstring). Returns how
    many uses were moved."""
    moved = 0
    latest: dict[fx.Node, fx.Node] = {}  # base -> the node holding its newest value
    order: dict[fx.Node, float] = {n: i for i, n in enumerate(graph.nodes)}
    for w in list(graph.nodes):
        if not isinstance(w.target, torch._ops.OpOverload) or not w.args \
                or not isinstance(w.args[0], fx.Node) or not writes_first_arg(w, root) \
                or not _returns_first_arg(w):
            continue
        chain, base = [], w.args[0]
        while _aliasing_view(base):
            chain.append((str(base.target), tuple(base.args[1:]), dict(base.kwargs)))
            base = base.args[0]
        if not chain:
            continue  # a direct write: threaded above
        current = latest.get(base, base)
        readers = [r for v in dict.fromkeys((base, current)) for r in v.users
                   if order[r] > order[w]]
        if not readers:
            continue
        with graph.inserting_after(w):
            new = graph.call_function(written_base, (current, w, tuple(reversed(chain))))
        order[new] = order[w] + 0.5  # right after the write, before the next node
        for r in readers:
            for v in (base, current):
                if v in r.all_input_nodes:
                    r.replace_input_with(v, new)
                    moved += 1
        latest[base] = new
    return moved
