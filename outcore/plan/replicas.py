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
among them (``outcore.schedule.make.shared_param_buckets``) and one optimizer step keeps every
copy identical. Micro-batch slot ``m`` of copy ``c`` trains on chunk ``c * M + m`` of the global
batch (``M`` micro-batches per copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from outcore.errors import PlanError, UsageError
from outcore.graph.ir import Graph, build
from outcore.plan.plan import Plan
from outcore.plan.policies import MemoryPolicies
from outcore.plan.policies import from_plan as policies_from_plan

MODES = {"mp": "MP-Basic: one replica split over the devices",
         "mast": "MAST: a second replica in reverse stage order on the same devices",
         "master": "MASTER: as many replicas as memory allows (2, 4, ...), shifted and reversed"}

SEP = "/"


@dataclass(frozen=True)
class Replication:
    """How a plan is replicated.

    Attributes:
        mode: ``mp``, ``mast`` or ``master``.
        replicas: model replicas sharing the K model-parallel devices.
        dp: data-parallel copies of the whole K-device group (ranks = K * dp).
        stage_of: ``int64[n]`` stage of every node (its device in replica 0).
        maps: ``maps[k][s]`` = device (within the group) holding stage ``s`` of replica ``k``.
    """

    mode: str
    replicas: int
    dp: int
    stage_of: np.ndarray
    maps: tuple[tuple[int, ...], ...]

    @property
    def stages(self) -> int:
        return len(self.maps[0])

    @property
    def copies(self) -> int:
        return self.replicas * self.dp

    @property
    def ranks(self) -> int:
        return self.stages * self.dp

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "replicas": self.replicas, "dp": self.dp,
                "maps": [list(m) for m in self.maps]}


def gems_maps(stages: int, replicas: int) -> tuple[tuple[int, ...], ...]:
    """Stage -> device maps: replica pairs run in opposite directions, pairs are shifted.

    Replica ``2p`` maps stage ``s`` to ``(s + shift_p) mod K`` and replica ``2p+1`` to
    ``(K - 1 - s + shift_p) mod K`` with ``shift_p = p * K / (replicas / 2)``; for two replicas
    this is GEMS MAST (device r holds stage r of A and stage K-1-r of B).
    """
    if replicas < 1:
        raise UsageError(f"replicas must be at least 1, got {replicas}")
    if replicas > 1 and replicas % 2:
        raise UsageError(f"MAST/MASTER replicas come in pairs (2, 4, ...), got {replicas}")
    K = stages
    out = []
    pairs = max(replicas // 2, 1)
    for k in range(replicas):
        shift = (k // 2) * K // pairs
        if k % 2 == 0:
            out.append(tuple((s + shift) % K for s in range(K)))
        else:
            out.append(tuple((K - 1 - s + shift) % K for s in range(K)))
    return tuple(out)


def replication_of(plan: Plan) -> Replication | None:
    """The replication a plan records (``plan.extra['parallel']``), or None for plain plans."""
    par = plan.extra.get("parallel")
    if not par:
        return None
    stage_of = np.asarray(par.get("stage_of", plan.assignment), dtype=np.int64)
    if stage_of.shape != plan.assignment.shape:
        stage_of = plan.assignment.copy()
    return Replication(str(par["mode"]), int(par["replicas"]), int(par["dp"]), stage_of,
                       tuple(tuple(int(d) for d in m) for m in par["maps"]))


def make_replication(mode: str, stage_of: np.ndarray, stages: int, replicas: int = 1,
                     dp: int = 1) -> Replication:
    if mode not in MODES:
        raise UsageError(f"unknown parallel mode {mode!r}: use {', '.join(MODES)}")
    if dp < 1:
        raise UsageError(f"--dp must be at least 1, got {dp}")
    if mode == "mp" and replicas != 1:
        raise UsageError("mp has one replica; use mast or master for more")
    if mode == "mast" and replicas != 2:
        raise UsageError("mast has exactly two replicas; use master for more")
    if replicas > stages and replicas > 1:
        raise UsageError(f"{replicas} replicas on {stages} devices: at most one replica per "
                         "device and direction; use data parallelism (--dp) for more")
    return Replication(mode, replicas, dp, np.asarray(stage_of, dtype=np.int64),
                       gems_maps(stages, replicas))


def copy_prefix(copy: int) -> str:
    return f"c{copy}{SEP}"


def fx_name(name: str) -> str:
    """The layer name of a (possibly copied) node name: ``c3/layer1_0_conv1`` -> ``layer1...``."""
    return name.split(SEP, 1)[1] if SEP in name else name


def copy_of(name: str) -> int:
    """The copy a node name belongs to (0 for uncopied graphs)."""
    return int(name.split(SEP, 1)[0][1:]) if SEP in name else 0


def expand_policies(plan: Plan, g: Graph, copies: int) -> MemoryPolicies | None:
    """The plan's memory-policy groups for ``g``, repeated for each copy."""
    pol = policies_from_plan(plan.extra, g.ids)
    if pol is None or copies == 1:
        return pol
    return MemoryPolicies(np.tile(pol.group_of, copies), pol.policies)


def expand(g: Graph, plan: Plan) -> tuple[Graph, np.ndarray, int]:
    """The graph every rank executes, its assignment, and the number of copies.

    For a plain plan that is ``(g, plan.assignment, 1)``. For a replicated plan, copy
    ``c = d * replicas + k`` (data-parallel replica ``d``, model replica ``k``) places node ``v``
    on rank ``d * K + maps[k][stage_of[v]]``.
    """
    rep = replication_of(plan)
    if rep is None:
        return g, plan.assignment, 1
    if rep.ranks != plan.devices:
        raise PlanError(f"the plan's replication needs {rep.ranks} ranks but it says "
                        f"{plan.devices} devices")
    n, C = g.num_nodes, rep.copies
    maps = np.asarray(rep.maps, dtype=np.int64)
    assign = np.concatenate([d * rep.stages + maps[k][rep.stage_of]
                             for d in range(rep.dp) for k in range(rep.replicas)])
    names = [copy_prefix(c) + g.name_of(i) for c in range(C) for i in range(n)]
    offs = np.repeat(np.arange(C, dtype=np.int64) * n, g.num_edges)
    attrs = None
    if g.attrs is not None:
        attrs = [dict(g.attrs[i], copy=c) for c in range(C) for i in range(n)]
    big = build(
        g.name, fwd_s=np.tile(g.fwd_s, C), bwd_s=np.tile(g.bwd_s, C),
        param_bytes=np.tile(g.param_bytes, C), out_bytes=np.tile(g.out_bytes, C),
        saved_bytes=np.tile(g.saved_bytes, C), src=np.tile(g.src, C) + offs,
        dst=np.tile(g.dst, C) + offs, edge_bytes=np.tile(g.edge_bytes, C), names=names,
        ops=list(g.ops) * C if g.ops is not None else None,
        modules=list(g.modules) * C if g.modules is not None else None, attrs=attrs,
        batch_size=g.batch_size, meta={**g.meta, "copies": C}, check=False)
    return big, assign, C
