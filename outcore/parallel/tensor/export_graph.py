"""A layer graph from ``torch.export`` for models torch.fx cannot trace (Hugging Face LMs).

``torch.export.export(..., strict=False)`` records every aten op with the module stack it ran in
(``nn_module_stack``), so a call of ``aten.linear`` inside an ``nn.Linear`` is that layer. This
builds the same :class:`~outcore.graph.ir.Graph` fields the tensor-parallel pairing reads (ops,
module paths and types, shapes, parameter and output bytes); it is not a costed graph.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
from torch import nn

from outcore.errors import CaptureError
from outcore.graph.ir import Graph, build

log = logging.getLogger(__name__)

_CONFIG = ("in_features", "out_features", "num_embeddings", "embedding_dim")


def _op(node: torch.fx.Node) -> str:
    if node.op == "placeholder":
        return "input"
    if node.op == "output":
        return "output"
    target = node.target
    if target is operator.getitem:
        return "getitem"
    name = getattr(target, "_opname", None) or getattr(target, "__name__", str(target))
    return str(name).split(".")[0]


def _path(node: torch.fx.Node, known: set[str]) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    for path, _typ in reversed(list(stack.values())):
        path = str(path).removeprefix("L['self'].").removeprefix("L__self__.")
        if path in known:
            return path
    return ""


def _val_shape(value: Any) -> list[int] | None:
    if isinstance(value, torch.Tensor):
        try:
            return [int(v) for v in value.shape]
        except TypeError:  # symbolic sizes
            return None
    return None


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return 0


def graph_from_export(model: nn.Module, inputs: tuple[Any, ...]) -> Graph:
    """Export ``model`` on ``inputs`` (non-strict) and return its op-level :class:`Graph`."""
    try:
        ep = torch.export.export(model, inputs, strict=False)
    except Exception as e:
        raise CaptureError(f"neither torch.fx nor torch.export can capture "
                           f"{type(model).__name__}: {type(e).__name__}: "
                           f"{str(e).splitlines()[0][:200] if str(e) else ''}; pass a model "
                           "whose forward torch.export accepts (e.g. use_cache=False)") from e
    modules = dict(model.named_modules())
    known = set(modules)
    sig = ep.graph_signature
    param_of = dict(sig.inputs_to_parameters)
    buffer_of = dict(sig.inputs_to_buffers) | dict(
        getattr(sig, "inputs_to_lifted_tensor_constants", {}))
    nodes = list(ep.graph.nodes)
    index = {n.name: i for i, n in enumerate(nodes)}
    names, ops, paths, attrs, pbytes, obytes, src, dst, eb = [], [], [], [], [], [], [], [], []
    charged: set[str] = set()
    for n in nodes:
        op = _op(n)
        path = _path(n, known)
        if n.op == "placeholder" and n.name in param_of:
            op, path = "param", param_of[n.name].rpartition(".")[0]
        elif n.op == "placeholder" and n.name in buffer_of:
            op = "constant"
        extra: dict[str, Any] = {"shape": _val_shape(n.meta.get("val"))}
        extra["in_shapes"] = [s for a in n.all_input_nodes
                              for s in [_val_shape(a.meta.get("val"))] if s is not None]
        own = 0
        if op in ("linear", "embedding") and path in modules:
            mod = modules[path]
            extra["config"] = {k: getattr(mod, k) for k in _CONFIG
                               if isinstance(getattr(mod, k, None), int)}
            if path not in charged:
                charged.add(path)
                own = sum(p.numel() * p.element_size() for p in mod.parameters(recurse=False))
        names.append(n.name)
        ops.append(op)
        paths.append(path)
        attrs.append(extra)
        pbytes.append(own)
        obytes.append(_nbytes(n.meta.get("val")))
        for a in dict.fromkeys(n.all_input_nodes):
            src.append(index[a.name])
            dst.append(index[n.name])
            eb.append(_nbytes(a.meta.get("val")))
    types = {p: type(m).__name__ for p, m in modules.items()}
    k = len(nodes)
    return build(type(model).__name__, fwd_s=[0.0] * k, param_bytes=pbytes, out_bytes=obytes,
                 src=src, dst=dst, edge_bytes=eb, names=names, ops=ops, modules=paths,
                 attrs=attrs, meta={"module_types": types, "costs": "none",
                                    "captured_by": "torch.export"})
