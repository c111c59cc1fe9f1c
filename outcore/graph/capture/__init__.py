"""Capture a PyTorch model as a layer graph (the only graph module that imports torch).

torch.fx symbolic tracing gives one node per leaf-module call or tensor op; the module path of
every node is kept (``nn_module_stack``) so blocks can be collapsed later. A module fx cannot
trace (data-dependent control flow, unsupported Python) is made a leaf, with a warning naming
it. One forward pass (under ``FakeTensorMode`` by default: no memory, no compute; the model's
buffers restored after it) records output shapes and bytes, and what autograd saves, per node.
"""

from __future__ import annotations

import logging
import operator
import re
from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_map_only

from outcore.errors import CaptureError, ModelError, UsageError
from outcore.graph.capture.mutation import thread_in_place
from outcore.graph.capture.recorder import (
    Recorder,
    call_config,
    first_line,
    record,
    weightless_mode,
)
from outcore.graph.coarsen import collapse
from outcore.graph.ir import Graph, build
from outcore.hardware.precision import autocast, canonical

log = logging.getLogger(__name__)


@dataclass
class Traced:
    """A traced model: the fx module, the leaves that had to be forced, and its root."""

    gm: fx.GraphModule
    forced_leaves: tuple[str, ...]


class _Tracer(fx.Tracer):
    def __init__(self, leaves: Iterable[str]):
        super().__init__()
        self.leaves = set(leaves)

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return qualname in self.leaves or super().is_leaf_module(m, qualname)


def trace(model: nn.Module, leaves: Iterable[str] = (), n_inputs: int | None = None) -> Traced:
    """Symbolically trace ``model``; modules that break tracing become leaves (with a warning).

    ``n_inputs``: how many positional inputs the model is given; optional ``forward`` arguments
    after them keep their defaults (they do not become graph inputs nobody feeds).
    Raises :class:`CaptureError` when the root module itself cannot be traced.
    """
    concrete = _defaults_after(model, n_inputs)
    forced: list[str] = []
    leaf_set = set(leaves)
    names = {id(m): q for q, m in model.named_modules()}
    for _ in range(len(names) + 1):
        tracer = _Tracer(leaf_set)
        _forget_constants(model)  # left by a failed attempt
        try:
            graph = tracer.trace(model, concrete_args=concrete or None)
            _drop_concrete_placeholders(graph, concrete)
            thread_in_place(graph, tracer.root)  # later readers of a written tensor
        except Exception as e:  # any tracing failure: find the module it happened in
            culprit = _innermost_module(e, names)
            if culprit is None or culprit == "" or culprit in leaf_set:
                raise CaptureError(
                    f"torch.fx cannot trace {type(model).__name__}: {type(e).__name__}: "
                    f"{first_line(e)}; make the data-dependent part a submodule, or pass "
                    "it as a leaf module") from e
            log.warning("torch.fx cannot trace module %r (%s: %s); treating it as one leaf "
                        "layer", culprit, type(e).__name__, first_line(e))
            leaf_set.add(culprit)
            forced.append(culprit)
            continue
        gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
        _forget_constants(model)
        return Traced(gm, tuple(forced))
    raise CaptureError(f"torch.fx cannot trace {type(model).__name__}")


CAPTURE_PATHS = ("auto", "fx", "export")


def trace_model(model: nn.Module, inputs: tuple[torch.Tensor, ...], *, leaves: Iterable[str] = (),
                path: str = "auto", output: str | None = None) -> tuple[Traced, dict[str, Any]]:
    """Trace ``model`` by torch.fx or torch.export, chosen per model; returns the trace and
    how it was made (``graph.meta['capture']``, which :func:`retrace` follows).

    ``path="auto"``: Hugging Face models are exported; other models are traced by fx, and
    exported instead when fx fails at the root, had to make leaves of modules holding more
    than half of the parameters (e.g. a whole transformer), or keeps a leaf with dropout inside
    (:func:`_random_leaves`). ``output`` picks the key of a
    dict / ``ModelOutput`` result (default ``loss``, else ``logits``).
    """
    from outcore.graph.capture.export import export_trace, is_hf_model

    if path not in CAPTURE_PATHS:
        raise CaptureError(f"unknown capture path {path!r}: choose {', '.join(CAPTURE_PATHS)}")
    leaves = tuple(leaves)
    chosen = path
    fx_error: CaptureError | None = None
    traced = None
    if path == "auto":
        chosen = "export" if is_hf_model(model) and not leaves else "fx"
    if chosen == "fx":
        try:
            traced = trace(model, leaves, n_inputs=len(inputs))
        except CaptureError as e:
            if path == "fx":
                raise
            fx_error, chosen = e, "export"
        if traced is not None and path == "auto" and _mostly_forced(model, traced.forced_leaves):
            log.info("torch.fx made leaves of %s; trying torch.export", traced.forced_leaves)
            chosen = "export"
        random_inside = _random_leaves(traced.gm) if traced is not None else []
        if random_inside and path == "auto" and not leaves:
            # a leaf's own dropout draws from one generator: exported, it is a graph node
            # that draws per sample (outcore.core.randomness), the same on every layout
            log.info("dropout inside the leaves %s; trying torch.export", random_inside)
            chosen = "export"
    key = None
    if chosen == "export":
        try:
            gm, key = export_trace(model, inputs, output)
            traced = Traced(gm, ())
        except CaptureError as export_error:
            if traced is None:
                _raise_if_model_fails(model, inputs)
                if fx_error is not None:  # both failed: say both
                    raise CaptureError(f"{fx_error}. Tried torch.export too: "
                                       f"{export_error}") from export_error
                raise
            chosen = "fx"  # keep the fx trace with its forced leaves
            if random_inside:
                log.warning("dropout inside %s draws from one generator: on other layouts "
                            "and micro-batches it draws other masks than on one device",
                            ", ".join(random_inside))
    assert traced is not None
    meta = {"path": chosen, "leaves": list(leaves), "n_inputs": len(inputs)}
    if chosen == "export" and inputs and inputs[0].dim():
        meta["batch"] = int(inputs[0].shape[0])
    if key is not None:
        meta["output"] = key
    return traced, meta


def _raise_if_model_fails(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    """Raise :class:`ModelError` when ``model`` itself fails on ``inputs`` (a patch size that
    does not divide the image, a fixed-size attention bias): run once in fake mode, no memory,
    no compute. Called when no tracer could capture it, so the user hears that the model, not
    the tracer, refuses the input. A failure of fake mode itself (a value read with
    ``.item()``) says nothing about the model and is not reported."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from outcore.graph.capture.export import held_logs

    try:
        with held_logs(), torch.no_grad(), weightless_mode(model) or \
                FakeTensorMode(allow_non_fake_inputs=True) as mode:
            model(*(mode.from_tensor(x) for x in inputs))
    except _MODEL_FAULTS as e:
        if type(e).__module__.startswith("torch") or any(
                w in str(e).lower() for w in ("fake", "meta tensor", "data-dependent")):
            return
        shapes = ", ".join("x".join(map(str, x.shape)) for x in inputs)
        raise ModelError(f"the model fails on an input of shape {shapes}: "
                         f"{type(e).__name__}: {first_line(e)}; check --input-shape") from e
    except Exception:  # noqa: BLE001 - fake mode could not run it: nothing to conclude
        return


# errors a model's own code raises on an input it cannot take (fake mode's own are torch's)
_MODEL_FAULTS = (RuntimeError, ValueError, AssertionError, IndexError, TypeError)


def retrace(model: nn.Module, inputs: tuple[torch.Tensor, ...], meta: dict[str, Any]) -> Traced:
    """Trace ``model`` the way its graph was captured (``graph.meta``), so node names match:
    the runtime and the profiler build their modules from this."""
    how = meta.get("capture") or {}
    leaves = tuple(how.get("leaves", ())) + tuple(meta.get("forced_leaves", ()))
    if how.get("path") == "auto":
        return trace_model(model, inputs, leaves=leaves, output=how.get("output"))[0]
    if how.get("path") == "export":
        from outcore.graph.capture.export import export_trace
        batch = how.get("batch")
        if batch and inputs and inputs[0].dim() and inputs[0].shape[0] != batch:
            # the graph was exported at this batch: the same batch gives the same graph (a
            # batch of 1 would be specialised); the graph itself runs any batch size
            inputs = tuple(_to_batch(x, int(batch)) for x in inputs)
        return Traced(export_trace(model, inputs, how.get("output"))[0], ())
    return trace(model, leaves, n_inputs=how.get("n_inputs", len(inputs)) if how else None)


def _to_batch(x: torch.Tensor, batch: int) -> torch.Tensor:
    """``x`` with its rows repeated (or cut) to ``batch`` rows."""
    if not x.dim():
        return x
    reps = -(-batch // x.shape[0])
    return x.repeat(reps, *([1] * (x.dim() - 1)))[:batch]


def _random_leaves(gm: fx.GraphModule) -> list[str]:
    """The leaf modules of ``gm`` that draw random numbers inside (``nn.TransformerEncoderLayer``
    and ``nn.MultiheadAttention`` with dropout, torch.fx's leaves as every ``torch.nn`` module
    is): not a dropout layer itself, which runs as a node of its own."""
    found = []
    for n in gm.graph.nodes:
        if n.op != "call_module":
            continue
        mod = gm.get_submodule(str(n.target))
        if _drops(mod) or not mod.training:
            continue
        if any(_drops(sub) or isinstance(sub, nn.MultiheadAttention) and sub.dropout > 0
               for sub in mod.modules() if sub.training):
            found.append(str(n.target))
    return found


def _drops(mod: nn.Module) -> bool:
    """Whether ``mod`` is a dropout layer (dropout, drop-path, stochastic depth) that drops."""
    kind = type(mod).__name__.lower()
    if not any(k in kind for k in ("dropout", "droppath", "stochasticdepth")):
        return False
    p = getattr(mod, "p", getattr(mod, "drop_prob", None))
    return not isinstance(p, (int, float)) or p > 0


def _mostly_forced(model: nn.Module, forced: tuple[str, ...]) -> bool:
    if not forced:
        return False
    total = sum(p.numel() for p in model.parameters())
    held = sum(p.numel() for q in forced for p in model.get_submodule(q).parameters())
    return total > 0 and held > total / 2


def _forget_constants(model: nn.Module) -> None:
    """Remove the ``_tensor_constant<k>`` attributes fx tracing sets on the traced model (the
    graph module holds its own references): otherwise the next trace of the same model names
    its constants ``_tensor_constant2``..., and its node names no longer match the graph."""
    for name in [k for k in vars(model) if k.startswith("_tensor_constant")]:
        delattr(model, name)
    for name in [k for k in model._buffers if k.startswith("_tensor_constant")]:
        del model._buffers[name]


def _defaults_after(model: nn.Module, n_inputs: int | None) -> dict[str, Any]:
    """Default values of the ``forward`` parameters after the first ``n_inputs``."""
    if n_inputs is None:
        return {}
    import inspect
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    out = {}
    for p in params[n_inputs:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is p.empty:
            return {}  # a required argument was not given: let tracing report it
        out[p.name] = p.default
    return out


def _drop_concrete_placeholders(graph: fx.Graph, concrete: dict[str, Any]) -> None:
    """Replace the placeholders fx keeps for concrete (defaulted) arguments by their values,
    and drop the checks fx adds on them (``_assert_is_none``, ``_assert(eq(...))``)."""
    if not concrete:
        return
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    extra = placeholders[len(placeholders) - len(concrete):]
    for n, value in zip(extra, concrete.values()):
        for u in list(n.users):
            u.args = tree_map_only(fx.Node, lambda a: value if a is n else a, u.args)
            u.kwargs = tree_map_only(fx.Node, lambda a: value if a is n else a, u.kwargs)
        graph.erase_node(n)
    changed = True
    while changed:
        changed = False
        for n in list(graph.nodes):
            if n.op == "call_function" and not n.users and not n.all_input_nodes and \
                    (n.target in (torch._assert, operator.eq, operator.ne, operator.is_,
                                  operator.is_not, operator.not_) or
                     "assert" in getattr(n.target, "__name__", "")):
                graph.erase_node(n)
                changed = True


def _innermost_module(e: BaseException, names: dict[int, str]) -> str | None:
    found = None
    tb = e.__traceback__
    while tb is not None:
        obj = tb.tb_frame.f_locals.get("self")
        if isinstance(obj, nn.Module) and id(obj) in names:
            found = names[id(obj)]
        tb = tb.tb_next
    return found


def _op_name(n: fx.Node, gm: fx.GraphModule) -> str:
    if n.op == "placeholder":
        return "input"
    if n.op == "output":
        return "output"
    if n.op == "get_attr":
        obj = _get_attr(gm, str(n.target))
        return "param" if isinstance(obj, nn.Parameter) else "constant"
    if n.op == "call_module":
        return type(gm.get_submodule(str(n.target))).__name__.lower()
    if n.op == "call_method":
        return str(n.target)
    target = n.target
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):  # exported ATen op: aten.linear.default
        return target.overloadpacket.__name__
    return getattr(target, "__name__", str(target)).replace("<built-in function ", "").rstrip(">")


def _get_attr(gm: nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


_CONFIG_KEYS = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation",
                "groups", "in_features", "out_features", "num_embeddings", "embedding_dim",
                "input_size", "hidden_size", "num_layers", "num_heads", "embed_dim",
                "normalized_shape", "num_features", "output_size", "p", "drop_prob")


def _layer_config(mod: nn.Module) -> dict[str, Any]:
    """Hyperparameters of a layer that its cost depends on (JSON-ready)."""
    config: dict[str, Any] = {}
    for key in _CONFIG_KEYS:
        value = getattr(mod, key, None)
        if isinstance(value, (int, float, bool)) and not isinstance(value, bool) or \
                isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
            config[key] = list(value) if isinstance(value, (tuple, list)) else value
    return config


def _module_path(n: fx.Node) -> str:
    if n.op == "call_module":
        return str(n.target)
    if n.op == "get_attr":
        return str(n.target).rpartition(".")[0]
    stack = n.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return re.sub(r"@\d+$", "", str(path))
    return ""


def capture(model: nn.Module, example_inputs: Any, *, name: str | None = None,
            depth: int | None = None, leaves: Iterable[str] = (), fake: bool = True,
            path: str = "auto", output: str | None = None,
            leaf_modules: Iterable[str] = (), precision: str = "32") -> Graph:
    """Capture ``model`` as a :class:`Graph` at layer level (or collapsed to ``depth``).

    Args:
        model: any ``nn.Module``; it is not modified.
        example_inputs: a tensor or tuple of tensors; its first dimension is the batch.
        name: graph name (default: the model's class name).
        depth: collapse blocks deeper than this module depth (None: keep every layer).
        leaves: module paths to keep as single layers (torch.fx leaf modules; giving any
            makes ``auto`` use torch.fx).
        leaf_modules: module paths or module class names (``DenseLayer``: every module of
            that type) to keep as single layers; see :func:`leaf_paths`.
        fake: record shapes under FakeTensorMode (no memory, no compute); False runs for real.
        path: ``auto``, ``fx`` or ``export`` (see :func:`trace_model`).
        output: key of a dict / ``ModelOutput`` result to train on (default loss, else logits).
        precision: ``32``, ``bf16-mixed`` or ``16-mixed``: outputs and saved tensors are
            recorded as autocast makes them (``meta['precision']``); the trace is the same.

    Costs are not measured here: ``fwd_s``/``bwd_s`` are 0 until :func:`outcore.profile` or
    :func:`outcore.estimate` fills them. Bytes (params, outputs, saved activations) are exact.
    ``meta['capture']`` records how the model was traced; the runtime traces it the same way.
    """
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    given = tuple(leaves) + leaf_paths(model, leaf_modules)
    traced, how = trace_model(model, inputs, leaves=given, path=path, output=output)
    with autocast(precision := canonical(precision), inputs[0].device if inputs else "cpu"):
        rec = record(traced.gm, inputs, fake=fake, measure=given + traced.forced_leaves)
    if not rec.differentiable:
        raise CaptureError(
            f"{name or type(model).__name__}: its traced graph carries no gradient from the "
            f"parameters to the output ({how.get('path')} path): an autograd.Function the "
            "trace does not differentiate through (Reformer's reversible layers) would train "
            "nothing; pass that module as a leaf (--leaf) or capture a wrapper around it")
    g = graph_from_fx(traced.gm, rec, name or type(model).__name__,
                      batch_size=int(inputs[0].shape[0]) if inputs and inputs[0].dim() else None)
    meta = {**g.meta, "capture": how, "precision": precision}
    if traced.forced_leaves:
        meta["forced_leaves"] = list(traced.forced_leaves)
    return collapse(g.replace(meta=meta), depth)


def leaf_paths(model: nn.Module, names: Iterable[str]) -> tuple[str, ...]:
    """Module paths of ``names``: each is a module path of ``model`` (``layer1.0``) or a module
    class name (``BasicBlock``: every module of that type). Raises :class:`UsageError` naming
    the close class names when one matches nothing."""
    paths: list[str] = []
    modules = dict(model.named_modules())
    types: dict[str, list[str]] = {}
    for q, m in modules.items():
        types.setdefault(type(m).__name__, []).append(q)
    for name in names:
        if name in modules and name:
            paths.append(name)
        elif name in types:
            paths += [q for q in types[name] if q]
        else:
            import difflib
            close = difflib.get_close_matches(name, list(types) + list(modules), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"leaf module {name!r} is neither a module path nor a module "
                             f"class of {type(model).__name__}{hint}")
    return tuple(dict.fromkeys(paths))


def _computed_sizes(n: fx.Node) -> list[int]:
    """Positions (from the end: -1 is the last) of a ``view`` / ``reshape``'s sizes that the
    graph computes (from an input's shape) rather than passes as constants: tensor
    parallelism must know whether a split width or head count is a constant it can see."""
    if n.op == "call_method" and n.target in ("view", "reshape"):
        sizes = n.args[1:]
    elif n.op == "call_function" and getattr(n.target, "__name__", "") == "reshape":
        sizes = n.args[1:2]
    else:
        return []
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)):
        sizes = sizes[0]
    return [j - len(sizes) for j, v in enumerate(sizes) if isinstance(v, fx.Node)]


def structure(model: nn.Module) -> Graph:
    """``model``'s layer graph traced with torch.fx without running it: nodes, edges and the
    module hierarchy, no shapes, bytes or costs (enough to find which layers pair up)."""
    traced = trace(model)
    return graph_from_fx(traced.gm, Recorder(traced.gm), type(model).__name__, None)


def graph_from_fx(gm: fx.GraphModule, rec: Recorder, name: str,
                  batch_size: int | None) -> Graph:
    """The :class:`Graph` of a traced and recorded fx module (one node per fx node)."""
    nodes = list(gm.graph.nodes)
    index = {n.name: i for i, n in enumerate(nodes)}
    owner: dict[int, str] = {}
    names, ops, modules, attrs = [], [], [], []
    param_bytes, out_bytes, saved_bytes = [], [], []
    module_types: dict[str, str] = {}
    src, dst, eb = [], [], []
    for n in nodes:
        for path, typ in (n.meta.get("nn_module_stack") or {}).values():
            module_types.setdefault(re.sub(r"@\d+$", "", str(path)),
                                    getattr(typ, "__name__", str(typ).rpartition(".")[2]))
        extra: dict[str, Any] = {"shape": rec.shapes.get(n.name)}
        if n.name in rec.dtypes:
            extra["dtype"] = rec.dtypes[n.name]
        if n.name in rec.in_shapes:
            extra["in_shapes"] = rec.in_shapes[n.name]
        if n.name in rec.channels_last:
            extra["channels_last"] = True
        if n.name in rec.flops:
            extra["flops"] = rec.flops[n.name]
        if n.name in rec.saved_inputs:
            extra["saved_inputs"] = rec.saved_inputs[n.name]
        if rec.resaved_inputs.get(n.name):
            extra["resaved_inputs"] = rec.resaved_inputs[n.name]
        if n.name in rec.storage_of:
            extra["storage_of"] = rec.storage_of[n.name]
        if rec.fixed_saved.get(n.name):
            extra["fixed_saved"] = rec.fixed_saved[n.name]
        for key, measured in (("fwd_scratch_share", rec.fwd_scratch),
                              ("bwd_scratch_share", rec.bwd_scratch)):
            if measured.get(n.name) and rec.out_bytes.get(n.name):  # in the output's bytes,
                # as it scales with the micro-batch
                extra[key] = round(measured[n.name] / rec.out_bytes[n.name], 6)
        if n.name in rec.storage_bytes and rec.out_bytes.get(n.name):
            # a view of a larger storage: how many times its own bytes that storage holds
            extra["storage_share"] = round(rec.storage_bytes[n.name] / rec.out_bytes[n.name], 6)
        computed = _computed_sizes(n)
        if computed:
            extra["computed_sizes"] = computed
        own = shared = 0
        tensors: list[tuple[str, torch.Tensor]] = []
        if n.op == "call_module":
            mod = gm.get_submodule(str(n.target))
            module_types.setdefault(str(n.target), type(mod).__name__)
            config = _layer_config(mod)
            if config:
                extra["config"] = config
            tensors = [(f"{n.target}.{k}" if k else str(n.target), p)
                       for k, p in mod.named_parameters()]
            # the layer's buffers (batch norm's running statistics): held all run long
            held = sum(b.numel() * b.element_size() for b in mod.buffers())
            if held:
                extra["buffer_bytes"] = int(held)
        elif n.op == "call_function":
            config = call_config(n, rec.in_shapes.get(n.name))
            if config:
                extra["config"] = config
        elif n.op == "get_attr":
            obj = _get_attr(gm, str(n.target))
            if isinstance(obj, nn.Parameter):
                tensors = [(str(n.target), obj)]
        owned, shares = [], []
        for pname, p in tensors:
            if id(p) in owner:
                shared += p.numel() * p.element_size()
                shares.append(owner[id(p)])
            else:
                owner[id(p)] = pname
                own += p.numel() * p.element_size()
                owned.append(pname)
        if owned:
            extra["params"] = owned
        if shares:
            extra["shared_params"] = shares
            extra["shared_bytes"] = shared
        names.append(n.name)
        ops.append(_op_name(n, gm))
        modules.append(_module_path(n))
        attrs.append(extra)
        param_bytes.append(own)
        out_bytes.append(rec.out_bytes.get(n.name, 0))
        saved_bytes.append(rec.saved.get(n.name, 0))
        seen_inputs: set[str] = set()
        for inp in n.all_input_nodes:
            if inp.name in seen_inputs:
                continue
            seen_inputs.add(inp.name)
            src.append(index[inp.name])
            dst.append(index[n.name])
            size = rec.out_bytes.get(n.name, 0) if (n.op == "call_function" and
                                                    n.target is operator.getitem) \
                else rec.out_bytes.get(inp.name, 0)
            eb.append(size)
    n = len(nodes)
    return build(
        name, fwd_s=[0.0] * n, bwd_s=[0.0] * n, param_bytes=param_bytes, out_bytes=out_bytes,
        saved_bytes=saved_bytes, src=src, dst=dst, edge_bytes=eb, names=names, ops=ops,
        modules=modules, attrs=attrs, batch_size=batch_size,
        meta={"module_types": module_types, "costs": "none"},
    )
