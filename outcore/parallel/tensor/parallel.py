"""Split an existing model's layers over a tensor-parallel group, in place.

The layout (which Linears pair Megatron-style, which are split alone, which stay whole) comes from
the captured graph (:func:`outcore.graph.tensor_pairs.find_layout`); the splitting itself is
``torch.distributed.tensor``'s: ``parallelize_module`` with ``ColwiseParallel`` /
``RowwiseParallel`` turns each weight into a DTensor shard and inserts the collectives at the
module boundaries (Megatron-LM, Shoeybi et al. 2019, section 3). ``mode="depth"`` instead shards
every weight over the group ZeRO-3 / FSDP-style with ``torch.distributed.fsdp.fully_shard``
(all-gather before use, reduce-scatter of gradients; Rajbhandari et al., SC 2020; AxoNN's depth
dimension, Singh et al., SC 2024, section 3). outcore's own parts: the pairing from the graph, the
head-count update of an attention module whose heads are split, re-tying shared weights (an LM's
embedding and output layer), and the check that the split model computes what the whole one did.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from outcore.errors import CaptureError, ModelError, UsageError
from outcore.graph.tensor_pairs import DEFAULT_MIN_SPLIT_BYTES, TensorLayout, find_layout
from outcore.parallel.tensor.heads import divide_heads

log = logging.getLogger(__name__)

__all__ = ["tensor_parallel", "layout_of", "tensor_mesh", "grid_mesh", "depth_units", "MODES",
           "split_for_plan", "split_traced_for_plan", "is_exported"]

MODES = ("1d", "depth", "2d")


def tensor_mesh(tp: int, *, mesh: Any = None, group: Any = None) -> Any:
    """The 1-D ``DeviceMesh`` of the tensor-parallel group: ``mesh`` as given, a mesh over
    ``group``, or (neither given) over every rank of the job, which must then number ``tp``."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    _require_dist()
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    if mesh is None and group is not None:
        mesh = DeviceMesh.from_group(group, device)
    if mesh is None:
        if dist.get_world_size() != tp:
            raise UsageError(f"tp={tp} but the job has {dist.get_world_size()} ranks: pass the "
                             "tensor-parallel process group (group=) or mesh (mesh=)")
        mesh = init_device_mesh(device, (tp,))
    if mesh.ndim != 1 or mesh.size() != tp:
        raise UsageError(f"the tensor-parallel mesh must be 1-D with {tp} ranks, got shape "
                         f"{tuple(mesh.shape)}")
    return mesh


def _require_dist() -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise UsageError("tensor parallelism needs torch.distributed initialised: call "
                         "torch.distributed.init_process_group first (or run under outcore "
                         "train / torchrun)")


def grid_mesh(tp: int, depth: int) -> Any:
    """A 2-D ``("depth", "tp")`` ``DeviceMesh`` over every rank of the job (``tp x depth``)."""
    from torch.distributed.device_mesh import init_device_mesh

    _require_dist()
    if dist.get_world_size() != tp * depth:
        raise UsageError(f"tp={tp} x depth={depth} needs {tp * depth} ranks, the job has "
                         f"{dist.get_world_size()}: pass a 2-D mesh (mesh=)")
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    return init_device_mesh(device, (depth, tp), mesh_dim_names=("depth", "tp"))


def layout_of(model: nn.Module, tp: int, example_inputs: Any = None, *,
              min_split_bytes: int = DEFAULT_MIN_SPLIT_BYTES) -> TensorLayout:
    """The layout :func:`tensor_parallel` applies. Without ``example_inputs`` the graph has no
    shapes, so attention pairs (which need the head split seen in a reshape) are not found."""
    from outcore.graph.capture import capture, structure

    if example_inputs is None:
        g = structure(model)
    else:
        inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
        try:
            g = capture(model, inputs, path="fx")
        except CaptureError:
            g = None
        if g is None or g.meta.get("forced_leaves"):
            # fx could not see inside part of the model: torch.export sees every op
            from outcore.parallel.tensor.export_graph import graph_from_export
            log.info("torch.fx cannot trace all of %s; capturing with torch.export",
                     type(model).__name__)
            try:
                g = graph_from_export(model, inputs)
            except CaptureError:
                if g is None:
                    raise
                log.warning("torch.export failed too: layers inside %s stay whole",
                            ", ".join(g.meta["forced_leaves"]))
    return find_layout(g, tp, min_split_bytes=min_split_bytes)  # shared weights untied there


def tensor_parallel(model: nn.Module, tp: int, *, mesh: Any = None, group: Any = None,
                    mode: str = "1d", example_inputs: Any = None,
                    min_split_bytes: int = DEFAULT_MIN_SPLIT_BYTES,
                    check: bool = True, depth: int = 1,
                    grid: tuple[int, int] | None = None) -> nn.Module:
    """Parallelise ``model`` in place over a tensor-parallel group of ``tp`` ranks; return it.

    Args:
        model: any ``nn.Module``, identical on every rank of the group (same seed).
        tp: ranks in the group.
        mesh, group: the group as a 1-D ``DeviceMesh`` or a process group (default: every rank).
        mode: ``"1d"``: Megatron layout (pairs from the graph, others alone or whole), every
            rank fed the same batch; ``"depth"``: FSDP/ZeRO-3 sharding of every weight over the
            group, every rank fed its own slice of the batch (data parallel with sharded state).
        example_inputs: one batch (tensor or tuple); gives the graph shapes (attention pairs)
            and lets ``check`` run. Models torch.fx cannot trace need it (torch.export).
        min_split_bytes: layers (pairs: together) with fewer parameter bytes stay whole.
        check: with ``example_inputs`` and ``mode="1d"``, compare the split model's output with
            the whole model's and raise :class:`ModelError` if they differ.
        depth: with ``mode="1d"``, also shard the split model FSDP-style over ``depth``
            tensor-parallel groups (torchtitan's 2-D recipe: ``parallelize_module`` on the
            ``tp`` dimension, ``fully_shard`` on the other). Needs ``tp x depth`` ranks, or a
            2-D ``mesh`` with dimensions named ``("depth", "tp")``; rank ``d * tp + t`` is
            tensor rank ``t`` of depth group ``d``, fed batch slice ``d``.
        grid: with ``mode="2d"``, ``(rows, cols)`` with ``rows x cols = tp``: AxoNN's 2-D
            layout (:mod:`outcore.parallel.tensor.grid`): each pair's Linears split over both, heads
            over ``cols``; layers that do not pair stay whole. Every rank fed the same batch.

    The layout is kept as ``model.outcore_tensor_layout`` (a :class:`TensorLayout`).
    """
    if mode not in MODES:
        raise UsageError(f"unknown tensor-parallel mode {mode!r}: use one of {', '.join(MODES)}")
    if tp < 1:
        raise UsageError(f"tp must be >= 1, got {tp}")
    depth_mesh = None
    if depth > 1:
        if mode != "1d":
            raise UsageError("depth > 1 composes with mode='1d' (mode='depth' already shards "
                             "over the whole group)")
        grid = mesh if mesh is not None and mesh.ndim == 2 else grid_mesh(tp, depth)
        mesh, depth_mesh = grid["tp"], grid["depth"]
    if mode == "2d":
        return _tensor_grid(model, tp, grid, example_inputs, min_split_bytes, check)
    mesh = tensor_mesh(tp, mesh=mesh, group=group)
    layout = layout_of(model, tp, example_inputs, min_split_bytes=min_split_bytes)
    if mode == "depth":
        _shard_depth(model, layout, mesh, min_split_bytes)
    else:
        reference = _reference_output(model, example_inputs) if check else None
        _split_1d(model, layout, mesh)
        if reference is not None:
            _check(model, example_inputs, reference, layout)
        if depth_mesh is not None:
            _shard_depth(model, layout, depth_mesh, min_split_bytes)
    model.outcore_tensor_layout = layout
    log.info("tensor parallel (%s, tp=%d): %d pairs, %d modules split", mode, tp,
             len(layout.pairs), len(layout.split_modules))
    return model


def _tensor_grid(model: nn.Module, tp: int, grid: tuple[int, int] | None, example_inputs: Any,
                 min_split_bytes: int, check: bool) -> nn.Module:
    """:func:`tensor_parallel` with ``mode="2d"``."""
    from dataclasses import replace

    from outcore.parallel.tensor.grid import split_grid
    if grid is None or len(grid) != 2 or grid[0] * grid[1] != tp or min(grid) < 1:
        raise UsageError(f"mode='2d' needs grid=(rows, cols) with rows x cols = tp = {tp}, "
                         f"got {grid}")
    rows, cols = grid
    layout = layout_of(model, cols, example_inputs, min_split_bytes=min_split_bytes)
    reference = _reference_output(model, example_inputs) if check else None
    done = split_grid(model, layout, rows, cols)
    pairs = tuple(layout.pairs[k] for k in done)
    members = {m: i for i, p in enumerate(pairs) for m in p.columns + p.rows}
    splits = tuple(replace(s, pair=members[s.module]) if s.module in members else
                   replace(s, style="whole", pair=None, reason="not in a pair (2-D grid)")
                   for s in layout.splits)
    layout = TensorLayout(tp=tp, pairs=pairs, splits=splits)
    if reference is not None:
        _check(model, example_inputs, reference, layout)
    model.outcore_tensor_layout = layout
    return model


def split_for_plan(model: nn.Module, graph: Any, tp: int) -> TensorLayout:
    """Split ``model`` in place the way a plan with ``layout.tp = tp`` costs it: the Megatron
    layout of its layer graph ``graph`` (:func:`outcore.cost.tensor.tensor_graph`'s threshold),
    every rank ``slot * tp + t`` of the job holding shard ``t`` (a ``(slots, tp)`` mesh). Call
    it on every rank, before tracing the model (attention modules' head counts change)."""
    from outcore.cost.tensor import plan_layout

    mesh = _slot_mesh(tp)
    layout = plan_layout(graph, tp)  # a shared weight split two ways is left whole there
    _split_1d(model, layout, mesh)
    model.outcore_tensor_layout = layout
    log.info("tensor parallel inside the plan's slots (tp=%d): %d pairs, %d modules split", tp,
             len(layout.pairs), len(layout.split_modules))
    return layout


def is_exported(graph: Any) -> bool:
    """Whether ``graph`` was captured through ``torch.export`` (its layers are ATen calls)."""
    return (graph.meta.get("capture") or {}).get("path") == "export"


def split_traced_for_plan(gm: Any, graph: Any, tp: int) -> TensorLayout:
    """:func:`split_for_plan` for a model captured through ``torch.export``: the same layout,
    written into its exported trace ``gm`` (node names = ``graph``'s) by
    :func:`outcore.parallel.tensor.graph_split.split_graph`. Call it on every rank, after
    tracing."""
    from outcore.cost.tensor import plan_layout
    from outcore.parallel.tensor.graph_split import split_graph

    mesh = _slot_mesh(tp)
    layout = plan_layout(graph, tp)
    split_graph(gm, graph, layout, mesh)
    log.info("tensor parallel in the exported graph (tp=%d): %d pairs, %d layers split", tp,
             len(layout.pairs), len(layout.split_modules))
    return layout


def _slot_mesh(tp: int) -> Any:
    """The ``tp`` dimension of a ``("slot", "tp")`` mesh over every rank of the job."""
    from torch.distributed.device_mesh import init_device_mesh

    _require_dist()
    world = dist.get_world_size()
    if world % tp:
        raise UsageError(f"tp={tp} does not divide the job's {world} ranks")
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    return init_device_mesh(device, (world // tp, tp), mesh_dim_names=("slot", "tp"))["tp"]


# ------------------------------------------------------------------------------ 1-D


def _style(name: str) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"colwise": lambda: ColwiseParallel(),
            "rowwise": lambda: RowwiseParallel(),
            "colwise_gather": lambda: ColwiseParallel(output_layouts=Replicate()),
            "rowwise_alone": lambda: RowwiseParallel(input_layouts=Replicate()),
            "vocab": lambda: RowwiseParallel(input_layouts=Replicate()),
            "embed_dim": lambda: ColwiseParallel(output_layouts=Replicate())}[name]()


def _split_1d(model: nn.Module, layout: TensorLayout, mesh: Any) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    from outcore.parallel.tensor.graph_split import set_tensor_mesh

    set_tensor_mesh(mesh)  # per-head operands are sliced after tracing (trainer)
    ties = _ties(model)
    own = {s.module: s.style for s in layout.splits
           if s.style != "whole" and layout.chunks(s) == 1 and _own_split(model, s.module)}
    plan = {s.module: _style(s.style) for s in layout.splits
            if s.style != "whole" and layout.chunks(s) == 1 and s.module not in own}
    if plan:
        parallelize_module(model, mesh, plan)
    for path, style in own.items():
        _split_own(model.get_submodule(path), style, mesh)
    for s in layout.splits:
        if layout.chunks(s) > 1:
            _split_chunkwise(model.get_submodule(s.module), mesh, layout.chunks(s))
    _retie(model, ties)
    for pair in layout.pairs:
        if pair.heads:
            divide_heads(model, pair, layout.tp)


def _split_chunkwise(linear: nn.Module, mesh: Any, chunks: int) -> None:
    """Column-split a fused projection (``chunks`` equal parts of its output: q, k, v): each
    rank holds its ``1/tp`` of every part (``_StridedShard``; DTensor's Linear rules know only
    contiguous shards, so the layer computes on the local shards with Megatron's ``f``)."""
    import types

    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

    from outcore.parallel.tensor.graph_split import chunkwise_shard, tp_colwise_linear
    if not isinstance(linear, nn.Linear):
        raise UsageError(f"cannot split the fused projection {type(linear).__name__} chunk by "
                         "chunk: only nn.Linear; use --tp 1")
    for name in ("weight", "bias"):
        p = getattr(linear, name)
        if p is None:
            continue
        local = chunkwise_shard(p.detach(), 0, chunks, mesh.size(), mesh.get_local_rank())
        shard = DTensor.from_local(local.clone(), mesh, [_StridedShard(0, split_factor=chunks)],
                                   run_check=False)
        linear.register_parameter(name, nn.Parameter(shard, requires_grad=p.requires_grad))
    linear.outcore_tp_call = tp_colwise_linear
    linear.forward = types.MethodType(_split_linear_forward, linear)


def _own_split(model: nn.Module, path: str) -> bool:
    """Whether the layer at ``path`` is split by :func:`_split_own` rather than DTensor's
    module styles: a plain Linear or Embedding (not an Embedding with ``max_norm``, which
    renormalises the whole table in place, nor a sparse one; a subclass may compute
    otherwise, and keeps DTensor's styles)."""
    m = model.get_submodule(path)
    if type(m) is nn.Embedding:
        return m.max_norm is None and not m.sparse
    return type(m) is nn.Linear


def _split_linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A split Linear's forward: its split function (``outcore_tp_call``) on its shards."""
    return self.outcore_tp_call(x, self.weight, self.bias)


def _split_embedding_forward(self: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    pad = -1 if self.padding_idx is None else self.padding_idx
    return self.outcore_tp_call(self.weight, ids, pad, self.scale_grad_by_freq)


def _split_own(layer: nn.Module, style: str, mesh: Any) -> None:
    """Split a Linear or Embedding with the functions the exported graphs run
    (:mod:`~outcore.parallel.tensor.graph_split`: Megatron's collectives, synchronous).
    DTensor's styles compute the same, but a vocabulary-split Embedding's backward makes the
    gradient of the whole table on every rank and keeps it whole until the optimizer step
    (which then copies this rank's rows out of it), and the buffer of an asynchronous
    collective can stay referenced into the backward, or be freed by gloo's thread, where
    the CPU tracker does not see it go."""
    import types

    from torch.distributed.tensor import Shard, distribute_tensor

    from outcore.parallel.tensor.graph_split import split_style

    call, w_dim, b_dim = split_style(style)
    for name, dim in (("weight", w_dim), ("bias", b_dim)):
        p = getattr(layer, name, None)
        if p is None or dim is None:
            continue
        shard = distribute_tensor(p.detach(), mesh, [Shard(dim)])
        layer.register_parameter(name, nn.Parameter(shard, requires_grad=p.requires_grad))
    layer.outcore_tp_call = call
    forward = _split_embedding_forward if isinstance(layer, nn.Embedding) \
        else _split_linear_forward
    layer.forward = types.MethodType(forward, layer)


def _ties(model: nn.Module) -> list[list[tuple[str, str]]]:
    """Groups of (module path, parameter name) holding one shared parameter."""
    seen: dict[int, list[tuple[str, str]]] = {}
    for path, mod in model.named_modules(remove_duplicate=False):
        for name, p in mod.named_parameters(recurse=False):
            seen.setdefault(id(p), [])
            if (path, name) not in seen[id(p)]:
                seen[id(p)].append((path, name))
    return [g for g in seen.values() if len(g) > 1]


def _retie(model: nn.Module, ties: list[list[tuple[str, str]]]) -> None:
    for group in ties:
        first = getattr(model.get_submodule(group[0][0]), group[0][1])
        for path, name in group[1:]:
            setattr(model.get_submodule(path), name, first)


# ------------------------------------------------------------------------------ depth


def _shard_depth(model: nn.Module, layout: TensorLayout, mesh: Any, min_bytes: int) -> None:
    """FSDP units: every repeated block (:func:`depth_units`), or, in a model without
    repeated blocks, every Linear / Embedding of at least ``min_bytes``; the root takes the
    rest (each unit is one all-gather and one reduce-scatter: fewer, larger units cost fewer
    collective latencies, smaller ones a lower peak). Shared weights go with
    the root (one parameter cannot belong to two units)."""
    from torch.distributed.fsdp import fully_shard

    shared = {p for group in _ties(model) for p, _ in group}
    units = depth_units(model) or [s.module for s in layout.splits
                                   if s.param_bytes >= min_bytes and s.module
                                   and s.module not in shared]
    units = [u for u in units if not any(t.startswith(u + ".") for t in shared)]
    for path in sorted(units, key=lambda u: -u.count(".")):  # innermost first
        fully_shard(model.get_submodule(path), mesh=mesh)
    fully_shard(model, mesh=mesh)


def depth_units(model: nn.Module) -> list[str]:
    """The repeated blocks of ``model``: children of the outermost ``ModuleList`` /
    ``Sequential`` whose two or more children share one type and hold a Linear or Embedding
    (the granularity torchtitan gives ``fully_shard``: one all-gather per transformer block
    instead of one per layer)."""
    found: list[str] = []
    for path, mod in model.named_modules():
        if any(path.startswith(f + ".") or path == f for f in found):
            continue
        kids = list(mod.named_children())
        if isinstance(mod, (nn.ModuleList, nn.Sequential)) and len(kids) >= 2 and \
                len({type(c) for _, c in kids}) == 1 and \
                any(isinstance(m, (nn.Linear, nn.Embedding)) for m in kids[0][1].modules()):
            found.append(path)
    return [f"{p}.{name}" if p else name for p in found
            for name, _ in model.get_submodule(p).named_children()]


# ------------------------------------------------------------------------------ check


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def _first_tensor(out: Any) -> torch.Tensor:
    from torch.utils._pytree import tree_leaves
    return next(t for t in tree_leaves(out if not hasattr(out, "to_tuple") else out.to_tuple())
                if isinstance(t, torch.Tensor))


def _reference_output(model: nn.Module, example_inputs: Any) -> torch.Tensor | None:
    if example_inputs is None:
        return None
    was = model.training
    model.eval()
    with torch.no_grad():
        out = _first_tensor(model(*_as_tuple(example_inputs))).detach().clone()
    model.train(was)
    return out


def _check(model: nn.Module, example_inputs: Any, reference: torch.Tensor,
           layout: TensorLayout) -> None:
    try:
        got = _reference_output(model, example_inputs)
    except Exception as e:  # a consumer of a split tensor expected the whole width
        raise ModelError(f"the tensor-parallel model fails on the example input "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:200]}) under the "
                         f"layout:\n{layout.summary()}\na consumer of a split layer reads "
                         "the whole width (a hard-coded size?); raise min_split_bytes to keep "
                         "that layer whole, or size the reshape with -1") from e
    if hasattr(got, "full_tensor"):
        got = got.full_tensor()
    scale = max(reference.abs().max().item(), 1e-6)
    err = (got - reference).abs().max().item()
    if err > 1e-4 * scale:
        raise ModelError(f"the tensor-parallel model computes a different output (max error "
                         f"{err:.3g}, scale {scale:.3g}) under the layout:\n{layout.summary()}\n"
                         "a split layer's consumer reads the split dimension in a way the graph "
                         "did not show; raise min_split_bytes or report the model")
