"""The run that measures a traced graph (:func:`record`): per node, its output's bytes,
shape and dtype, the bytes autograd saves for its backward (first saver of each storage), its
inputs' shapes, its flops, and whether its first input is laid out channels-last (NHWC) in
memory; a recurrent layer's and a leaf module's memory measured on real tensors too."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx
from torch._prims_common import suggest_memory_format
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from outcore.errors import ModelError
from outcore.graph.capture.export import weightless_mode
from outcore.graph.capture.mutation import writes_first_arg

__all__ = ["Recorder", "compact", "first_line", "record", "stand_ins", "weightless_mode"]

log = logging.getLogger(__name__)


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(value)
               if isinstance(t, torch.Tensor))


def _shape_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return list(value.shape)
    if isinstance(value, (tuple, list)):
        return [_shape_of(v) for v in value]
    return None


def _channels_last(t: torch.Tensor) -> bool:
    """Whether an operator takes ``t`` as channels-last, as torch decides from its strides:
    also a tensor of one pixel whose strides are NHWC's (CoaT's attention maps to 1x1 images),
    which is contiguous both ways."""
    if t.dim() != 4:
        return False
    try:
        return suggest_memory_format(t) == torch.channels_last
    except Exception:  # a tensor subclass without strides
        return not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


# operators whose CPU kernels keep a channels-last input's layout in their output where their
# fake (meta) kernels return a contiguous one: a fake run would take the layers after them as
# contiguous (timm's cpubone_nano: a group norm in NHWC, then convolutions whose channels-last
# backward copies their weight three times; 2.2 MiB over a pipeline stage's prediction)
_CPU_KEEPS_LAYOUT = ("group_norm", "roll", "channel_shuffle")
_CPU_KEEPS_LAYOUT_MODULES = ("GroupNorm", "ChannelShuffle")


def _keeps_layout_on_cpu(n: fx.Node, root: torch.nn.Module) -> bool:
    """Whether node ``n`` is one of the operators (or layers) of :data:`_CPU_KEEPS_LAYOUT`."""
    if n.op == "call_module":
        try:
            kind = type(root.get_submodule(str(n.target)))
        except AttributeError:
            return False
        return any(c.__name__ in _CPU_KEEPS_LAYOUT_MODULES for c in kind.__mro__)
    if n.op not in ("call_function", "call_method"):
        return False
    name = n.target if isinstance(n.target, str) else \
        getattr(n.target, "__name__", None) or str(n.target)
    return any(key in str(name) for key in _CPU_KEEPS_LAYOUT)


def _laid_out_channels_last(result: Any) -> Any:
    """``result`` (or a tuple's first tensor: an exported graph's ``native_group_norm``) as
    the CPU kernel lays it out, channels-last, where the fake run made it contiguous: a view
    of the same storage with NHWC strides (its values do not matter in a fake run)."""
    from torch._subclasses.fake_tensor import FakeTensor
    first = result[0] if isinstance(result, (tuple, list)) and result else result
    if not isinstance(first, torch.Tensor) or first.dim() != 4 or _channels_last(first) or \
            not (isinstance(first, FakeTensor) or first.is_meta) or not first.is_contiguous():
        return result
    n, c, h, w = first.shape
    nhwc = first.as_strided(first.shape, (h * w * c, 1, w * c, c))
    if first is result:
        return nhwc
    return type(result)([nhwc, *result[1:]]) if isinstance(result, list) else \
        (nhwc, *result[1:])


class Recorder(fx.Interpreter):
    """Runs the graph once, recording output values' bytes and autograd-saved bytes per node."""

    def __init__(self, gm: fx.GraphModule, measure: Iterable[str] = ()):
        super().__init__(gm)
        self.measure = frozenset(measure)  # leaf modules measured on real tensors
        self.differentiable = True  # a floating output requires a gradient (or no parameter)
        self.current: str | None = None
        self.saved: dict[str, int] = {}
        self.seen: dict[Any, tuple[str, int]] = {}
        self.out_bytes: dict[str, int] = {}
        self.shapes: dict[str, Any] = {}
        self.dtypes: dict[str, str] = {}
        self.flops: dict[str, int] = {}
        self.in_shapes: dict[str, Any] = {}
        self.channels_last: set[str] = set()  # nodes whose first input is NHWC in memory
        # nodes whose output views a larger storage (a chunk of a tensor): that storage's bytes
        self.storage_bytes: dict[str, int] = {}
        # per node, the input nodes whose output it is the first to save (on another device
        # that tensor is the received copy: the memory model counts it once)
        self.saved_inputs: dict[str, list[str]] = {}
        self._saved_input_storages: list[tuple[str, str, Any]] = []  # (saver, producer, key)
        # per node, the input nodes whose output it saves after another node saved it first
        # (counted there): where that node's piece recomputes or offloads what it saved, this
        # one still holds the tensor
        self.resaved_inputs: dict[str, list[str]] = {}
        self._resaved_input_storages: list[tuple[str, str, Any]] = []
        self.input_storages: dict[Any, str] = {}
        # per node whose output shares an input's storage (a view, a chunk; not an in-place
        # write's), the node that made that storage: what holds the view holds its bytes
        self.storage_of: dict[str, str] = {}
        # per node, the bytes it saves of tensors it makes from parameters alone inside itself
        # (an einsum's permuted copy of its weight): they do not grow with the batch
        self.fixed_saved: dict[str, int] = {}
        self._fixed_storages: list[tuple[str, Any, int]] = []  # (saver, key, bytes)
        self._input_fns: set[int] = set()  # the autograd nodes of the running node's inputs
        # per node measured on real tensors (a recurrent layer, a leaf module): the memory its
        # forward takes beyond its output, and its backward beyond the gradients it returns
        self.fwd_scratch: dict[str, int] = {}
        self.bwd_scratch: dict[str, int] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = StorageWeakRef(t.untyped_storage())
        if not self.current:
            return t
        producer = self.input_storages.get(key)
        if key not in self.seen:
            self.seen[key] = (self.current, t.untyped_storage().nbytes())
            if producer is not None:
                self._saved_input_storages.append((self.current, producer, key))
            elif self._from_parameters(t):
                self._fixed_storages.append((self.current, key, self.seen[key][1]))
        elif producer is not None and self.seen[key][0] != self.current:
            self._resaved_input_storages.append((self.current, producer, key))
        return t

    def _from_parameters(self, t: torch.Tensor, most: int = 64) -> bool:
        """Whether autograd made ``t`` from parameters alone: every path back from it ends at
        a parameter, none at the node's inputs or at a tensor without a gradient (then it may
        be anything: not claimed), within ``most`` steps."""
        fn, seen, stack = t.grad_fn, set(), []
        if fn is None:
            return False
        stack.append(fn)
        while stack:
            f = stack.pop()
            if type(f).__name__ == "AccumulateGrad":
                continue
            if id(f) in self._input_fns or len(seen) > most:
                return False
            for nxt, _ in f.next_functions:
                if nxt is None:
                    return False
                if id(nxt) not in seen:
                    seen.add(id(nxt))
                    stack.append(nxt)
        return True

    def saved_by_node(self, exclude: set[Any]) -> dict[str, int]:
        """Bytes each node saves first, leaving out the storages in ``exclude`` (parameters,
        buffers and their views); :attr:`saved_inputs` leaves them out too."""
        self.saved_inputs, self.resaved_inputs = {}, {}
        for saver, producer, key in self._saved_input_storages:
            if key not in exclude:
                self.saved_inputs.setdefault(saver, []).append(producer)
        self.fixed_saved = {}
        for saver, key, nbytes in self._fixed_storages:
            if key not in exclude:
                self.fixed_saved[saver] = self.fixed_saved.get(saver, 0) + nbytes
        for saver, producer, key in self._resaved_input_storages:
            names = self.resaved_inputs.setdefault(saver, [])
            if key not in exclude and producer not in names:
                names.append(producer)
        out: dict[str, int] = {}
        for key, (node, nbytes) in self.seen.items():
            if key not in exclude:
                out[node] = out.get(node, 0) + nbytes
        return out

    def run_node(self, n: fx.Node) -> Any:
        self.current = n.name
        if n.op in ("call_module", "call_function", "call_method"):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            ts = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            self.in_shapes[n.name] = [list(t.shape) for t in ts]
            if ts and _channels_last(ts[0]):
                self.channels_last.add(n.name)
        inputs = [(inp.name, t) for inp in n.all_input_nodes
                  for t in tree_leaves(self.env.get(inp)) if isinstance(t, torch.Tensor)]
        self.input_storages = {StorageWeakRef(t.untyped_storage()): name for name, t in inputs}
        self._input_fns = {id(t.grad_fn) for _, t in inputs if t.grad_fn is not None}
        counter = FlopCounterMode(display=False)
        with counter, torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            result = super().run_node(n)
        if n.name in self.channels_last and _keeps_layout_on_cpu(n, self.module):
            result = _laid_out_channels_last(result)
        if n.op == "call_module":
            self._note_measured_module(n, *self.fetch_args_kwargs_from_env(n))
        if counter.get_total_flops():
            self.flops[n.name] = int(counter.get_total_flops())
        self.out_bytes[n.name] = _nbytes(result)
        if not writes_first_arg(n, self.module):  # an in-place write's output: a storage of
            # its own (a piece that takes its input from another piece writes into a copy)
            self._note_storage(n.name, result)
        self.shapes[n.name] = _shape_of(result)
        first = next((t for t in tree_leaves(result) if isinstance(t, torch.Tensor)), None)
        if first is not None:
            self.dtypes[n.name] = str(first.dtype).replace("torch.", "")
            whole = _storage_nbytes(first)
            if isinstance(result, torch.Tensor) and whole > self.out_bytes[n.name]:
                self.storage_bytes[n.name] = whole
        return result

    def _note_measured_module(self, n: fx.Node, args: tuple, kwargs: dict) -> None:
        """Measure a layer whose memory the fake run cannot show, on real tensors.

        A recurrent layer (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) recorded in fake mode saves
        what its fake kernel saves, not oneDNN's workspace, which the CPU kernel saves for its
        backward (an LSTM layer of hidden size 48 over 16 steps: 2.4 MiB real, 0.2 MiB fake).
        A leaf module (one torch.fx could not trace, or one the user named) is one node, whose
        forward and backward hold its inner tensors at once (an attention block's scores and
        their gradients), which no operator's scratch in :mod:`outcore.schedule.workspace`
        counts. Such a layer (its parameters and inputs up to :data:`MEASURED_MOST` bytes) is
        run once more on real zeros with stand-in weights, forward and backward: what it saves
        beyond what the fake run recorded is counted as saved by its node, and the most its
        forward and its backward allocate beyond their results is its scratch
        (:attr:`fwd_scratch`, :attr:`bwd_scratch`)."""
        module = self.module.get_submodule(str(n.target))
        if not (isinstance(module, torch.nn.RNNBase) or str(n.target) in self.measure):
            return
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
        size = sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs))
                   if isinstance(t, torch.Tensor)) + \
            sum(p.numel() * p.element_size() for p in module.parameters())
        if size > MEASURED_MOST:
            return
        fake = None
        try:
            if any(isinstance(t, FakeTensor) for t in tree_leaves((args, kwargs))):
                fake = _measured_run(module, args, kwargs)[0]
            with unset_fake_temporarily():
                real, fwd, bwd = _measured_run(module, args, kwargs, scratch=True)
        except Exception as e:  # noqa: BLE001 - zeros it cannot take (a Cholesky factor):
            log.debug("%s not measured on zeros: %s", n.target, first_line(e))  # as recorded
            return
        if fake is not None and real > fake:
            self.seen[("measured workspace", n.name)] = (n.name, real - fake)
        if fwd:
            self.fwd_scratch[n.name] = fwd
        if bwd:
            self.bwd_scratch[n.name] = bwd

    def _note_storage(self, name: str, result: Any) -> None:
        """Record the node whose storage ``name``'s output shares, when it is one of this
        node's inputs' (alive while the node runs, so no freed storage is mistaken for it)."""
        for t in tree_leaves(result):
            if not isinstance(t, torch.Tensor):
                continue
            try:
                src = self.input_storages.get(StorageWeakRef(t.untyped_storage()))
            except (RuntimeError, NotImplementedError):  # no storage (sparse, ...)
                continue
            if src is not None and src != name:
                self.storage_of[name] = self.storage_of.get(src, src)
            return


def stand_ins(module: torch.nn.Module, args: tuple, kwargs: dict
              ) -> tuple[dict[str, torch.Tensor], tuple, dict]:
    """Zeros (made in the fake mode in force, if any) for ``module``'s parameters, by name,
    and for the tensors of ``args`` and ``kwargs``: the same shapes, dtypes and devices, and
    requiring a gradient where they do, to run it with ``torch.func.functional_call``."""
    def zeros(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        return torch.zeros(x.shape, dtype=x.dtype, device=x.device).requires_grad_(
            x.requires_grad and x.is_floating_point())
    params = {name: zeros(p) for name, p in module.named_parameters()}
    args, kwargs = torch.utils._pytree.tree_map(zeros, (args, kwargs))
    return params, args, kwargs


# the most parameter and input bytes a layer may have to be measured on real tensors
MEASURED_MOST = 256 * 2**20


def _measured_run(module: torch.nn.Module, args: tuple, kwargs: dict,
                  scratch: bool = False) -> tuple[int, int, int]:
    """Bytes of the tensors autograd saves when ``module`` runs on zeros shaped as ``args``
    with stand-in parameters (made in the fake mode in force, if any): those it makes itself,
    not its inputs or parameters. With ``scratch`` (real tensors only), also the most its
    forward allocates at once beyond its results, and the most its backward allocates beyond
    the gradients it returns (0 and 0 without)."""
    from outcore.hardware.memtrack import MemoryTracker

    params, args, kwargs = stand_ins(module, args, kwargs)
    given = {StorageWeakRef(t.untyped_storage())
             for t in tree_leaves((args, kwargs, params)) if isinstance(t, torch.Tensor)}
    saved: dict[Any, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = StorageWeakRef(t.untyped_storage())
        if key not in given:
            saved[key] = t.untyped_storage().nbytes()
        return t
    tracker = MemoryTracker(torch.device("cpu")) if scratch else contextlib.nullcontext()
    with tracker, torch.enable_grad(), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = torch.func.functional_call(module, params, args, kwargs)
    if not scratch:
        return sum(saved.values()), 0, 0
    assert isinstance(tracker, MemoryTracker)
    outs = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
    fwd = max(0, int(tracker.peak_bytes) - _nbytes(outs))
    outs = [t for t in outs if t.requires_grad]
    wanted = [t for t in tree_leaves((args, kwargs, params))
              if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not wanted:
        return sum(saved.values()), fwd, 0
    grads = [torch.zeros_like(t) for t in outs]
    with MemoryTracker(torch.device("cpu")) as back:
        torch.autograd.backward(outs, grads)
    return sum(saved.values()), fwd, max(0, int(back.peak_bytes) - _nbytes(wanted))


def _storage_nbytes(t: torch.Tensor) -> int:
    """Bytes of the storage ``t`` views (0 where it has none to read)."""
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # no storage (sparse, ...)
        return 0


def compact(x: Any) -> Any:
    """``x``, or a copy of it if it views part of a larger storage."""
    try:
        if isinstance(x, torch.Tensor) and x.untyped_storage().nbytes() > \
                x.numel() * x.element_size():
            return x.clone()
    except (RuntimeError, NotImplementedError):  # no storage (sparse, ...)
        pass
    return x


_CONV_CALLS = ("conv1d", "conv2d", "conv3d", "convolution")


def call_config(n: fx.Node, in_shapes: list | None) -> dict[str, Any]:
    """A functional layer call's configuration, as a layer module's would read (its cost and
    scratch depend on it): a convolution's channels, kernel, stride, padding, dilation and
    groups from its arguments and input shapes (``F.conv2d``, an exported ``aten.conv2d`` or
    ``aten.convolution``); a dropout's probability. Empty for other calls."""
    name = getattr(n.target, "__name__", str(n.target)).split(".")[0]
    args = list(n.args)
    if "dropout" in name:
        p = n.kwargs.get("p", args[1] if len(args) > 1 else None)
        return {"p": float(p)} if isinstance(p, (int, float)) else {}
    if name not in _CONV_CALLS or not in_shapes or len(in_shapes) < 2 or not in_shapes[1]:
        return {}
    weight = [int(d) for d in in_shapes[1]]
    dims = len(weight) - 2
    keys = ("stride", "padding", "dilation", "transposed", "output_padding", "groups") \
        if name == "convolution" else ("stride", "padding", "dilation", "groups")
    given = dict(zip(keys, args[3:]))
    given.update({k: v for k, v in n.kwargs.items() if k in keys})
    if given.get("transposed"):
        return {}

    def per_dim(value: Any, default: int) -> list[int] | None:
        value = default if value is None else value
        if isinstance(value, int):
            return [value] * dims
        if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
            return [int(v) for v in value] * (dims if len(value) == 1 else 1)
        return None  # (padding="same")

    groups = given.get("groups", 1)
    config: dict[str, Any] = {"in_channels": int(in_shapes[0][1]), "out_channels": weight[0],
                              "kernel_size": weight[2:],
                              "groups": int(groups) if isinstance(groups, int) else 1}
    for key, default in (("stride", 1), ("padding", 0), ("dilation", 1)):
        value = per_dim(given.get(key), default)
        if value is not None:
            config[key] = value
    return config


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def _run_recorder(gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...], fake: bool,
                  measure: Iterable[str] = ()) -> Recorder:
    # an input that views a larger tensor (a micro-batch sliced off an example batch) would be
    # counted at its whole storage where a layer saves it: record on compact copies
    inputs = tuple(compact(x) for x in inputs)
    state = list(gm.parameters()) + list(gm.buffers())
    rec = Recorder(gm, measure)
    kept = [(b, b.detach().clone()) for b in gm.buffers()]  # batch norm counts even when fake
    with torch.enable_grad():
        if fake:
            from torch._subclasses.fake_tensor import FakeTensorMode
            with weightless_mode(gm) or FakeTensorMode(allow_non_fake_inputs=True) as mode:
                result = rec.run(*(mode.from_tensor(x) for x in inputs))
                # parameters were converted to fake tensors on first use (memoised): exclude
                # what autograd saved of them by their fake storages
                exclude = {StorageWeakRef(mode.from_tensor(t).untyped_storage()) for t in state}
        else:
            result = rec.run(*inputs)
            exclude = set()
    outs = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor) and
            t.is_floating_point()]
    rec.differentiable = not outs or any(t.requires_grad for t in outs) or \
        not any(p.requires_grad for p in gm.parameters())
    with torch.no_grad():
        for b, value in kept:
            b.copy_(value)
    exclude |= {StorageWeakRef(t.untyped_storage()) for t in state}
    rec.saved = rec.saved_by_node(exclude)
    return rec


def record(gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...], *, fake: bool = True,
           measure: Iterable[str] = ()) -> Recorder:
    """Run ``gm`` once on ``inputs``, recording bytes and shapes; model failures → ModelError.
    The leaf modules ``measure`` names are measured on real tensors too (:class:`Recorder`)."""
    shapes = ", ".join("x".join(map(str, x.shape)) for x in inputs)
    try:
        return _run_recorder(gm, inputs, fake, measure)
    except Exception as fake_error:
        if not fake and "more than 1 value per channel" in str(fake_error):  # batch norm
            raise ModelError(f"batch norm cannot train on a micro-batch of {inputs[0].shape[0]} "
                             f"(input {shapes}): it needs more than one value per channel; use "
                             "a larger batch or fewer micro-batches") from fake_error
        if not fake:
            raise ModelError(f"the model fails on an input of shape {shapes}: "
                             f"{type(fake_error).__name__}: {first_line(fake_error)}; check "
                             "--input-shape") from fake_error
        log.debug("fake-tensor run failed (%s); running for real", fake_error)
        # a model built without its weights (or fake inputs) runs on stand-in values
        from outcore.graph.capture.export import real_parameters, values_of
        with real_parameters(gm):
            return record(gm, tuple(values_of(x) for x in inputs), fake=False,
                          measure=measure)
