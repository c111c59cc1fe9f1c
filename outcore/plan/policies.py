"""Memory policies: per-piece activation checkpointing and CPU offloading (no torch).

A policy applies to a *group* of nodes on one device; groups never share a piece (``cut`` splits
at group boundaries), so a checkpointed segment is one piece, recomputed in its backward.

* ``checkpoint`` — keep only the piece's inputs; recompute its activations in the backward
  (Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016; torch.utils.checkpoint).
* ``offload-activations`` — saved activations go to pinned host memory during the forward, on a
  side stream, and come back (prefetched) for the backward (the seeds' CPU-offloading study;
  ``torch.autograd.graph.saved_tensors_hooks``).
* ``offload-params`` — the piece's parameters and optimizer state live on the host and are
  fetched just in time for its forward and backward (ZeRO-Offload style).

On a machine whose "device" is the host (CPU training), offloading moves nothing: it saves no
memory and costs no transfer, and the cost model says so; checkpointing is what makes a CPU run
fit. A plan holds its policies in ``Plan.policies``; its JSON form records them as
``{"groups": [{"policy": ..., "device": ...}, ...], "node_group": {node id: group}}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

POLICIES = ("none", "checkpoint", "offload-activations", "offload-params")
CHOICES = {"auto": "choose per piece the cheapest policy that makes the plan fit",
           "none": "no policy: the plan must fit as it is",
           "checkpoint": "only activation checkpointing",
           "offload": "only offloading (activations, then parameters)"}


@dataclass(frozen=True, eq=False)
class MemoryPolicies:
    """Per-node policy groups.

    Attributes:
        group_of: ``int64[n]`` group of every node (-1: no policy).
        policies: policy of each group.
    """

    group_of: np.ndarray
    policies: tuple[str, ...]

    def policy_of_group(self, group: int) -> str:
        return "none" if group < 0 else self.policies[group]

    def counts(self) -> dict[str, int]:
        """Nodes under each policy."""
        out: dict[str, int] = {}
        for gidx in self.group_of.tolist():
            name = self.policy_of_group(gidx)
            out[name] = out.get(name, 0) + 1
        return out

    def to_dict(self, ids: np.ndarray, assignment: np.ndarray) -> dict[str, Any]:
        groups = []
        for k, pol in enumerate(self.policies):
            members = np.flatnonzero(self.group_of == k)
            dev = int(assignment[members[0]]) if members.size else -1
            groups.append({"policy": pol, "device": dev, "nodes": int(members.size)})
        return {"groups": groups,
                "node_group": {str(int(ids[i])): int(gidx)
                               for i, gidx in enumerate(self.group_of.tolist()) if gidx >= 0}}


def none(n: int) -> MemoryPolicies:
    return MemoryPolicies(np.full(n, -1, dtype=np.int64), ())


def segmented(saved_bytes: np.ndarray, policy: str, count: int) -> MemoryPolicies:
    """Every node (in index order) in ``count`` consecutive segments of near-equal saved
    bytes, each its own group under ``policy`` (``none`` still cuts a rank's work into that
    many pieces)."""
    n = len(saved_bytes)
    group = np.full(n, -1, dtype=np.int64)
    segs = segments(np.arange(n), count, saved_bytes)
    for k, seg in enumerate(segs):
        group[seg] = k
    return MemoryPolicies(group, (policy,) * len(segs))


def segments(nodes: np.ndarray, count: int, weights: np.ndarray | None = None
             ) -> list[np.ndarray]:
    """Split an ordered node list into ``count`` consecutive segments of near-equal total
    ``weights`` (per node, e.g. saved bytes; default: equal length)."""
    nodes = np.asarray(nodes)
    count = max(1, min(count, nodes.size))
    if weights is None or float(np.sum(weights)) <= 0:
        return [part for part in np.array_split(nodes, count) if part.size]
    cum = np.cumsum(np.asarray(weights, dtype=np.float64))
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, count) / count, side="right")
    return [part for part in np.split(nodes, np.unique(np.clip(cuts, 1, nodes.size - 1)))
            if part.size]
