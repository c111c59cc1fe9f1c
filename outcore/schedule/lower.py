"""The one road from a plan to a schedule: expand copies, cut, cost, build, place all-reduces,
check (docs/runtime.md, "Execution model").

:func:`lower` is used by the simulator, the runtime and the pictures alike, so what the simulator
predicts is exactly what the runtime executes. A plan's graph is first expanded into the graph
every rank executes (one copy per GEMS replica and data-parallel copy), then cut into pieces at
device and memory-policy boundaries; each piece is costed per micro-batch and the builder orders
each rank's forwards, backwards and messages.

Parameters held by several ranks — a module called from two places that land on different
devices, tied weights, the replicas of GEMS MAST/MASTER, data-parallel copies — get one
all-reduce bucket per distinct set of ranks. A rank launches a bucket's all-reduce right after
its last backward that touches those parameters (so it overlaps the rest of the backward), and
the optimizer step waits for it: every copy sees the summed gradient and stays identical.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from outcore.cost.tensor import collective_s, layout_collectives, tensor_graph
from outcore.errors import UsageError
from outcore.graph.ir import Graph
from outcore.graph.tensor_ties import param_owners
from outcore.hardware.spec import Cluster
from outcore.lazytuple import LazyTuple
from outcore.plan.pieces import Pieces, cut
from outcore.plan.plan import Plan
from outcore.plan.policies import MemoryPolicies
from outcore.plan.replicas import Copied, expand, expand_policies, fx_name, tiled
from outcore.schedule.build import ClusterLinkTime, build
from outcore.schedule.check import check
from outcore.schedule.costs import PieceCosts, loss_cost_s, mb_scale, piece_costs
from outcore.schedule.ir import OP_INDEX, ActionColumns, Schedule, action_columns

__all__ = ["Lowered", "lower", "make_schedule", "place_allreduces", "shared_param_buckets",
           "sharded_buckets"]


@dataclass(frozen=True, eq=False)
class Lowered:
    """A plan lowered for execution.

    Attributes:
        graph: the graph every rank executes (the plan's graph, copied once per model copy
            of a replicated plan; copy ``c``'s node names start with ``c{c}/``).
        assignment: ``int64[n]`` rank of every node of ``graph``.
        copies: model copies (GEMS replicas x data-parallel copies; 1 for a plain plan).
        pieces: the cut of ``graph`` (what each rank runs as one forward/backward).
        costs: per-piece costs for one micro-batch.
        schedule: the checked per-rank action lists.
        cluster: the devices and links it was lowered for, as the schedule's ranks see them
            (with ``tp > 1`` each schedule rank is a slot of ``tp`` processes:
            :meth:`~outcore.hardware.spec.Cluster.slots`).
        batch: samples per iteration (None when the graph records no batch size).
        tp: processes per schedule rank (the tensor-parallel degree): process
            ``slot * tp + t`` runs slot ``slot``'s actions on its tensor shard ``t``.
    """

    graph: Graph
    assignment: np.ndarray
    copies: int
    pieces: Pieces
    costs: PieceCosts
    schedule: Schedule
    cluster: Cluster
    batch: int | None
    tp: int = 1


def lower(g: Graph, plan: Plan, *, microbatches: int | None = None,
          schedule: str | None = None, cluster: Cluster | None = None,
          global_batch: int | None = None, mb_samples: float | None = None,
          checked: bool = True) -> Lowered:
    """Lower ``plan`` (made for ``g``) to the schedule every rank runs.

    Args:
        microbatches: micro-batches per iteration and copy (default: the plan's).
        schedule: ``gpipe`` or ``1f1b`` (default: the plan's).
        cluster: devices and links (default: the plan's, :meth:`Plan.cluster_or_default`).
        global_batch: samples per iteration; each micro-batch is then
            ``global_batch / (microbatches * copies)`` samples (costs scaled linearly from the
            graph's batch). Default: every micro-batch is the graph's batch.
        mb_samples: samples per micro-batch (instead of ``global_batch``).
        checked: check the schedule (:func:`outcore.schedule.check.check`); the search skips
            it for the placements it only compares (the simulator still raises on a
            deadlock; a plan's schedule is checked when it is lowered to run).

    With ``plan.layout.tp > 1`` the graph is first costed as one rank of a tensor-parallel
    group sees it (:func:`outcore.cost.tensor.tensor_graph`) and the schedule's ranks are the
    plan's device slots.
    """
    plan.check(g)
    M = int(microbatches or plan.microbatches or 1)
    if M < 1:
        raise UsageError(f"micro-batches must be at least 1, got {M}")
    kind = schedule or plan.schedule or "1f1b"
    cl = cluster or plan.cluster_or_default()
    inner: dict[int, list[tuple[str, str, float, float]]] = {}  # per node of one copy
    if plan.spatial is not None:  # MPI4DL SP: tiled layers costed for the largest tile
        from outcore.schedule.spatial import collectives, tiled_graph
        inner = collectives(g, plan.spatial, cl, plan.stages, plan.layout.dp)
        g = tiled_graph(g, plan.spatial, cl, plan.stages, plan.layout.dp)
    tp = plan.layout.tp
    if tp > 1:
        link = cl.link(0, 1)
        g, layout = tensor_graph(g, tp, link)
        inner = {v: [("F" if c.phase == "fwd" else "B", _TP_KINDS[c.kind], float(c.nbytes),
                      collective_s(c, link)) for c in cs]
                 for v, cs in layout_collectives(layout).items()}
        cl = cl.slots(tp)
    big, assignment, copies = expand(g, plan)
    if mb_samples is not None:
        global_batch = int(round(mb_samples * M * copies))
    batch = global_batch or (g.batch_size * M * copies if g.batch_size else None)
    scale = mb_scale(g, batch / (M * copies) if batch else None)
    depth = plan.layout.depth
    policies = expand_policies(plan, copies)
    if depth > 1:
        policies = shard_units(big, assignment, policies)
    sched, costs, pieces = make_schedule(big, assignment, plan.devices // tp, microbatches=M,
                                         kind=kind, cluster=cl, scale=scale,
                                         optimizer=plan.optimizer, policies=policies,
                                         depth=(plan.stages, plan.layout.dp, depth)
                                         if depth > 1 else None,
                                         whole=_tiled_mask(g, plan, copies), checked=checked)
    if inner:
        costs = _with_inner_collectives(costs, pieces, inner, g.num_nodes, scale)
    return Lowered(big, assignment, copies, pieces, costs, sched, cl, batch, tp)


def _with_inner_collectives(costs: PieceCosts, pieces: Pieces,
                            per_node: dict[int, list[tuple[str, str, float, float]]], n: int,
                            scale: float) -> PieceCosts:
    """``costs`` with the collectives each piece runs inside its forward or backward
    (``per_node``: node of one model copy -> ``(phase, kind, bytes, seconds)`` at the graph's
    batch; tensor-parallel collectives, spatial halos and gathers) added to
    :attr:`~outcore.schedule.costs.PieceCosts.collectives`, at the micro-batch's ``scale``
    (the seconds scaled with the bytes: an upper bound for the latency part)."""
    out = {k: list(v) for k, v in (costs.collectives or {}).items()}
    piece_of = pieces.piece_of
    for copy in range(len(piece_of) // n):
        for v, rows in per_node.items():
            for phase, kind, nbytes, secs in rows:
                out.setdefault(int(piece_of[copy * n + v]), []).append(
                    (phase, kind, float(nbytes) * scale, secs * scale))
    return replace(costs, collectives={k: tuple(v) for k, v in out.items()})


# the communication profile's names of tensor-parallel collectives
_TP_KINDS = {"all_reduce": "tp allreduce", "all_gather": "tp allgather",
             "reduce_scatter": "tp reduce_scatter"}


def _tiled_mask(g: Graph, plan: Plan, copies: int) -> np.ndarray | None:
    """A spatial plan's tiled nodes (of every copy): they form one piece."""
    if plan.spatial is None:
        return None
    mask = np.zeros(g.num_nodes, dtype=bool)
    mask[plan.spatial.indices(g)] = True
    return tiled(mask, copies)


def _node_params(g: Graph, i: int) -> list[str]:
    """The parameters node ``i`` of a graph that names them reads: its own and the shared ones
    it calls (a graph without names: :func:`_unnamed_buckets`)."""
    return list(g.attr(i, "params", []) or []) + list(g.attr(i, "shared_params", []) or [])


def shared_param_buckets(g: Graph, assignment: np.ndarray, apart: frozenset[str] = frozenset()
                         ) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[str, ...], ...],
                                    tuple[float, ...]]:
    """Buckets of parameters held by more than one rank.

    Returns ``(groups, names, bytes)``: per bucket the ranks that hold a copy, the parameter
    names, and their bytes (one copy). Built from capture's ``params`` / ``shared_params``
    attrs, so it covers shared modules, tied weights and replicated copies alike; a graph
    without them (a generated graph, a graph file) has one parameter tensor per node that
    owns parameter bytes (:func:`_unnamed_buckets`). The names in ``apart`` get buckets of
    their own (after the others of the same ranks).
    """
    if g.attrs is None:
        return _unnamed_buckets(g, assignment)
    ranks: dict[str, set[int]] = defaultdict(set)
    size, _ = param_owners(g)
    for i in range(g.num_nodes):
        for name in _node_params(g, i):
            ranks[name].add(int(assignment[i]))
    by_group: dict[tuple[tuple[int, ...], bool], list[str]] = defaultdict(list)
    for name in sorted(ranks):
        if len(ranks[name]) > 1:
            by_group[(tuple(sorted(ranks[name])), name in apart)].append(name)
    keys = sorted(by_group)
    return (tuple(k[0] for k in keys), tuple(tuple(by_group[k]) for k in keys),
            tuple(sum(size.get(n, 0.0) for n in by_group[k]) for k in keys))


def _param_namer(g: Graph) -> Callable[[list[int]], list[str]]:
    """The parameter tensor of each of some nodes of ``g``, a graph without parameter names:
    named after the node as the model copy names it (``c1/n5`` and ``n5`` hold
    ``n5.params``). Holds ``g``'s names, not ``g`` (a schedule keeps it to name parameters
    when asked: an expanded graph's arrays need not stay alive for that)."""
    names, ids = g.names, g.ids
    if isinstance(names, Copied):  # made per read: the copied graph's own names
        own: Callable[[int], str] = names.uncopied
    elif names is not None:
        def own(v: int) -> str:
            return fx_name(names[v])
    else:
        def own(v: int) -> str:
            return fx_name(f"n{int(ids[v])}")
    return lambda nodes: [f"{own(v)}.params" for v in nodes]


def _unnamed_groups(g: Graph, assignment: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, tuple[tuple[int, ...], ...]]:
    """For a graph without parameter names: ``(held, bucket, groups)``, the nodes of copy 0
    that own parameter bytes, the bucket of each (-1: held on one rank only) and each
    bucket's ranks, sorted. Node ``c * n + v`` of a graph :func:`expand` copied per replica
    (``meta["copies"]``) is copy ``c``'s node ``v`` and holds the same tensor."""
    copies = int(g.meta.get("copies", 1))
    n = g.num_nodes // copies
    held = np.flatnonzero(np.asarray(g.param_bytes[:n]) > 0)
    if copies < 2 or not held.size:
        return held[:0], held[:0], ()
    ranks = np.sort(np.asarray(assignment, np.int64).reshape(copies, n)[:, held].T, axis=1)
    R = int(ranks.max()) + 1
    if copies * math.log2(R + 1) < 62:  # each row's ranks as one number: a 1-D unique
        key = ranks @ (R ** np.arange(copies, dtype=np.int64))
        _, first, row_of = np.unique(key, return_index=True, return_inverse=True)
        rows = ranks[first]
    else:
        rows, row_of = np.unique(ranks, axis=0, return_inverse=True)
    sets = [tuple(sorted(set(row))) for row in rows.tolist()]
    groups = tuple(sorted({r for r in sets if len(r) > 1}))
    index = {group: b for b, group in enumerate(groups)}
    bucket_of_row = np.array([index.get(r, -1) for r in sets], np.int64)
    return held, bucket_of_row[row_of.reshape(-1)], groups


def _unnamed_buckets(g: Graph, assignment: np.ndarray) -> tuple[
        tuple[tuple[int, ...], ...], tuple[tuple[str, ...], ...], tuple[float, ...]]:
    """:func:`shared_param_buckets` of a graph without parameter names: each node that owns
    parameter bytes holds one tensor (:func:`_param_namer`), shared by the copies of the graph
    (:func:`_unnamed_groups`), so data parallelism on a generated graph all-reduces its
    gradients as on a captured model. Vectorised: a 1M-node graph's four copies are 4M
    nodes. A bucket's names are in node order."""
    held, bucket, groups = _unnamed_groups(g, assignment)
    if not groups:
        return (), (), ()
    shared = bucket >= 0
    order = np.argsort(bucket[shared], kind="stable")  # node order within each bucket
    nodes = np.split(held[shared][order], np.cumsum(np.bincount(bucket[shared],
                                                                minlength=len(groups)))[:-1])
    sizes = np.bincount(bucket[shared], minlength=len(groups),
                        weights=np.asarray(g.param_bytes, np.float64)[held[shared]])
    held_names = cast(tuple[tuple[str, ...], ...], tuple(_HeldParams(g, ns) for ns in nodes))
    return groups, held_names, tuple(float(x) for x in sizes)


def _in_every_copy(g: Graph, nodes: np.ndarray) -> np.ndarray:
    """``nodes`` of copy 0 and the same nodes of every other copy of a graph :func:`expand`
    copied (``meta["copies"]``; node ``c * n + v`` is copy ``c``'s node ``v``)."""
    copies = int(g.meta.get("copies", 1))
    return tiled(nodes, copies, g.num_nodes // copies)


class _HeldParams(LazyTuple):
    """One bucket's parameter names of a graph without parameter names (:func:`_param_namer`),
    made when read (the runtime's ranks, sharding: a search simulates dozens of plans of one
    graph and reads none of them), and ``nodes``: the nodes of copy 0 that hold them, which
    :func:`place_allreduces` places the bucket's all-reduce by."""

    noun = "parameter names"

    def __init__(self, g: Graph, nodes: np.ndarray) -> None:
        namer = _param_namer(g)
        super().__init__(len(nodes), lambda: tuple(namer(nodes.tolist())))
        self.nodes = nodes


def _touching(s: Schedule, g: Graph, names: tuple[tuple[str, ...], ...]) -> list[set[int]]:
    """Per bucket, the pieces with a node that holds one of its parameters."""
    out: list[set[int]] = [set() for _ in names]
    piece_of = s.pieces.piece_of
    if g.attrs is None:  # _unnamed_buckets' buckets: their nodes in every copy
        for b, held in enumerate(names):
            nodes = cast(_HeldParams, held).nodes
            out[b] = set(np.unique(piece_of[_in_every_copy(g, nodes)]).tolist())
        return out
    bucket_of = {name: b for b, ns in enumerate(names) for name in ns}
    for v in range(g.num_nodes):
        for name in _node_params(g, v):
            k = bucket_of.get(name)
            if k is not None:
                out[k].add(int(piece_of[v]))
    return out


def place_allreduces(s: Schedule, g: Graph, names: tuple[tuple[str, ...], ...]) -> Schedule:
    """Move each rank's ``AR`` of a bucket to right after its last backward touching it (and
    the gradient sends that follow it); a bucket no piece of the rank touches, to just before
    the step. On the actions' columns: a replicated RNN grid's ranks hold ~100k actions."""
    if not s.buckets:
        return s
    touching = _touching(s, g, names)
    AR, B, SB, OPT = (OP_INDEX[op] for op in ("AR", "B", "SB", "OPT"))
    actions = []
    for r, acts in enumerate(s.actions):
        cols = action_columns(acts)
        cols = tuple(c[cols[0] != AR] for c in cols)
        op, piece = cols[0], cols[2]
        at, added = [], []
        for b, group in enumerate(s.buckets):
            if r not in group:
                continue
            hits = np.flatnonzero((op == B) & np.isin(piece, list(touching[b])))
            last = int(hits[-1]) if hits.size else int(np.flatnonzero(op == OPT)[0]) - 1
            # after the backward's gradient sends, so they are not delayed
            while last + 1 < op.size and op[last + 1] == SB:
                last += 1
            at.append(last + 1)
            added.append(b)
        rows = [[AR] * len(at), [-1] * len(at), [-1] * len(at), [-1] * len(at), added]
        actions.append(ActionColumns(*(np.insert(c, at, np.asarray(v, np.int64))
                                       for c, v in zip(cols, rows))))
    return Schedule(s.kind, s.num_ranks, s.microbatches, s.pieces, tuple(actions), s.buckets,
                    s.meta)


# sharded parameters are gathered per unit: each rank's nodes in this many consecutive parts
# of equal parameter bytes (FSDP wraps each transformer block; a unit's whole parameters and
# gradients are what a rank holds beyond its shards)
SHARD_UNITS = 8


def gather_units(g: Graph, assignment: np.ndarray, units: int = SHARD_UNITS) -> np.ndarray:
    """``int64[n]``: each node's gather unit on its rank, ``0 .. units - 1``: the rank's nodes
    in topological order cut into ``units`` consecutive parts of equal parameter bytes."""
    from outcore.graph.algorithms import topological_order
    from outcore.plan.policies import segments

    order = topological_order(g)
    unit = np.zeros(g.num_nodes, dtype=np.int64)
    for r in np.unique(assignment):
        mine = order[assignment[order] == r]
        for k, part in enumerate(segments(mine, units, g.param_bytes[mine])):
            unit[part] = k
    return unit


def shard_units(g: Graph, assignment: np.ndarray, policies: MemoryPolicies | None,
                units: int = SHARD_UNITS) -> MemoryPolicies:
    """Memory-policy groups split further into gather units (:func:`gather_units`; each part
    keeps its nodes' policies), numbered in (policy group, unit, rank) order."""
    unit = gather_units(g, assignment, units)
    old = policies.group_of if policies is not None else np.full(g.num_nodes, -1, np.int64)
    a = np.asarray(assignment, np.int64)
    # the (old group, unit, rank) triples as one number, in their lexicographic order: groups
    # numbered as np.unique over the stacked rows numbers them, without its slow sort by rows
    ranks = int(a.max()) + 1 if a.size else 1
    key = ((np.asarray(old, np.int64) + 1) * units + unit) * ranks + a
    first, group_of = np.unique(key, return_inverse=True)
    names = tuple(policies.policy_of_group(int(o)) if policies is not None else "none"
                  for o in (first // (units * ranks) - 1).tolist())
    return MemoryPolicies(np.asarray(group_of, dtype=np.int64).reshape(-1), names)


def sharded_buckets(groups: tuple[tuple[int, ...], ...], stages: int,
                    dp: int) -> tuple[bool, ...]:
    """Which buckets a layout's ``depth`` shards: those held by exactly the ``dp`` copies of
    one device slot (rank ``d * stages + s``); parameters shared by two slots of a copy (tied
    weights) stay whole and all-reduced."""
    return tuple(len(grp) == dp and len({r % stages for r in grp}) == 1 and
                 sorted(r // stages for r in grp) == list(range(dp)) for grp in groups)


class _Sharding:
    """The costs of sharding the parameters of :func:`sharded_buckets` over ``depth``."""

    def __init__(self, g: Graph, groups: tuple[tuple[int, ...], ...],
                 names: tuple[tuple[str, ...], ...], layout: tuple[int, int, int],
                 cluster: Cluster, passed: frozenset[str]):
        from outcore.hardware.collectives import ring_reduce_scatter_s

        stages, self.dp, self.depth = layout
        # a parameter one piece hands to another stays whole (its bucket holds only such)
        self.sharded = tuple(sh and not passed.intersection(ns)
                             for sh, ns in zip(sharded_buckets(groups, stages, self.dp), names))
        self.node_bytes = _sharded_node_bytes(g, names, self.sharded)
        link = cluster.link(0, min(stages, cluster.size - 1)) if stages < cluster.size \
            else cluster.link(0, 1)
        self.collective_s = lambda b: ring_reduce_scatter_s(b, self.depth, link)

    def cost_options(self) -> dict:
        return {"sharded_bytes": self.node_bytes, "depth": self.depth,
                "gather_s": self.collective_s, "scatter_s": self.collective_s}

    def bucket_meta(self, sizes: tuple[float, ...]) -> dict:
        """A sharded bucket's all-reduce is of the shards, over the ``dp / depth`` groups."""
        return {"bucket_bytes": tuple(b / self.depth if sh else b
                                      for b, sh in zip(sizes, self.sharded)),
                "bucket_ring": tuple(self.dp // self.depth if sh else 0
                                     for sh in self.sharded),
                "bucket_sharded": self.sharded, "depth": self.depth}


def _passed_params(g: Graph, pieces: Pieces) -> frozenset[str]:
    """Parameters whose tensor a piece hands to another (an exported graph reads a tied weight
    once, at its first use, and passes it on): they stay whole, since a shard's parameter is
    whole only while the piece that gathered it runs."""
    if g.attrs is None or not g.num_edges:
        return frozenset()
    piece_of = pieces.piece_of
    leaving = np.unique(g.src[piece_of[g.src] != piece_of[g.dst]])
    params = set(g.nodes_with_op("param").tolist())
    return frozenset(name for i in leaving.tolist() if i in params
                     for name in (g.attr(i, "params", []) or []))


def _sharded_node_bytes(g: Graph, names: tuple[tuple[str, ...], ...],
                        sharded: tuple[bool, ...]) -> np.ndarray:
    """Per node, the bytes of its own parameters that sharding divides: those in the
    ``sharded`` buckets (a node owning several tensors, its bytes split evenly among them).
    A graph without parameter names has one tensor per node owning parameter bytes, held by
    the bucket's nodes (:class:`_HeldParams`) in every copy of the graph."""
    out = np.zeros(g.num_nodes)
    if g.attrs is None:
        held = [cast(_HeldParams, ns).nodes for ns, sh in zip(names, sharded) if sh]
        if held:
            idx = _in_every_copy(g, np.concatenate(held))
            out[idx] = np.asarray(g.param_bytes, np.float64)[idx]
        return out
    names_in = {n for ns, sh in zip(names, sharded) if sh for n in ns}
    for i in range(g.num_nodes):
        owned = g.attr(i, "params", []) or []
        if owned:
            k = sum(n in names_in for n in owned)
            out[i] = float(g.param_bytes[i]) * k / len(owned)
    return out


def make_schedule(g: Graph, assignment: np.ndarray, num_ranks: int, *, microbatches: int,
                  kind: str, cluster: Cluster, scale: float = 1.0, optimizer: str = "adam",
                  policies: MemoryPolicies | None = None,
                  depth: tuple[int, int, int] | None = None, whole: np.ndarray | None = None,
                  checked: bool = True) -> tuple[Schedule, PieceCosts, Pieces]:
    """Cut ``g`` by ``assignment`` (and memory-policy groups; ``whole``: nodes kept in one
    piece, see :func:`~outcore.plan.pieces.cut`), cost the pieces per micro-batch, build and
    check. ``depth = (stages, dp, depth)`` shards the parameters of every slot over its
    data-parallel copies (:func:`sharded_buckets`)."""
    pieces = cut(g, assignment, policies.group_of if policies is not None else None, whole)
    piece_policies = tuple(policies.policy_of_group(k) for k in pieces.group_of.tolist()) \
        if policies is not None else None
    passed = _passed_params(g, pieces) if depth else frozenset()
    groups, names, sizes = shared_param_buckets(g, assignment, apart=passed)
    shard = _Sharding(g, groups, names, depth, cluster, passed) if depth else None
    costs = piece_costs(g, pieces, num_ranks, scale=scale, optimizer=optimizer,
                        policies=piece_policies, host_bandwidth=cluster.device.host_bandwidth,
                        host_is_device=cluster.device.host_is_device,
                        fwd_overhead_s=cluster.device.fwd_overhead_s,
                        bwd_overhead_s=cluster.device.bwd_overhead_s,
                        overhead_overlaps=cluster.device.host_overlap,
                        loss_s=loss_cost_s(cluster.device),
                        **(shard.cost_options() if shard else {}))

    link_time = ClusterLinkTime(cluster)

    s = build(pieces, num_ranks, microbatches, kind, costs, link_time, buckets=groups)
    s = place_allreduces(s, g, names)
    meta = {**s.meta, "bucket_params": names, "bucket_bytes": sizes, "scale": scale}
    if shard:
        meta.update(shard.bucket_meta(sizes))
    s = Schedule(s.kind, s.num_ranks, s.microbatches, s.pieces, s.actions, s.buckets, meta)
    if checked:
        check(s)
    return s, costs, pieces
