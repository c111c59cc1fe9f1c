"""Replicated model parallelism (GEMS MAST/MASTER) and data parallelism as graph copies.

GEMS (Jain et al., "GEMS: GPU-Enabled Memory-Aware Model-Parallelism System for Distributed DNN
Training", SC 2020, section 4): MP-Basic splits the model over K devices; MAST places a second
replica in reverse order on the same devices (device r holds stage r of replica A and stage
K-1-r of replica B) so that the devices alternate between replicas that process different
micro-batches; MASTER adds more replicas (2, 4, ...) as memory allows; GEMS-HY replicates all of
it D times for data parallelism.

outcore runs every one of these on the same execution model: the plan's graph is copied once
per (data-parallel replica, model replica); copy ``c`` places stage ``s`` on its own device; the
copies share nothing but parameter *names*, so a parameter held by several ranks is all-reduced
among them (``outcore.schedule.lower.shared_param_buckets``) and one optimizer step keeps every
copy identical. Micro-batch slot ``m`` of copy ``c`` trains on chunk ``c * M + m`` of the global
batch (``M`` micro-batches per copy).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import cast

import numpy as np

from outcore.errors import PlanError
from outcore.graph.ir import Graph, build
from outcore.lazytuple import LazyTuple
from outcore.plan.layout import MODES, gems_maps
from outcore.plan.plan import Plan
from outcore.plan.policies import MemoryPolicies

__all__ = ["MODES", "SEP", "Copied", "copy_of", "copy_prefix", "expand", "expand_policies",
           "fx_name", "gems_maps", "tiled"]

SEP = "/"


def copy_prefix(copy: int) -> str:
    return f"c{copy}{SEP}"


def fx_name(name: str) -> str:
    """The layer name of a (possibly copied) node name: ``c3/layer1_0_conv1`` -> ``layer1...``."""
    return name.split(SEP, 1)[1] if SEP in name else name


def copy_of(name: str) -> int:
    """The copy a node name belongs to (0 for uncopied graphs)."""
    return int(name.split(SEP, 1)[0][1:]) if SEP in name else 0


class Copied(LazyTuple):
    """A per-node string of ``copies`` copies of a graph, copy after copy, each made when
    read: four copies of a 1M-node graph would be 4M strings a simulation of them barely reads
    (the runtime reads its rank's). ``item(v)``: the string of node ``v`` of the graph;
    ``prefixed``: node names, ``c<k>/`` before each (an op or a module is the same in every
    copy). A :class:`~outcore.lazytuple.LazyTuple` (equal to the tuple of its strings, and
    pickled as it) whose items are also made one by one, without the whole tuple."""

    noun = "node strings"

    def __init__(self, item: Callable[[int], str], n: int, copies: int,
                 prefixed: bool) -> None:
        super().__init__(n * copies, lambda: tuple(_strings(item, n, copies, prefixed)))
        self._item, self._n, self._prefixed = item, n, prefixed
        self._copies = copies

    def uncopied(self, i: int) -> str:
        """Node ``i``'s string in the graph that was copied (``fx_name`` of its name)."""
        return self._item(int(i) % self._n)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        i = operator.index(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"node {i} of {len(self)}")
        text = self._item(i % self._n)
        return copy_prefix(i // self._n) + text if self._prefixed else text

    def __iter__(self) -> Iterator[str]:
        return _strings(self._item, self._n, self._copies, self._prefixed)


def _strings(item: Callable[[int], str], n: int, copies: int, prefixed: bool
             ) -> Iterator[str]:
    for c in range(copies):
        prefix = copy_prefix(c) if prefixed else ""
        yield from (prefix + item(v) for v in range(n))


def tiled(a: np.ndarray, copies: int, step: int = 0) -> np.ndarray:
    """``a`` repeated ``copies`` times, copy ``c`` plus ``c * step`` (a broadcast copy:
    ``np.tile`` is several times slower on millions of entries)."""
    out = np.empty((copies, a.shape[0]), a.dtype)
    out[:] = a
    if step:
        out += (np.arange(copies, dtype=a.dtype) * step)[:, None]
    return out.reshape(-1)


def expand_policies(plan: Plan, copies: int) -> MemoryPolicies | None:
    """The plan's memory-policy groups, repeated for each copy of the graph."""
    pol = plan.policies
    if pol is None or copies == 1:
        return pol
    return MemoryPolicies(tiled(pol.group_of, copies), pol.policies)


def expand(g: Graph, plan: Plan) -> tuple[Graph, np.ndarray, int]:
    """The graph every rank executes, its assignment, and the number of copies.

    For a plain plan that is ``(g, plan.assignment, 1)``. For a replicated plan, copy
    ``c = d * replicas + k`` (data-parallel replica ``d``, model replica ``k``) places node ``v``
    on rank ``d * K + maps[k][stage_of[v]]``.
    """
    rep = plan.layout
    if not rep.replicated:
        return g, plan.assignment, 1
    if rep.ranks(rep.stages) != plan.devices:
        raise PlanError(f"the plan's layout needs {rep.ranks(rep.stages)} ranks but it says "
                        f"{plan.devices} devices")
    n, C = g.num_nodes, rep.copies
    maps = np.asarray(rep.maps, dtype=np.int64)
    assign = np.concatenate([d * rep.stages + maps[k][plan.assignment]
                             for d in range(rep.dp) for k in range(rep.replicas)])
    attrs = None
    if g.attrs is not None:
        attrs = [dict(g.attrs[i], copy=c) for c in range(C) for i in range(n)]
    big = build(
        g.name, fwd_s=tiled(g.fwd_s, C), bwd_s=tiled(g.bwd_s, C),
        param_bytes=tiled(g.param_bytes, C), out_bytes=tiled(g.out_bytes, C),
        saved_bytes=tiled(g.saved_bytes, C), src=tiled(g.src, C, n), dst=tiled(g.dst, C, n),
        edge_bytes=tiled(g.edge_bytes, C), attrs=attrs, batch_size=g.batch_size,
        meta={**g.meta, "copies": C}, check=False)
    # each copy's names made when read (lazy tuples: a copied graph holds no new strings)
    names = cast(tuple[str, ...], Copied(g.name_of, n, C, True))
    ops = None if g.ops is None else cast(tuple[str, ...],
                                          Copied(g.ops.__getitem__, n, C, False))
    modules = None if g.modules is None else cast(tuple[str, ...],
                                                  Copied(g.modules.__getitem__, n, C, False))
    big = replace(big, names=names, ops=ops, modules=modules)
    # each copy's nodes by op, in order, and the copies' adjacency: the graph's, copy by copy
    # (what Graph._csr's stable sort of the copies' edges would give: copy c's edge e is edge
    # c * m + e), without sorting them again
    big.__dict__["_nodes_by_op"] = {op: tiled(v, C, n) for op, v in g._nodes_by_op.items()}
    # the layers' saved inputs name the copied graph's layers, unprefixed: each copy's
    # savers save its own producers' outputs (without them a checkpointed piece of a data-
    # parallel copy kept none of its inputs, 4 % under the measured peak of torchvision's
    # GoogLeNet)
    for pairs in ("saved_input_pairs", "resaved_input_pairs"):
        savers, producers = getattr(g, pairs)
        big.__dict__[pairs] = (tiled(savers, C, n), tiled(producers, C, n))
    big.__dict__["storage_root"] = tiled(g.storage_root, C, n)
    m = g.num_edges
    for cache in ("_succ", "_pred"):
        ptr, idx, edge = getattr(g, cache)
        big.__dict__[cache] = (np.concatenate((ptr[:1], tiled(ptr[1:], C, m))),
                               tiled(idx, C, n), tiled(edge, C, m))
    return big, assign, C
