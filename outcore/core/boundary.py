"""Where a piece's autograd graph meets its neighbours' on the same rank.

A piece's forward starts from its inputs detached from their producers' graphs, and its
backward from the gradients its consumers returned; the two ends are here. An output another
piece reads is dropped once read (:class:`Roots`: the backward starts from its gradient edge);
a large input from a piece of the same rank enters through :class:`Entry`, which does not hold
it (an autograd leaf would, through the node that accumulates its gradient).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.graph import get_gradient_edge

from outcore.core.values import ValueMeta, tensors_of
from outcore.schedule.ir import ENTRY_MIN_BYTES

_engine_backward = getattr(torch.autograd.graph, "_engine_run_backward", None)


class Edge:
    """Where a dropped output's gradient enters autograd (its gradient edge), with the
    output's shape and dtype to check the gradient against."""

    __slots__ = ("edge", "shape", "dtype")

    def __init__(self, t: torch.Tensor):
        self.edge = get_gradient_edge(t)
        self.shape, self.dtype = t.shape, t.dtype


class Roots:
    """A read output's backward roots, without its data: per tensor leaf an :class:`Edge`
    (a plain tensor that requires grad), the tensor itself (a DTensor: its gradient is made
    like it) or None."""

    __slots__ = ("roots",)

    def __init__(self, value: Any):
        self.roots = [(Edge(t) if type(t) is torch.Tensor else t) if t.requires_grad else None
                      for t in tensors_of(value)]


def run_backward(roots: list[Any], grads: list[torch.Tensor | None]) -> None:
    """``torch.autograd.backward(roots, grads)`` (a root is a tensor or an :class:`Edge`).
    When every root is a plain tensor or edge given a gradient of its shape (a piece's outputs
    and the gradients its consumers returned), straight into autograd's engine: the public
    call's argument handling (subclass dispatch, filling in and checking gradients) costs
    ~4.5 us a call on a 2-core VM, paid by every backward piece. Anything else (a loss, a
    DTensor) goes through the public call."""
    if _engine_backward is not None and all(
            g is not None and type(g) is torch.Tensor and type(r) in (torch.Tensor, Edge)
            and g.shape == r.shape and g.dtype == r.dtype for r, g in zip(roots, grads)):
        _engine_backward(tuple(r.edge if type(r) is Edge else r for r in roots), tuple(grads),
                         False, False, (), allow_unreachable=True, accumulate_grad=True)
    else:
        torch.autograd.backward([r.edge if type(r) is Edge else r for r in roots], grads)


# a local input at least ENTRY_MIN_BYTES large enters its piece through :class:`Entry` (which
# does not hold it); smaller ones become autograd leaves (~3 us cheaper per forward and
# backward), held until the piece's backward


class Box:
    """Receives the gradient of a piece's input from :class:`Entry`'s backward."""

    __slots__ = ("grad",)

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None


class Entry(torch.autograd.Function):
    """A piece's input from another piece of this rank: the forward returns it as is (a view);
    the backward puts its gradient in a :class:`Box`. An autograd leaf would do the same, but
    autograd's node that accumulates a leaf's gradient holds the leaf, so every piece input
    would stay until the piece's backward; through this function it stays only where a layer
    saved it. ``anchor`` is a scalar that requires grad (the function's output must); it gets
    no gradient."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, x: torch.Tensor, box: Box) -> torch.Tensor:
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        ctx.box.grad = grad
        return None, None, None


def entry_tree(value: Any, meta: ValueMeta, anchor: torch.Tensor) -> tuple[Any, list[Any]]:
    """``value`` for a consuming piece, each differentiable tensor detached from its producer's
    autograd graph (:class:`Entry`, or a fresh leaf when small or not a plain tensor), and per
    tensor what will hold its gradient after the piece's backward (None: not differentiable)."""
    tensors = tensors_of(value)
    out, holders = [], []
    for t, m in zip(tensors, meta.tensor_leaves()):
        if not (m.differentiable and t.requires_grad):
            out.append(t.detach())
            holders.append(None)
        elif type(t) is torch.Tensor and t.numel() * t.element_size() >= ENTRY_MIN_BYTES:
            box = Box()
            out.append(Entry.apply(anchor, t.detach(), box))
            holders.append(box)
        else:
            x = t.detach().requires_grad_(True)
            out.append(x)
            holders.append(x)
    return meta.rebuild(out), holders


def owned(t: torch.Tensor) -> bool:
    """Whether a gradient is a tensor of its own: contiguous, the whole of its storage (not an
    expanded view autograd may hand back, nor a slice of a received message), and not part
    of a graph, so it can be summed into in place or kept as a ``.grad``."""
    return type(t) is torch.Tensor and not t.requires_grad and t.is_contiguous() and \
        t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def into_grad(p: torch.Tensor, g: torch.Tensor) -> None:
    """Add ``g`` to the leaf ``p``'s ``.grad`` as autograd's accumulation would, but keeping
    ``g`` itself where it is a tensor of its own (autograd copies a gradient the caller still
    holds: the copy of a tied weight's gradient put its stage over the plan)."""
    with torch.no_grad():
        if p.grad is None:
            p.grad = g if owned(g) else g.clone()
        else:
            p.grad.add_(g)


def like(p: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
    """``shard`` as a gradient of ``p``: a DTensor on ``p``'s mesh when ``p`` is one."""
    if not hasattr(p, "to_local"):
        return shard
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(shard, p.device_mesh, p.placements, run_check=False)
