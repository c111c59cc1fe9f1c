"""Cost models of the all-reduce collectives the simulator charges (pure; no torch).

Notation (Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations
in MPICH", IJHPCA 19(1), 2005, section 2): ``p`` processes, ``n`` bytes per process, ``alpha``
latency per message (the link's ``latency_for_collectives``: collectives may travel another way
than point-to-point messages), ``beta`` seconds per byte (1 / bandwidth). The reduction arithmetic
(``gamma``) is left out: on GPUs it runs at device-memory speed, far above any link.

* **ring** (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
  workstations", JPDC 69(2), 2009; NCCL's ring): a reduce-scatter then an all-gather, each
  ``p - 1`` steps of ``n / p`` bytes: ``2 (p-1) alpha + 2 (p-1)/p n beta``.
* **rhd** (Rabenseifner's algorithm, Thakur et al. 2005 section 4.4: reduce-scatter by
  recursive halving, all-gather by recursive doubling): ``2 lg p alpha + 2 (p-1)/p n beta``
  for ``p`` a power of two. Otherwise the ``p - p'`` extra processes (``p'`` the largest power
  of two below ``p``) first hand their data to a partner and get the result back at the end:
  ``+ 2 (alpha + n beta)``.
* **hierarchical** (two-level, as in MVAPICH2's and Horovod's hierarchical all-reduce and
  NCCL's intra-node/inter-node split): with ``L`` peers on each of ``N`` nodes, a ring
  reduce-scatter inside each node (``(L-1) (alpha_intra + n / L beta_intra)``), an all-reduce
  across nodes in which the ``L`` local peers each reduce their ``n / L`` shard concurrently
  through the node's shared network port (together ``n`` bytes: the cost of one all-reduce of
  ``n`` bytes over ``N`` processes on the inter-node link), then a ring all-gather inside the
  node (same cost as the reduce-scatter).

Data-parallel layout on a cluster: copy ``d`` of a schedule of ``K`` ranks runs rank ``r`` on
device ``d * K + r``; devices ``[j * G, (j+1) * G)`` form node ``j`` (``G`` devices per node).
With ``K <= G`` each model-parallel group sits inside one node and its copies spread over
nodes; with ``K > G`` a group spans ``K / G`` nodes and every peer of a rank is on another node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

import numpy as np

from outcore.errors import UsageError
from outcore.hardware.spec import Cluster, LinkSpec

ALGORITHMS = ("ring", "rhd", "auto")
COLLECTIVES = {
    "auto": "two-level: intra-node ring reduce-scatter, inter-node all-reduce (the faster of "
            "ring and recursive halving-doubling), intra-node ring all-gather",
    "hierarchical": "two-level with a ring across nodes",
    "hierarchical-rhd": "two-level with recursive halving-doubling across nodes",
    "ring": "one flat ring over every data-parallel peer, at the slowest link it crosses",
}


def ring_allreduce_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """Ring all-reduce time: ``2 (n-1)`` steps of ``nbytes / n`` each (Patarasuk & Yuan, 2009)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * (link.latency_for_collectives + nbytes / n / link.bandwidth)


def ring_reduce_scatter_s(nbytes: float | np.ndarray, n: int, link: LinkSpec
                          ) -> float | np.ndarray:
    """Ring reduce-scatter (or all-gather) time: ``n - 1`` steps of ``nbytes / n`` each (of
    each entry, for an array of byte counts)."""
    if n <= 1:
        return np.zeros(np.shape(nbytes)) if np.ndim(nbytes) else 0.0
    t = (n - 1) * (link.latency_for_collectives + nbytes / n / link.bandwidth)
    if np.ndim(nbytes):
        return np.where(np.asarray(nbytes) > 0, t, 0.0)
    return t if nbytes > 0 else 0.0


def rhd_allreduce_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """Rabenseifner's all-reduce (Thakur et al. 2005, section 4.4):
    ``2 lg p' alpha + 2 (p'-1)/p' n beta`` on the largest power of two ``p' <= n``, plus
    ``2 (alpha + n beta)`` to fold in and back out the ``n - p'`` extra processes."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    p2 = 1 << (n.bit_length() - 1)
    beta = 1.0 / link.bandwidth
    t = 2 * math.log2(p2) * link.latency_for_collectives + 2 * (p2 - 1) / p2 * nbytes * beta
    if p2 != n:
        t += 2 * (link.latency_for_collectives + nbytes * beta)
    return t


def allreduce_s(nbytes: float, n: int, link: LinkSpec, algorithm: str = "auto") -> float:
    """All-reduce time of ``nbytes`` over ``n`` processes: ``ring``, ``rhd`` or ``auto`` (the
    faster of the two, as an MPI library's tuned selection would pick)."""
    if algorithm == "ring":
        return ring_allreduce_s(nbytes, n, link)
    if algorithm == "rhd":
        return rhd_allreduce_s(nbytes, n, link)
    if algorithm == "auto":
        return min(ring_allreduce_s(nbytes, n, link), rhd_allreduce_s(nbytes, n, link))
    raise UsageError(f"unknown all-reduce algorithm {algorithm!r}: use {', '.join(ALGORITHMS)}")


@dataclass(frozen=True)
class Phases:
    """An all-reduce split by the resource it uses.

    Attributes:
        intra_s: intra-node reduce-scatter before the inter-node phase (device links).
        inter_s: inter-node phase: holds the node's network port (both directions).
        after_s: intra-node all-gather after the inter-node phase.
        node: the node whose network port the inter-node phase holds (None: no inter phase).
    """

    intra_s: float = 0.0
    inter_s: float = 0.0
    after_s: float = 0.0
    node: int | None = None

    @property
    def total_s(self) -> float:
        return self.intra_s + self.inter_s + self.after_s


def hierarchical_allreduce(nbytes: float, local: int, nodes: int, intra: LinkSpec,
                           inter: LinkSpec, algorithm: str = "auto",
                           node: int | None = None) -> Phases:
    """Two-level all-reduce of ``nbytes`` over ``local`` peers on each of ``nodes`` nodes."""
    rs = ring_reduce_scatter_s(nbytes, local, intra)
    across = allreduce_s(nbytes, nodes, inter, algorithm) if nodes > 1 else 0.0
    return Phases(cast(float, rs), cast(float, across), cast(float, rs),
                  node if across > 0 else None)


def flat_ring_allreduce(nbytes: float, peers: int, nodes: int, intra: LinkSpec,
                        inter: LinkSpec, node: int | None = None) -> Phases:
    """One ring over all ``peers`` (node-contiguous order, so each node's port carries one
    ring flow each way); every step waits for its slowest hop, the inter-node one."""
    if nodes <= 1:
        return Phases(ring_allreduce_s(nbytes, peers, intra))
    t = ring_allreduce_s(nbytes, peers, inter)
    return Phases(0.0, t, 0.0, node if t > 0 else None)


@lru_cache(maxsize=4096)
def peer_layout(rank: int, group_ranks: int, dp: int, devices_per_node: int) -> tuple[int, int]:
    """``(local, nodes)``: how the ``dp`` data-parallel peers of ``rank`` (devices
    ``d * group_ranks + rank``) spread over nodes of ``devices_per_node`` devices — the most
    peers on one node, and the number of nodes they touch."""
    counts: dict[int, int] = {}
    for d in range(dp):
        node = (d * group_ranks + rank) // devices_per_node
        counts[node] = counts.get(node, 0) + 1
    return max(counts.values()), len(counts)


def dp_allreduce(cluster: Cluster, group_ranks: int, dp: int, rank: int, nbytes: float,
                 collective: str = "auto", link: LinkSpec | None = None) -> Phases:
    """The data-parallel all-reduce of ``nbytes`` of gradients held by ``rank``.

    ``cluster`` holds every copy (``cluster.size >= group_ranks * dp``): the peers' placement
    decides the links (see the module docstring). ``collective`` is one of
    :data:`COLLECTIVES`. When ``link`` is given, or the cluster is smaller than all copies (a
    cluster describing one copy only), the cost is a flat ring over ``link`` (default: the
    inter-node link when the cluster has several nodes, else the intra-node link) with no
    port contention: the simulator's model before large clusters.
    """
    if dp <= 1 or nbytes <= 0:
        return Phases()
    if collective not in COLLECTIVES:
        raise UsageError(f"unknown data-parallel collective {collective!r}: use "
                         f"{', '.join(COLLECTIVES)}")
    if link is not None or cluster.size < group_ranks * dp:
        fallback = link or (cluster.inter if cluster.nodes > 1 else cluster.intra)
        return Phases(ring_allreduce_s(nbytes, dp, fallback))
    local, nodes = peer_layout(rank, group_ranks, dp, cluster.devices_per_node)
    node = cluster.node_of(rank)
    if collective == "ring":
        return flat_ring_allreduce(nbytes, dp, nodes, cluster.intra, cluster.inter, node)
    algorithm = {"auto": "auto", "hierarchical": "ring", "hierarchical-rhd": "rhd"}[collective]
    return hierarchical_allreduce(nbytes, local, nodes, cluster.intra, cluster.inter,
                                  algorithm, node)
