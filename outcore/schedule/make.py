"""From a placed graph to a checked schedule: cut, cost, build, check (one call).

Parameters used on several ranks (a module called from two places that land on different
devices, tied weights) get one all-reduce bucket per distinct set of ranks, so every copy sees
the summed gradient and stays identical after the optimizer step.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from outcore.graph.ir import Graph
from outcore.hardware.spec import Cluster
from outcore.plan.pieces import Pieces, cut
from outcore.schedule.build import build
from outcore.schedule.check import check
from outcore.schedule.costs import PieceCosts, piece_costs
from outcore.schedule.ir import Schedule


def shared_param_buckets(g: Graph, assignment: np.ndarray) -> tuple[
        tuple[tuple[int, ...], ...], tuple[tuple[str, ...], ...], tuple[float, ...]]:
    """Buckets of parameters used on more than one rank.

    Returns ``(groups, names, bytes)``: per bucket the ranks that hold a copy, the parameter
    names, and their total bytes. Built from capture's ``params`` / ``shared_params`` attrs.
    """
    if g.attrs is None:
        return (), (), ()
    owner_rank: dict[str, int] = {}
    size: dict[str, float] = {}
    for i in range(g.num_nodes):
        for name in g.attr(i, "params", []) or []:
            owner_rank[name] = int(assignment[i])
    users: dict[str, set[int]] = defaultdict(set)
    for i in range(g.num_nodes):
        shared = g.attr(i, "shared_params", []) or []
        for name in shared:
            users[name].add(int(assignment[i]))
            size[name] = float(g.attr(i, "shared_bytes", 0)) / max(len(shared), 1)
    by_group: dict[tuple[int, ...], list[str]] = defaultdict(list)
    for name in sorted(users):
        ranks = tuple(sorted(users[name] | {owner_rank.get(name, min(users[name]))}))
        if len(ranks) > 1:
            by_group[ranks].append(name)
    groups = tuple(sorted(by_group))
    return (groups, tuple(tuple(by_group[k]) for k in groups),
            tuple(sum(size.get(n, 0.0) for n in by_group[k]) for k in groups))


def make_schedule(g: Graph, assignment: np.ndarray, num_ranks: int, *, microbatches: int,
                  kind: str, cluster: Cluster, scale: float = 1.0,
                  optimizer: str = "adam") -> tuple[Schedule, PieceCosts, Pieces]:
    """Cut ``g`` by ``assignment``, cost the pieces per micro-batch, build and check."""
    pieces = cut(g, assignment)
    costs = piece_costs(g, pieces, num_ranks, scale=scale, optimizer=optimizer)
    groups, names, sizes = shared_param_buckets(g, assignment)

    def link_time(a: int, b: int, nbytes: float) -> float:
        return cluster.link(a, b).time(nbytes) if a != b else 0.0

    s = build(pieces, num_ranks, microbatches, kind, costs, link_time, buckets=groups)
    s = Schedule(s.kind, s.num_ranks, s.microbatches, s.pieces, s.actions, s.buckets,
                 {**s.meta, "bucket_params": names, "bucket_bytes": sizes, "scale": scale})
    check(s)
    return s, costs, pieces
