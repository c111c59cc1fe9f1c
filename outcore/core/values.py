"""What every fx node's value looks like at the micro-batch size (from one fake-tensor pass).

Receivers preallocate buffers and rebuild values from this: no shapes travel on the wire.
A value is a pytree; its tensor leaves travel, its other leaves (ints from ``size()``, None)
are the same on every rank and are restored from here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import TreeSpec, tree_flatten, tree_map, tree_unflatten


@dataclass(frozen=True)
class LeafMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool

    @property
    def differentiable(self) -> bool:
        return self.requires_grad and (self.dtype.is_floating_point or self.dtype.is_complex)


@dataclass(frozen=True)
class ValueMeta:
    """Structure of one node's value: pytree spec, per-leaf tensor meta or constant; and
    whether a tensor of it shares memory with one of the node's inputs (a view, an element of
    a tuple, ``nn.Identity``, dropout with p = 0: an in-place write into it writes the input)."""

    spec: TreeSpec
    leaves: tuple[LeafMeta | Any, ...]
    aliases_input: bool = False

    @property
    def tensor_positions(self) -> list[int]:
        return [i for i, x in enumerate(self.leaves) if isinstance(x, LeafMeta)]

    def tensor_leaves(self) -> list[LeafMeta]:
        return [x for x in self.leaves if isinstance(x, LeafMeta)]

    @functools.cached_property
    def one_tensor(self) -> bool:
        """The value is a single tensor (most are)."""
        return len(self.leaves) == 1 and isinstance(self.leaves[0], LeafMeta) \
            and self.spec.is_leaf()

    def rebuild(self, tensors: list[torch.Tensor]) -> Any:
        """The value, from its tensor leaves (in order) and the recorded constants."""
        if self.one_tensor:
            return tensors[0]
        it = iter(tensors)
        leaves = [next(it) if isinstance(x, LeafMeta) else x for x in self.leaves]
        return tree_unflatten(leaves, self.spec)


def tensors_of(value: Any) -> list[torch.Tensor]:
    """Tensor leaves of a value, in pytree order."""
    if isinstance(value, torch.Tensor):  # the usual value: one tensor, no pytree walk
        return [value]
    leaves, _ = tree_flatten(value)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def local(t: torch.Tensor) -> torch.Tensor:
    """This process's shard of a tensor-parallel parameter or gradient (a DTensor), else
    ``t``."""
    if type(t) is torch.Tensor:  # the usual case, without a failing attribute lookup
        return t
    return t.to_local() if hasattr(t, "to_local") else t


class _MetaRecorder(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.meta: dict[str, ValueMeta] = {}

    def run_node(self, n: fx.Node) -> Any:
        try:
            result = super().run_node(n)
        except Exception as e:  # noqa: BLE001 - only a leaf that reads a value is retried
            if n.op != "call_module" or "DataDependent" not in type(e).__name__:
                raise
            result = self._run_on_zeros(n)
        leaves, spec = tree_flatten(result)
        self.meta[n.name] = ValueMeta(spec, tuple(
            # a tensor-parallel shard (DTensor) travels as its local tensor
            LeafMeta(tuple(local(x).shape), x.dtype, bool(x.requires_grad))
            if isinstance(x, torch.Tensor) else x for x in leaves), self._aliases(n, leaves))
        return result

    def _run_on_zeros(self, n: fx.Node) -> Any:
        """A leaf module that reads a tensor's value (``if x.sum() > 0``, which a fake tensor
        cannot answer), run on real zeros of its inputs' shapes with zeros for weights; its
        outputs, made fake again, carry the shapes and dtypes on."""
        from torch._guards import detect_fake_mode
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        from outcore.graph.capture.recorder import stand_ins

        args, kwargs = self.fetch_args_kwargs_from_env(n)
        mode = detect_fake_mode((args, kwargs))
        module = self.module.get_submodule(str(n.target))
        with unset_fake_temporarily():
            params, args, kwargs = stand_ins(module, args, kwargs)
            result = torch.func.functional_call(module, params, args, kwargs)
        if mode is None:
            return result
        return tree_map(lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x,
                        result)

    def _aliases(self, n: fx.Node, leaves: list[Any]) -> bool:
        if n.op not in ("call_function", "call_method", "call_module"):
            return False
        mine = {_storage(x) for x in leaves if isinstance(x, torch.Tensor)}
        mine.discard(None)
        return bool(mine) and any(_storage(t) in mine for inp in n.all_input_nodes
                                  for t in tensors_of(self.env.get(inp)))


def _storage(t: torch.Tensor) -> Any:
    """A key of ``t``'s memory, or None (no storage: a DTensor, a sparse tensor)."""
    try:
        return StorageWeakRef(local(t).untyped_storage())
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def value_metas(gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...], *, precision: str = "32",
                device: torch.device | None = None) -> dict[str, ValueMeta]:
    """Meta of every node's value for ``inputs`` (run under FakeTensorMode: no memory), in
    ``precision`` as autocast on ``device`` makes it (its rules differ by device: CUDA keeps
    softmax and norms in float32, the CPU does not, so on a GPU the pass runs on fake tensors
    of that device).

    The model's real buffers are left as they were: a batch norm counts its batches in
    Python (``num_batches_tracked.add_(1)``), on the real tensor, even in a fake run."""
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

    from outcore.hardware.precision import autocast, autocast_dtype

    dev = torch.device(device or "cpu")
    on_device = dev.type != "cpu" and autocast_dtype(precision) is not None
    counters = [(b, b.clone()) for b in gm.buffers()
                if not b.is_floating_point() and b.device.type != "meta" and not is_fake(b)]
    rec = _MetaRecorder(gm)
    try:
        with torch.enable_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
            args = [mode.from_tensor(x) for x in inputs]
            if not on_device:
                with autocast(precision, "cpu"):
                    rec.run(*args)
            else:
                from torch.nn.utils.stateless import _reparametrize_module
                state = {k: _fake_on(t, dev) for k, t in
                         [*gm.named_parameters(remove_duplicate=False),
                          *gm.named_buffers(remove_duplicate=False)]}
                with _reparametrize_module(gm, state, tie_weights=True), \
                        autocast(precision, dev):
                    rec.run(*(x.to(dev) for x in args))
    finally:
        with torch.no_grad():
            for b, before in counters:
                b.copy_(before)
    return rec.meta


def _fake_on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake tensor like ``t`` on ``device`` (made inside the active FakeTensorMode); a
    tensor-parallel shard stays a shard (of a fake local tensor on ``device``)."""
    if hasattr(t, "to_local"):
        from torch.distributed.tensor import DTensor
        local = _fake_on(t.to_local(), device).detach()
        return DTensor.from_local(local, t.device_mesh, t.placements,
                                  run_check=False).requires_grad_(t.requires_grad)
    out = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device)
    return out.requires_grad_(t.requires_grad)
