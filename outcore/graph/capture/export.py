"""Capture through ``torch.export`` (non-strict), beside torch.fx symbolic tracing.

Models that ``torch.fx.symbolic_trace`` cannot trace (Hugging Face ``transformers`` models:
``co_varnames is too small``, control flow on shapes, ``ModelOutput`` results) are exported with
``torch.export.export(..., strict=False)``. The exported graph is an ATen-level fx graph whose
nodes keep ``nn_module_stack``, so every op knows the module it ran in and the graph collapses by
module depth into attention / MLP / norm blocks, never one leaf for the whole transformer.

The exported program is turned back into a plain ``fx.GraphModule`` that the rest of outcore
(recording, profiling, the runtime's piece builder) handles like a traced one:

- parameters and buffers are ``get_attr`` nodes resolving to the *model's own* tensors (so a
  seed gives the same weights, and tied weights stay one ``Parameter``), moved next to their
  first use;
- inputs are the positional tensors given (optional ``forward`` arguments keep their defaults);
- a dict / ``ModelOutput`` result is reduced to one tensor: ``loss`` when the model computes it,
  else ``logits``, else its first tensor; the key is returned so it can be recorded;
- export's own guard and metadata-assertion nodes are dropped.

The batch dimension is exported as a symbol (``Dim.AUTO``), so one graph runs every micro-batch
size; the runtime re-exports at the captured batch size (inputs repeated to it), so node names
match the graph whatever its micro-batch.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_unflatten

from outcore.errors import CaptureError
from outcore.graph.capture.device import follow_module_device
from outcore.graph.capture.mutation import thread_in_place

log = logging.getLogger(__name__)

OUTPUT_KEYS = ("loss", "logits", "last_hidden_state", "prediction_logits")
_DROPPED_TARGETS = ("_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size",
                    "_assert_async")


def is_hf_model(model: nn.Module) -> bool:
    """Whether ``model`` is a Hugging Face ``PreTrainedModel`` (without importing transformers)."""
    return any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__)


def export_trace(model: nn.Module, inputs: tuple[torch.Tensor, ...],
                 output_key: str | None = None) -> tuple[fx.GraphModule, str | None]:
    """Export ``model`` on ``inputs`` and return ``(graph module, output key or None)``.

    Args:
        model: any module (not modified; its training/eval mode is kept).
        inputs: positional example tensors (batch first).
        output_key: the key to train on when the result is a dict / ``ModelOutput`` (default:
            ``loss`` if present, else ``logits``, else the first tensor-valued key).

    Raises :class:`CaptureError` naming the export failure.
    """
    config = getattr(model, "config", None)
    cache = getattr(config, "use_cache", None)
    try:
        if cache:  # a cache object in the output is not a pytree; training never uses it
            config.use_cache = False
        ep = _exported(model, tuple(inputs))
    except Exception as e:  # export failures come in many types: one message for all
        text = str(e).strip().splitlines()
        raise CaptureError(
            f"torch.export cannot capture {type(model).__name__}: {type(e).__name__}: "
            f"{text[0][:300] if text else ''}; pass leaf modules, or capture a wrapper whose "
            "forward takes and returns tensors") from e
    finally:
        if cache:
            config.use_cache = cache
    unlifted = ep.module()
    graph = unlifted.graph
    _drop_checks(graph)
    _drop_whole_slices(graph)
    key = _select_output(graph, unlifted, output_key)
    graph._codegen = fx.graph.CodeGen()  # plain positional inputs, plain outputs
    _canonical_linears(model, graph)
    _move_attrs_to_first_use(graph)
    _first_names(model, graph)
    graph.eliminate_dead_code(is_impure_node=_is_impure)
    thread_in_place(graph, model)  # later readers of a tensor written in place
    gm = fx.GraphModule(_attr_root(model, unlifted, graph), graph, type(model).__name__)
    if getattr(ep, "_outcore_stand_in", False):
        _give_constants_values(gm, model)
    _register_buffers(gm, model, graph)
    follow_module_device(gm)  # no call pinned to the device of capture
    gm.recompile()
    return gm, key


def _exported(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    """``torch.export`` of ``model`` (non-strict, batch dimension symbolic). A Hugging Face
    model whose Python branches on a tensor's value (Longformer's and LED's ``if
    is_global_attn:``, from the attention mask) cannot be exported soundly: it is exported
    again by ``draft_export``, which takes each such branch the way the example inputs take
    it, and a warning names the branches. outcore's own data (attention masks of ones) takes
    them the same way every step. Other models are refused as before: a branch on the data
    itself (``if x.sum() > 0``) would train another program on other batches.

    The partial graph torch prints to stderr when an export fails (a graph's whole source) is
    not shown; anything else written there is passed on."""
    dynamic = _batch_dynamic(inputs)
    try:
        with _quiet_partial_graph():
            return torch.export.export(model, inputs, strict=False, dynamic_shapes=dynamic)
    except Exception as e:  # noqa: BLE001 - only a data-dependent branch is retried
        mode = weightless_mode(model)
        if mode is not None and _fake_constant(e):
            with _quiet_partial_graph():
                ep = torch.export.export(model, tuple(mode.from_tensor(x) for x in inputs),
                                         strict=False, dynamic_shapes=dynamic)
            ep._outcore_stand_in = True  # its constants are to be given values
            return ep
        if not (_data_dependent(e) and is_hf_model(model)):
            raise
        first = e
    from torch.export import draft_export

    real = tuple(values_of(x) for x in inputs)
    with _quiet_partial_graph(all_text=True), real_parameters(model):
        try:
            ep = draft_export(model, real, dynamic_shapes=dynamic)
        except Exception:  # noqa: BLE001 - the first failure says more
            raise first from None
    branches = _specialised_branches(getattr(ep, "_report", None))
    key = (type(model).__name__, branches)
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning("%s branches on tensor values (%s); its graph takes each branch as the "
                    "example inputs do, and data that takes another trains another program",
                    type(model).__name__, "; ".join(branches) or "unnamed")
    return ep


def weightless_mode(model: nn.Module) -> Any:
    """The ``FakeTensorMode`` ``model`` was built in (:func:`outcore.zoo.build_model` with
    ``weights=False``: its parameters are fake tensors, shapes without memory), or None."""
    from torch._subclasses.fake_tensor import FakeTensor

    for t in (*model.parameters(), *model.buffers()):
        if isinstance(t, FakeTensor):
            return t.fake_mode
    return None


def _fake_constant(e: BaseException) -> bool:
    """Whether ``e`` is export's refusal of a constant that is a fake tensor: one the forward
    takes from a parameter's ``.data`` in training (Gemma 3n's
    ``self.prediction_coefs.weight.data.clamp_(...)``), which torch.export makes a constant
    of the parameter's traced value."""
    return "fake tensor in the exported program constant" in str(e)


def _give_constants_values(gm: fx.GraphModule, model: nn.Module) -> None:
    """A model built without weights, exported in its own fake mode (:func:`_exported`): its
    lifted constants are fake. One only written in place (the ``.data`` a forward clamps)
    becomes real zeros: the graph writes into its own copy, which nothing reads, and a
    warning says the write does not reach the parameter. A constant the graph reads keeps
    the value torch recorded for it, or is refused."""
    from torch._subclasses.fake_tensor import FakeTensor

    named = {n for n, _ in model.named_parameters(remove_duplicate=False)} | \
        {n for n, _ in model.named_buffers(remove_duplicate=False)}
    written = []
    for n in gm.graph.nodes:
        if n.op != "get_attr" or str(n.target) in named:
            continue
        owner, _, attr = str(n.target).rpartition(".")
        holder = gm.get_submodule(owner) if owner else gm
        value = getattr(holder, attr)
        if not isinstance(value, FakeTensor):
            continue
        if value.constant is not None:
            setattr(holder, attr, value.constant.clone())
        elif n.users and all(str(u.target).endswith("_.default") and u.args[0] is n
                             for u in n.users):
            setattr(holder, attr, torch.zeros(value.shape, dtype=value.dtype))
            written.append(str(n.target))
        else:
            raise CaptureError(f"torch.export cannot capture {type(model).__name__} built "
                               f"without its weights: its constant {n.target} has no value; "
                               "pass leaf modules, or capture a wrapper whose forward takes "
                               "and returns tensors")
    key = (type(model).__name__, ("a write to a parameter's .data",))
    if written and key not in _WARNED:
        _WARNED.add(key)
        log.warning("%s writes into a parameter's `.data` in its forward (%s); torch.export "
                    "makes that a constant, so the write does not reach the parameter",
                    type(model).__name__, ", ".join(written[:3]))


_WARNED: set[tuple[str, tuple[str, ...]]] = set()
_VALUES: dict[int, tuple[Any, torch.Tensor]] = {}  # id(fake) -> (weak ref to it, values)


def remember_values(fake: torch.Tensor, real: torch.Tensor) -> None:
    """The values of a fake input (a model built without its weights is captured on fake
    tensors): ``draft_export`` runs the model on them to take its branches. Kept while the
    fake tensor lives."""
    key = id(fake)
    _VALUES[key] = (weakref.ref(fake), real)
    weakref.finalize(fake, _VALUES.pop, key, None)


def values_of(x: Any) -> Any:
    """The values remembered for a fake tensor ``x``, else ``x``."""
    entry = _VALUES.get(id(x))
    return entry[1] if entry is not None and entry[0]() is x else x


@contextlib.contextmanager
def real_parameters(model: nn.Module) -> Iterator[None]:
    """Real values, for the duration, for parameters built without them (fake tensors: a
    model built for capture and estimated costs, or a rank's model before it builds its
    part): ``draft_export`` runs the model on real tensors to take its branches. The values
    are seeded random numbers (a branch on the attention mask does not read them); tied
    parameters stay tied, and the model's own parameters are put back after."""
    from torch._subclasses.fake_tensor import is_fake

    made: dict[int, nn.Parameter] = {}
    swapped: list[tuple[nn.Module, str, nn.Parameter]] = []
    gen = torch.Generator().manual_seed(0)
    try:
        for owner in model.modules():
            for name, p in list(owner._parameters.items()):
                if p is None or not (is_fake(p) or p.device.type == "meta"):
                    continue
                if id(p) not in made:
                    value = torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.02
                    made[id(p)] = nn.Parameter(value.to(p.dtype), requires_grad=p.requires_grad)
                swapped.append((owner, name, p))
                owner._parameters[name] = made[id(p)]
        yield
    finally:
        for owner, name, p in reversed(swapped):
            owner._parameters[name] = p


def _data_dependent(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it came from) is a guard on a tensor's value."""
    seen: BaseException | None = e
    while seen is not None:
        if any("DataDependent" in c.__name__ for c in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _specialised_branches(report: Any) -> tuple[str, ...]:
    """``draft_export``'s specialised data-dependent branches, as ``line N: code (-> value)``."""
    import ast

    out: list[str] = []
    for failure in getattr(report, "failures", ()) or ():
        data = getattr(failure, "data", None)
        if not isinstance(data, dict) or "expr" not in data:
            continue
        try:
            frames = ast.literal_eval(str(data.get("user_stack", "[]")))
            frame = frames[-1] if frames else {}
        except (ValueError, SyntaxError):
            frame = {}
        where = f"line {frame.get('line', '?')}: {frame.get('loc', data['expr'])}"
        out.append(f"{where} -> {data.get('result', '?')}")
    return tuple(dict.fromkeys(out))


# loggers held to a level while exporting: the shape solver's warnings, fake mode's errors
_HELD_LOGS = {"torch.fx.experimental.symbolic_shapes": logging.ERROR,
              "torch._subclasses.fake_tensor": logging.CRITICAL}


@contextlib.contextmanager
def held_logs() -> Iterator[None]:
    """Within the block the loggers of :data:`_HELD_LOGS` are held to their levels."""
    held = {name: logging.getLogger(name) for name in _HELD_LOGS}
    levels = {name: lg.level for name, lg in held.items()}
    for name, lg in held.items():
        lg.setLevel(_HELD_LOGS[name])
    try:
        yield
    finally:
        for name, lg in held.items():
            lg.setLevel(levels[name])


@contextlib.contextmanager
def _quiet_partial_graph(all_text: bool = False) -> Iterator[None]:
    """Hold what is printed to ``sys.stderr`` while exporting; a failed export's partial graph
    (torch prints ``partial_fx_graph`` before raising) is dropped, the rest written on. With
    ``all_text`` (a draft export, whose report is turned into one warning) nothing is. The
    shape solver's warnings about unbacked symbols ("Unable to find user code corresponding
    to {u0}") are held back too, and fake mode's traceback of an operator that fails on the
    example's shapes: the error or the warning above says what they mean."""
    buffer = io.StringIO()
    partial = ""
    try:
        with held_logs(), contextlib.redirect_stderr(buffer):
            yield
    except Exception as e:
        partial = str(getattr(e, "partial_fx_graph", "") or "")
        raise
    finally:
        text = buffer.getvalue().replace(partial, "") if partial else buffer.getvalue()
        if text.strip() and not all_text:
            sys.stderr.write(text)


def _batch_dynamic(inputs: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
    """The batch dimension of every input is symbolic (``Dim.AUTO``: export specialises it
    instead of failing when the model fixes it), so one graph serves every micro-batch size."""
    return tuple({0: torch.export.Dim.AUTO} if isinstance(x, torch.Tensor) and x.dim() else None
                 for x in inputs)


def _is_impure(n: fx.Node) -> bool:
    """In-place ops (running-statistics updates) stay even when nothing reads them."""
    if n.is_impure():
        return True
    name = getattr(n.target, "__name__", "")
    return n.op == "call_function" and name.split(".")[0].endswith("_")


def _drop_checks(graph: fx.Graph) -> None:
    for n in list(graph.nodes):
        if n.op == "call_module" and str(n.target) == "_guards_fn":
            graph.erase_node(n)
        elif n.op == "call_function" and not n.users and \
                any(t in str(n.target) for t in _DROPPED_TARGETS):
            graph.erase_node(n)


def _drop_whole_slices(graph: fx.Graph) -> None:
    """Slices that keep a whole dimension (``x[:, :, i]`` exports as two such slices before
    the select) read their input itself. Each is a view in the forward, but its backward makes
    a zero tensor of the input's size and copies the gradient into it: a Mamba scan's
    ``discrete_A[:, :, i]`` made two extra full-size gradients per step, memory the program
    does not need. Such a slice is replaced by its input (the same values, and the same
    storage for writes through later views)."""
    for n in list(graph.nodes):
        if n.op != "call_function" or n.target is not torch.ops.aten.slice.Tensor:
            continue
        x, given = n.args[0], list(n.args[1:])
        dim, start, end, step = given + [0, None, None, 1][len(given):]
        dim, start, end, step = (n.kwargs.get(k, v) for k, v in
                                 zip(("dim", "start", "end", "step"), (dim, start, end, step)))
        val = x.meta.get("val") if isinstance(x, fx.Node) else None
        if not isinstance(val, torch.Tensor) or step != 1 or start not in (0, None):
            continue
        size = val.shape[dim] if -val.dim() <= dim < val.dim() else None
        whole = end is None or (isinstance(end, int) and
                                (end >= 2 ** 62 or isinstance(size, int) and end >= size))
        if whole:
            n.replace_all_uses_with(x)
            graph.erase_node(n)


def _select_output(graph: fx.Graph, unlifted: fx.GraphModule, output_key: str | None) -> str | None:
    out = next(n for n in graph.nodes if n.op == "output")
    flat = list(out.args[0]) if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
    spec = getattr(unlifted, "_out_spec", None)
    if spec is None:
        return None
    value = tree_unflatten(list(range(len(flat))), spec)
    if isinstance(value, Mapping):
        keys = [k for k, v in value.items() if isinstance(v, int)]
        if output_key is not None and output_key not in keys:
            raise CaptureError(f"the model's output has no {output_key!r}; it has: "
                               f"{', '.join(map(str, keys))}")
        key = output_key or next((k for k in OUTPUT_KEYS if k in keys), keys[0] if keys else None)
        if key is None:
            raise CaptureError("the model's output holds no tensor to train on")
        out.args = (flat[value[key]],)
        return str(key)
    if isinstance(value, int):
        out.args = (flat[value],)
    else:
        out.args = (tuple(flat),) if len(flat) > 1 else (flat[0],)
    return None


def _move_attrs_to_first_use(graph: fx.Graph) -> None:
    """Parameters sit next to the op that first uses them, not all at the top of the graph."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    for n in list(graph.nodes):
        if n.op == "get_attr" and n.users:
            first = min(n.users, key=lambda u: position[u])
            first.prepend(n)


_MATMULS = ("aten.matmul.default", "aten.mm.default")


def _canonical_linears(model: nn.Module, graph: fx.Graph) -> None:
    """An ``nn.Linear`` subclass whose ``forward`` multiplies by the transposed weight itself
    (Hugging Face Falcon's ``FalconLinear``: ``x @ self.weight.T + self.bias``) becomes one
    ``aten.linear`` call, as a plain ``nn.Linear`` exports, recorded under ``nn.Linear``: the
    tensor-parallel pairing and the split runtime then treat it as the Linear it is. Only that
    exact pattern (transpose of the module's own weight, matmul, add of its own bias) is
    rewritten; anything else the subclass does is left alone."""
    modules = dict(model.named_modules())
    params = dict(model.named_parameters(remove_duplicate=False))
    for mm in list(graph.nodes):
        if mm.op != "call_function" or str(mm.target) not in _MATMULS or len(mm.args) != 2:
            continue
        stack = list((mm.meta.get("nn_module_stack") or {}).items())
        path = str(stack[-1][1][0]) if stack else ""
        mod = modules.get(path)
        if not isinstance(mod, nn.Linear) or type(mod).forward is nn.Linear.forward:
            continue
        x, wt = mm.args
        if not (isinstance(wt, fx.Node) and _is_transpose_2d(wt) and wt.args[0].op == "get_attr"
                and params.get(str(wt.args[0].target)) is mod.weight):
            continue
        last, args = mm, (x, wt.args[0])
        if mod.bias is not None:
            add = next(iter(mm.users)) if len(mm.users) == 1 else None
            b = add.args[1] if add is not None and str(add.target) == "aten.add.Tensor" and \
                len(add.args) == 2 and add.args[0] is mm else None
            if not (isinstance(b, fx.Node) and b.op == "get_attr"
                    and params.get(str(b.target)) is mod.bias):
                continue
            last, args = add, (x, wt.args[0], b)
        with graph.inserting_before(last):
            linear = graph.call_function(torch.ops.aten.linear.default, args)
        linear.meta = dict(last.meta)
        key, (p, _) = stack[-1]
        linear.meta["nn_module_stack"] = {**dict(stack[:-1]), key: (p, nn.Linear)}
        last.replace_all_uses_with(linear)
        for dead in dict.fromkeys((last, mm, wt)):
            if not dead.users:
                graph.erase_node(dead)


def _is_transpose_2d(n: fx.Node) -> bool:
    """``n`` swaps the two dimensions of a 2-D tensor (``.T``, ``t``, ``permute([1, 0])``,
    ``transpose(0, 1)``)."""
    if n.op != "call_function" or not n.args or not isinstance(n.args[0], fx.Node):
        return False
    target = str(n.target)
    if target in ("aten.numpy_T.default", "aten.t.default"):
        return True
    if target == "aten.permute.default":
        return [int(d) % 2 for d in n.args[1]] == [1, 0]
    if target == "aten.transpose.int":
        return sorted(int(d) % 2 for d in n.args[1:3]) == [0, 1]
    return False


def _first_names(model: nn.Module, graph: fx.Graph) -> None:
    """A tied tensor is read under the model's first name for it (export may pick another:
    GPT-2's ``lm_head.weight`` for ``transformer.wte.weight``), as ``model.named_parameters()``
    and checkpoints name it."""
    first: dict[int, str] = {}
    for name, t in list(model.named_parameters(remove_duplicate=False)) + \
            list(model.named_buffers(remove_duplicate=False)):
        first.setdefault(id(t), name)
    state = dict(model.named_parameters(remove_duplicate=False))
    state.update(model.named_buffers(remove_duplicate=False))
    for n in graph.nodes:
        if n.op == "get_attr" and str(n.target) in state:
            n.target = first[id(state[str(n.target)])]


def _attr_root(model: nn.Module, unlifted: nn.Module, graph: fx.Graph) -> dict[str, Any]:
    """Every ``get_attr`` target, resolved to the model's own tensor when it has one."""
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers(remove_duplicate=False))
    root: dict[str, Any] = {}
    for n in graph.nodes:
        if n.op != "get_attr":
            continue
        target = str(n.target)
        if target in params:
            root[target] = params[target]
        elif target in buffers:
            root[target] = buffers[target]
        else:  # lifted constants exist only on the exported module
            obj: Any = unlifted
            for part in target.split("."):
                obj = getattr(obj, part)
            root[target] = obj
    return root


def _register_buffers(gm: fx.GraphModule, model: nn.Module, graph: fx.Graph) -> None:
    """Make the model's buffers buffers of ``gm`` again (fx assigns them as plain attributes)."""
    buffers = dict(model.named_buffers(remove_duplicate=False))
    for n in graph.nodes:
        target = str(n.target)
        if n.op == "get_attr" and target in buffers:
            owner, _, attr = target.rpartition(".")
            mod = gm.get_submodule(owner) if owner else gm
            if attr not in mod._buffers:
                value = getattr(mod, attr)
                delattr(mod, attr)
                mod.register_buffer(attr, value)
