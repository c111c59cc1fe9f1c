"""Shared weights in a tensor-parallel layout: a weight that several modules read (a tied
embedding and output layer) is split the same way by all of them, or by none
(:func:`untie_conflicts`, applied by :func:`outcore.graph.tensor_pairs.find_layout`; the
runtime splits by that layout)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from outcore.graph.ir import Graph, memo

__all__ = ["WEIGHT_SHARD", "param_owners", "shared_bytes", "shared_weight_modules",
           "untie_conflicts"]


# the dimension of its weight a split style shards (None: the whole weight on every rank)
WEIGHT_SHARD = {"whole": None, "colwise": 0, "colwise_gather": 0, "vocab": 0,
                "rowwise": 1, "rowwise_alone": 1, "embed_dim": 1}


def param_owners(g: Graph) -> tuple[dict[str, float], dict[str, int]]:
    """Each named parameter's bytes (its node's over its parameters, as the buckets count
    them) and the first node that owns it (capture's ``params``); remembered with the graph."""
    known = memo(g, "param_owners")
    if not known:
        size: dict[str, float] = {}
        owner: dict[str, int] = {}
        for v in range(g.num_nodes):
            owned = g.attr(v, "params", []) or []
            for name in owned:
                size.setdefault(name, float(g.param_bytes[v]) / len(owned))
                owner.setdefault(name, v)
        known["owners"] = (size, owner)
    return known["owners"]


def shared_bytes(g: Graph, i: int) -> float:
    """Bytes of the parameters node ``i`` reads that another node owns (a tied output
    layer's weight, owned by the embedding)."""
    names = g.attr(i, "shared_params", []) if g.attrs is not None else []
    if not names:
        return 0.0
    size, _ = param_owners(g)
    return float(sum(size.get(name, 0.0) for name in names))


def shared_weight_modules(g: Graph) -> list[set[str]]:
    """Groups of modules that read one parameter (a tied embedding and output layer): from
    capture's ``params`` / ``shared_params`` of module calls, and from a ``param`` node of a
    ``torch.export`` graph read by layers of several modules."""
    users: dict[str, set[str]] = {}
    for i in range(g.num_nodes):
        for name in g.attr(i, "shared_params", []) or []:
            users.setdefault(name, {name.rpartition(".")[0]}).add(g.module_of(i))
    for p in g.nodes_with_op("param").tolist():
        mods = {g.module_of(int(c)) for c in g.successors(p)}
        if len(mods) > 1:
            users.setdefault(g.names[p] if g.names is not None else str(p), set()).update(mods)
    return [m for m in users.values() if len(m) > 1]


def untie_conflicts(g: Graph, layout: Any) -> Any:
    """A shared weight must be split the same way by every module reading it (the runtime
    cannot hold two shardings of one tensor): where the styles disagree, those modules, and
    the pairs they are in, stay whole. ``layout``: a
    :class:`~outcore.graph.tensor_pairs.TensorLayout`, returned changed or as it is."""
    by_module = {s.module: s for s in layout.splits}
    whole: set[str] = set()
    for mods in shared_weight_modules(g):
        dims = {WEIGHT_SHARD[by_module[m].style] if m in by_module else None for m in mods}
        if len(dims) > 1:
            whole.update(mods)
    if not whole:
        return layout
    kept = [k for k, p in enumerate(layout.pairs) if not set(p.columns + p.rows) & whole]
    renumber = {k: n for n, k in enumerate(kept)}
    splits = tuple(replace(s, style="whole", pair=None, reason="shared weight")
                   if s.module in whole or (s.pair is not None and s.pair not in renumber)
                   else replace(s, pair=None if s.pair is None else renumber[s.pair])
                   for s in layout.splits)
    return replace(layout, pairs=tuple(layout.pairs[k] for k in kept), splits=splits)
