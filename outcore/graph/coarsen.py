"""Collapse a layer graph into blocks by module depth.

``collapse(g, depth)`` folds every node whose module path is deeper than ``depth`` into the block
named by the path's first ``depth`` components (depth 0 = the whole model as one block, 1 = the
top-level children, ...). A block is a maximal run of consecutive nodes in topological order with
the same prefix, so a module called twice gives two blocks (``name#2``) and the block graph stays
acyclic. Nodes outside any module (root-level tensor ops, inputs, outputs) stay as they are.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from outcore.errors import UsageError
from outcore.graph.algorithms import topological_order
from outcore.graph.ir import Graph, build

KEEP_OPS = ("input", "output")


def block_key(module: str, depth: int) -> str | None:
    """Block a node with this module path belongs to at ``depth`` (None: stays a node).

    A node directly inside a module shallower than ``depth`` (a tensor op in the forward of
    ``blocks.0`` at depth 3) is a leaf at that depth: it stays a node of its own.
    """
    if depth == 0:
        return ""
    parts = module.split(".") if module else []
    if len(parts) < depth:
        return None
    return ".".join(parts[:depth])


def groups(g: Graph, depth: int) -> tuple[np.ndarray, list[str]]:
    """Block number of every node and the name of every block, in topological order."""
    if depth < 0:
        raise UsageError(f"depth must be 0 or more, got {depth}")
    order = topological_order(g)
    group = np.empty(g.num_nodes, dtype=np.int64)
    names: list[str] = []
    calls: dict[str, int] = defaultdict(int)
    prev_key: object = object()
    for i in order.tolist():
        op = g.op_of(i)
        key = None if op in KEEP_OPS else block_key(g.module_of(i), depth)
        if key is not None and key == prev_key:
            group[i] = len(names) - 1
            continue
        if key is None:
            names.append(g.name_of(i))
        else:
            calls[key] += 1
            label = key if key else g.name
            names.append(label if calls[key] == 1 else f"{label}#{calls[key]}")
        group[i] = len(names) - 1
        prev_key = key
    return group, names


def _merged_params(g: Graph, nodes: np.ndarray) -> dict:
    """The parameter names a block owns and shares (so replicas and tied weights still get
    their all-reduce buckets on a collapsed graph), and its members' buffer bytes and saved
    copies of their weights."""
    if g.attrs is None:
        return {}
    owned: list[str] = []
    shared: list[str] = []
    shared_bytes = 0
    summed = {"buffer_bytes": 0, "fixed_saved": 0}  # the members' buffers and weight copies
    for i in nodes.tolist():
        owned += g.attrs[i].get("params", []) or []
        shared += g.attrs[i].get("shared_params", []) or []
        shared_bytes += int(g.attrs[i].get("shared_bytes", 0) or 0)
        for key in summed:
            summed[key] += int(g.attrs[i].get(key, 0) or 0)
    shared = [n for n in dict.fromkeys(shared) if n not in set(owned)]
    out: dict = {key: v for key, v in summed.items() if v}
    if owned:
        out["params"] = owned
    if shared:
        out["shared_params"] = shared
        out["shared_bytes"] = shared_bytes
    return out


def _saved_inputs(g: Graph, member_idx: list[int], group: np.ndarray, names: list[str]
                  ) -> list[str]:
    """The blocks whose outputs a block's members save (``attrs['saved_inputs']``)."""
    if g.attrs is None:
        return []
    b = int(group[member_idx[0]])
    out: list[str] = []
    for i in member_idx:
        for producer in g.attrs[i].get("saved_inputs", ()):
            j = g.index_of_name.get(producer)
            if j is not None and int(group[j]) != b and names[group[j]] not in out:
                out.append(names[group[j]])
    return out


def collapse(g: Graph, depth: int | None) -> Graph:
    """The block graph of ``g`` at ``depth`` (``None``: ``g`` itself).

    Block costs are sums over members; an edge between blocks carries each distinct producer
    tensor once. ``attrs['members']`` lists the member node ids.
    """
    if depth is None:
        return g
    group, names = groups(g, depth)
    k = len(names)

    def sums(arr: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=arr, minlength=k)

    gs, gd = group[g.src], group[g.dst]
    cross = gs != gd
    # one tensor per (producer node, consumer block): take its largest edge, then sum producers
    per_tensor: dict[tuple[int, int, int], int] = {}
    for s, a, b, nb in zip(g.src[cross].tolist(), gs[cross].tolist(), gd[cross].tolist(),
                           g.edge_bytes[cross].tolist()):
        key = (a, b, s)
        if per_tensor.get(key, -1) < nb:
            per_tensor[key] = nb
    edge_bytes: dict[tuple[int, int], int] = defaultdict(int)
    leaving: dict[int, dict[int, int]] = defaultdict(dict)
    for (a, b, s), nb in per_tensor.items():
        edge_bytes[(a, b)] += nb
        leaving[a][s] = max(leaving[a].get(s, 0), nb)
    pairs = sorted(edge_bytes)
    first = np.full(k, g.num_nodes, dtype=np.int64)
    np.minimum.at(first, group, np.arange(g.num_nodes))
    members: list[list[int]] = [[] for _ in range(k)]
    member_idx: list[list[int]] = [[] for _ in range(k)]
    for i, b in enumerate(group.tolist()):
        members[b].append(int(g.ids[i]))
        member_idx[b].append(i)
    out_bytes = np.zeros(k)
    for b in range(k):
        if len(members[b]) == 1:
            out_bytes[b] = g.out_bytes[first[b]]
        else:
            out_bytes[b] = sum(leaving[b].values())
    types = g.meta.get("module_types", {})
    ops, modules, attrs = [], [], []
    for b in range(k):
        i = int(first[b])
        if len(members[b]) == 1 and (g.op_of(i) in KEEP_OPS or
                                     block_key(g.module_of(i), depth) in (None,
                                                                          g.module_of(i))):
            ops.append(g.op_of(i))
            modules.append(g.module_of(i))
            extra = dict(g.attrs[i]) if g.attrs is not None else {}
        else:
            block = block_key(g.module_of(i), depth) or ""
            ops.append(types.get(block, "block") if block else "model")
            modules.append(block)
            extra = _merged_params(g, np.array(member_idx[b]))
        extra.pop("saved_inputs", None)
        saved_in = _saved_inputs(g, member_idx[b], group, names)
        if saved_in:
            extra["saved_inputs"] = saved_in
        extra["members"] = members[b]
        attrs.append(extra)
    return build(
        g.name,
        fwd_s=sums(g.fwd_s), bwd_s=sums(g.bwd_s), param_bytes=sums(g.param_bytes),
        saved_bytes=sums(g.saved_bytes), out_bytes=out_bytes,
        src=[a for a, _ in pairs], dst=[b for _, b in pairs],
        edge_bytes=[edge_bytes[p] for p in pairs],
        names=names, ops=ops, modules=modules, attrs=attrs, batch_size=g.batch_size,
        meta={**g.meta, "depth": depth, "fine_nodes": g.num_nodes},
    )
