"""Build one rank's executable pieces from the traced model and the plan.

Every piece becomes its own ``fx.GraphModule`` whose inputs are the values it receives (from
other pieces, or the model's inputs) and whose outputs are the values other pieces (or the loss)
need. All pieces of a rank share the rank's one copy of the model's parameters, so a module
used by two pieces accumulates one gradient. Parameters and buffers that no node of this rank
uses are dropped after initialisation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch import nn

from outcore.core.randomness import seed_random_nodes
from outcore.core.values import ValueMeta
from outcore.graph.capture.device import ANCHOR
from outcore.graph.capture.mutation import writes_first_arg
from outcore.plan.pieces import Pieces
from outcore.plan.replicas import fx_name


@dataclass
class PieceModule:
    """One piece, executable.

    Attributes:
        id: piece id.
        module: ``forward(*inputs) -> tuple(outputs)``.
        inputs: per input, the producer fx node name (a placeholder name for model inputs).
        outputs: per output, the fx node name whose value it is.
        model_outputs: fx node names among ``outputs`` that are the model's output.
        clone_inputs: inputs an in-place operation of the piece modifies (they are passed as
            copies, since autograd forbids in-place writes to a received leaf tensor).
        random: whether the piece has random nodes (they draw from the step's context).
        handed_on: ``(input position, name)`` of the inputs it outputs as they are, for
            pieces of its rank that take the same tensor (``plan.pieces._relayed``); the
            executor hands on the input it was given (an in-place layer of this piece may
            have written into its copy).
    """

    id: int
    module: fx.GraphModule
    inputs: list[str]
    outputs: list[str]
    model_outputs: list[str]
    clone_inputs: frozenset[str] = frozenset()
    random: bool = True
    handed_on: tuple[tuple[int, str], ...] = ()


def build_piece_modules(gm: fx.GraphModule, names: list[str], pieces: Pieces, rank: int,
                        metas: Mapping[str, ValueMeta]) -> list[PieceModule]:
    """Piece modules of ``rank``, in piece order.

    Args:
        gm: the traced model (shared; pieces reference its submodules and parameters).
        names: name of each graph node index (the graph ``pieces`` was cut from): the fx node
            name, prefixed ``c<k>/`` in the copies of a replicated plan.
        pieces: the cut of the placed graph.
        rank: this rank.
        metas: every fx node's value (:func:`outcore.core.values.value_metas`): which
            share memory with their inputs.

    A piece's ``inputs``/``outputs`` are graph node names (with the copy prefix); inside the
    module everything is addressed by fx names.
    """
    nodes = {n.name: n for n in gm.graph.nodes}
    piece_of_name = {names[i]: int(p) for i, p in enumerate(pieces.piece_of.tolist())}
    result = []
    for piece in pieces.pieces:
        if piece.device != rank:
            continue
        first = names[piece.nodes[0]]
        prefix = first[:len(first) - len(fx_name(first))]
        members = [fx_name(names[i]) for i in piece.nodes]
        member_set = set(members)
        graph = fx.Graph()
        env: dict[str, fx.Node] = {}
        inputs: list[str] = []
        model_outputs: list[str] = []
        out_values: dict[str, fx.Node] = {}

        def lookup(n: fx.Node) -> fx.Node:
            if n.name in env:
                return env[n.name]
            ph = graph.placeholder(f"in_{n.name}")
            env[n.name] = ph
            inputs.append(n.name)
            return ph

        for name in members:
            n = nodes[name]
            if n.op == "placeholder":
                ph = graph.placeholder(f"in_{n.name}")
                env[n.name] = ph
                inputs.append(n.name)
                continue
            if n.op == "output":
                value = fx.map_arg(n.args[0], lookup)
                env[n.name] = graph.call_function(_identity, (value,))
                model_outputs.append(n.name)
                out_values[n.name] = env[n.name]
                continue
            # make sure external inputs become placeholders before the node is copied
            fx.map_arg((n.args, n.kwargs), lambda a: lookup(a) if a.name not in member_set
                       else a)
            env[n.name] = graph.node_copy(n, lambda a: env[a.name] if a.name in env else lookup(a))
        for name in members:
            if name in out_values:
                continue
            users = nodes[name].users
            if any(piece_of_name.get(prefix + u.name) != piece.id for u in users):
                out_values[name] = env[name]
        for tid in pieces.outputs_of[piece.id]:  # inputs it hands on (plan.pieces._relayed)
            for i in pieces.transfers[tid].tensors:
                name = fx_name(names[i])
                if name not in member_set and name not in out_values:
                    out_values[name] = env[name]
        outputs = list(out_values)
        graph.output(tuple(out_values[k] for k in outputs))
        module = fx.GraphModule(gm, graph, f"piece{piece.id}")
        random = seed_random_nodes(module) > 0  # dropout masks independent of placement
        clone = frozenset(prefix + name for name in inputs
                          if _written(nodes[name], member_set, gm, metas))
        handed = tuple((inputs.index(k), prefix + k) for k in outputs if k in inputs)
        result.append(PieceModule(piece.id, module, [prefix + k for k in inputs],
                                  [prefix + k for k in outputs],
                                  [prefix + k for k in model_outputs], clone, random, handed))
    return result


def _written(n: fx.Node, members: set[str], gm: fx.GraphModule,
             metas: Mapping[str, ValueMeta]) -> bool:
    """Whether an in-place operation of the piece (its ``members``) writes into ``n``'s value:
    directly, or through a value that shares its memory (an element of a received tuple, a
    view, ``nn.Identity``, dropout with p = 0: ``value_metas`` saw which share it). Autograd
    forbids writing into a leaf or a view of one, and the value's other readers must not see
    the write."""
    todo, seen = [n], {n}
    while todo:
        v = todo.pop()
        for u in v.users:
            if u.name not in members:
                continue
            if writes_first_arg(u, gm):
                return True
            meta = metas.get(u.name)
            if u not in seen and meta is not None and meta.aliases_input:
                seen.add(u)
                todo.append(u)
    return False


def _identity(x):
    return x


torch.fx.wrap("_identity")


def param_aliases(gm: fx.GraphModule) -> dict[str, str]:
    """Every parameter name -> the first name of the same tensor (tied weights: an embedding
    and an output layer sharing one weight have two names, one tensor).

    Call before :func:`prune_unowned`. Ranks holding different users of a tied weight know it
    by different names; the first name is the one all of them agree on (gradient buckets,
    checkpoints, returned state)."""
    first: dict[int, str] = {}
    out = {}
    for name, p in gm.named_parameters(remove_duplicate=False):
        out[name] = first.setdefault(id(p), name)
    return out


def prune_unowned(gm: fx.GraphModule, pieces_here: list[PieceModule]) -> list[str]:
    """Drop parameters and buffers no piece of this rank uses; return the kept parameter names.

    The model is built whole (so that a seed gives the same weights as single-process
    training), then each rank keeps only what its nodes touch.
    """
    used_modules: set[str] = set()
    used_attrs: set[str] = set()
    for pm in pieces_here:
        for n in pm.module.graph.nodes:
            if n.op == "call_module":
                used_modules.add(str(n.target))
            elif n.op == "get_attr":
                used_attrs.add(str(n.target))

    def used(qualname: str) -> bool:
        if qualname in used_attrs:
            return True
        return any(qualname == m or qualname.startswith(m + ".") for m in used_modules)

    kept = []
    for qualname, _ in list(gm.named_parameters(remove_duplicate=False)):
        if used(qualname):
            kept.append(qualname)
            continue
        owner, _, attr = qualname.rpartition(".")
        mod = gm.get_submodule(owner) if owner else gm
        if attr in mod._parameters:
            mod._parameters[attr] = nn.Parameter(torch.empty(0, device="meta"),
                                                 requires_grad=False)
    for qualname, _ in list(gm.named_buffers(remove_duplicate=False)):
        if used(qualname) or qualname == ANCHOR:  # the anchor: where the module is
            continue
        owner, _, attr = qualname.rpartition(".")
        mod = gm.get_submodule(owner) if owner else gm
        if attr in mod._buffers and mod._buffers[attr] is not None:
            mod._buffers[attr] = torch.empty(0, device="meta")
    return sorted(set(kept))


def saved_buffers(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``module``'s buffers a state dict holds: not its non-persistent ones (the traced
    module's device anchor and lifted constants, ``outcore.graph.capture.device``)."""
    out = []
    for name, b in module.named_buffers():
        owner, _, attr = name.rpartition(".")
        mod = module.get_submodule(owner) if owner else module
        if attr not in mod._non_persistent_buffers_set:
            out.append((name, b))
    return out


# the least whole bytes of tensor-parallel parameters a rank builds at once (below it, one build)
BUILD_BATCH_FLOOR = 64 << 20


def build_batches(gm: fx.GraphModule, kept: list[str],
                  budget: int | None = None) -> list[list[str]]:
    """``kept`` (parameter names of ``gm``) in the groups a rank builds one after another, so
    that a tensor-parallel rank never holds its slot's split parameters whole at once: each
    group's whole split tensors stay within ``budget`` bytes (default: the rank's share of
    them, at least :data:`BUILD_BATCH_FLOOR`; never less than the largest tensor), and the first
    group also holds every parameter that is not split. Tied names stay in one group. One group
    when nothing is split or everything fits the budget."""
    params = dict(gm.named_parameters(remove_duplicate=False))
    names_of: dict[int, list[str]] = {}
    for n in kept:
        names_of.setdefault(id(params[n]), []).append(n)
    split = {k: math.prod(params[ns[0]].shape) * params[ns[0]].element_size()
             for k, ns in names_of.items() if hasattr(params[ns[0]], "device_mesh")}
    if not split:
        return [list(kept)]
    whole = sum(split.values())
    if budget is None:
        ways = max(params[names_of[k][0]].device_mesh.size() for k in split)
        budget = max(whole // ways, BUILD_BATCH_FLOOR)
    keys = list(split)
    groups = [[n for k in group for n in names_of[k]]
              for group in greedy_groups(keys, [split[k] for k in keys], budget)]
    groups[0] = [n for k, ns in names_of.items() if k not in split for n in ns] + groups[0]
    return groups


def greedy_groups(items: list, sizes: list[int], budget: int) -> list[list]:
    """``items`` in order, in consecutive groups of at most ``budget`` bytes each (an item
    larger than the budget alone); at least one group."""
    groups: list[list] = [[]]
    held = 0
    for item, size in zip(items, sizes):
        if groups[-1] and held + size > budget:
            groups.append([])
            held = 0
        groups[-1].append(item)
        held += size
    return groups


def adopt_values(roots: list[nn.Module], source: nn.Module, names: list[str],
                 buffers: bool = True) -> None:
    """Give the parameters ``names`` and (with ``buffers``) every real buffer of ``roots`` (the
    traced model and the piece modules, which share its tensors) ``source``'s tensors of the
    same names: a model traced without its weights takes the values built for this rank
    (:func:`outcore.zoo.weightless.built_in_part`). Every module holding a replaced tensor
    holds the new one."""
    params = dict(source.named_parameters(remove_duplicate=False))
    made_buffers = dict(source.named_buffers(remove_duplicate=False))
    root = roots[0]
    held = dict(root.named_parameters(remove_duplicate=False))
    new: dict[int, nn.Parameter] = {}
    for name in names:
        if name not in params or params[name].device.type == "meta":
            raise KeyError(name)
        old = held[name]
        value = params[name].detach()
        if hasattr(old, "device_mesh"):  # a tensor-parallel shard: this rank's part of it
            value = _shard_as(old, value)
        new.setdefault(id(old), nn.Parameter(value, requires_grad=old.requires_grad))
    new_buffers: dict[int, torch.Tensor] = {}
    for name, b in root.named_buffers(remove_duplicate=False) if buffers else ():
        if b.device.type != "meta" and name in made_buffers:
            new_buffers.setdefault(id(b), made_buffers[name])
    _replace(roots, new, new_buffers)


def params_without_storage(roots: list[nn.Module], names: list[str],
                           device: torch.device) -> None:
    """Make the parameters ``names`` of ``roots`` (as :func:`adopt_values` names them)
    tensors of their shapes on ``device`` with no storage (:func:`has_no_storage`), one at a
    time: a rank whose values for them come later (a sharded rank's shards, built once it
    holds them)."""
    held = dict(roots[0].named_parameters(remove_duplicate=False))
    new: dict[int, nn.Parameter] = {}
    for name in names:
        old = held[name]
        if id(old) not in new:
            t = torch.empty(old.shape, dtype=old.dtype, device=device)
            t.untyped_storage().resize_(0)
            new[id(old)] = nn.Parameter(t, requires_grad=old.requires_grad)
    _replace(roots, new, {})


def has_no_storage(t: torch.Tensor) -> bool:
    """``t`` has elements but no storage (:func:`params_without_storage`)."""
    return t.numel() > 0 and t.untyped_storage().nbytes() == 0


def _replace(roots: list[nn.Module], params: dict[int, nn.Parameter],
             buffers: dict[int, torch.Tensor]) -> None:
    """Every module of ``roots`` holding a tensor whose id is a key holds its value instead."""
    for top in roots:
        for m in top.modules():
            for k, p in list(m._parameters.items()):
                if p is not None and id(p) in params:
                    m._parameters[k] = params[id(p)]
            for k, b in list(m._buffers.items()):
                if b is not None and id(b) in buffers:
                    m._buffers[k] = buffers[id(b)]


def _shard_as(shard: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """``whole`` cut as the DTensor ``shard`` is (its mesh and placements): every rank cuts its
    own part of the same values, with no communication."""
    from torch.distributed.tensor import distribute_tensor
    return distribute_tensor(whole, shard.device_mesh, shard.placements, src_data_rank=None)


def module_params(gm: fx.GraphModule) -> list[nn.Parameter]:
    """Parameters a piece module uses (through its call_module and get_attr nodes)."""
    out: dict[int, nn.Parameter] = {}
    for n in gm.graph.nodes:
        if n.op == "call_module":
            for q in gm.get_submodule(str(n.target)).parameters():
                out[id(q)] = q
        elif n.op == "get_attr":
            obj = gm
            for part in str(n.target).split("."):
                obj = getattr(obj, part)
            if isinstance(obj, nn.Parameter):
                out[id(obj)] = obj
    return list(out.values())
