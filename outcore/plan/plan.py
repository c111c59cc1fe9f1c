"""The Plan value and its JSON form, ``outcore-plan/2`` (docs/design.md, "Formats"; ``/1`` files
still read).

A plan says where every node of a graph runs (``assignment``: node index -> stage), on which
process mesh (``layout``: GEMS replicas, data, tensor and spatial degrees), with which per-piece
memory policies, for which cluster and memory limit, how the iteration is scheduled (schedule
name, micro-batches), and what the planner predicted. Every concept is a typed field; ``extra``
keeps only free-form notes a tool wants to carry along. It never holds torch objects.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from outcore.errors import FormatError, PlanError
from outcore.graph.ir import Graph
from outcore.hardware import cluster as cluster_io
from outcore.hardware.spec import Cluster, flat_cluster
from outcore.jsonfile import read_json, write_json
from outcore.plan.layout import PLAIN, Layout
from outcore.plan.policies import POLICIES, MemoryPolicies
from outcore.plan.spatial import SpatialPlan

FORMAT = "outcore-plan/2"
READS = ("outcore-plan/1", FORMAT)
SCHEDULES = ("gpipe", "1f1b")

__all__ = ["FORMAT", "Plan", "align", "fingerprint", "from_dict", "graph_ref", "load",
           "make_plan", "save", "to_dict"]


def fingerprint(g: Graph) -> str:
    """A short hash of the graph's structure (node names and edges), not of its costs
    (:attr:`Graph.fingerprint`, made once per graph)."""
    return g.fingerprint


def graph_ref(g: Graph) -> dict[str, Any]:
    """What a plan records about the graph it was made for."""
    return {"name": g.name, "nodes": g.num_nodes, "edges": g.num_edges,
            "depth": g.meta.get("depth"), "batch_size": g.batch_size,
            "fingerprint": fingerprint(g)}


@dataclass(frozen=True, eq=False, kw_only=True)
class Plan:
    """Where every node runs, on which mesh, and how the iteration is scheduled.

    Attributes:
        strategy: planner that made it (``pardnn``, ``pipeline``, ...).
        devices: ranks the plan runs on (the whole mesh: ``layout.ranks(stages)``).
        memory_bytes: per-device memory limit it was made for (None: unlimited).
        assignment: ``int64[n]`` stage of each node (its device for a plain plan), by node
            index of the graph.
        node_ids: ``int64[n]`` the graph's node ids (for the JSON form).
        graph: :func:`graph_ref` of the graph.
        layout: the process mesh (:class:`~outcore.plan.layout.Layout`).
        policies: per-node memory policies (checkpointing, offloading) or None.
        cluster: devices and links the plan was made for (None: a generic flat network; see
            :meth:`cluster_or_default`).
        schedule: ``gpipe`` or ``1f1b``.
        microbatches: micro-batches per iteration and model copy.
        optimizer: optimizer the memory model assumed (``adam``: 4 x params).
        predicted: ``iteration_s``, ``peak_bytes`` (per device), ... from the simulator.
        notes: what the planner tried and why it chose this plan, one line each.
        devices_used: model-parallel devices the placement uses (a planner may use fewer).
        spatial: with ``layout.sp > 1``, the tiled layers and the join
            (:class:`~outcore.plan.spatial.SpatialPlan`).
        extra: free-form notes a tool records; nothing outcore reads.
    """

    strategy: str
    devices: int
    memory_bytes: float | None
    assignment: np.ndarray
    node_ids: np.ndarray
    graph: dict[str, Any] = field(default_factory=dict)
    layout: Layout = PLAIN
    policies: MemoryPolicies | None = None
    cluster: Cluster | None = None
    schedule: str = "1f1b"
    microbatches: int = 1
    optimizer: str = "adam"
    predicted: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    devices_used: int | None = None
    spatial: SpatialPlan | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def replace(self, **changes: Any) -> "Plan":
        return replace(self, **changes)

    @property
    def used_devices(self) -> int:
        return int(np.unique(self.assignment).size)

    @property
    def stages(self) -> int:
        """Model-parallel devices of one copy (the range of ``assignment``)."""
        return self.layout.stages if self.layout.replicated else self.devices // \
            self.layout.tp - (self.layout.sp - 1)

    def with_notes(self, *lines: str) -> "Plan":
        return self.replace(notes=self.notes + tuple(lines))

    def cluster_or_default(self) -> Cluster:
        """The cluster the plan was made for, its device memory set to the plan's limit; a
        generic flat 16 GB/s, 25 us network of ``devices`` devices when it records none."""
        mem = float(self.memory_bytes) if self.memory_bytes else math.inf
        if self.cluster is None:
            return flat_cluster(self.devices, memory_bytes=mem)
        return self.cluster.with_memory(mem)

    def check(self, g: Graph) -> None:
        """Raise :class:`PlanError` unless this plan places every node of ``g`` on a device
        of its mesh."""
        if self.assignment.shape != (g.num_nodes,):
            raise PlanError(f"the plan places {self.assignment.shape[0]} nodes but graph "
                            f"{g.name!r} has {g.num_nodes}: plan and graph do not match")
        if not np.array_equal(self.node_ids, g.ids):
            raise PlanError(f"the plan's node ids differ from graph {g.name!r}: plan and graph "
                            "do not match")
        fp = self.graph.get("fingerprint")
        if fp and fp != fingerprint(g):
            raise PlanError(f"the plan was made for a different graph (fingerprint {fp}, this "
                            f"graph {fingerprint(g)}): re-plan, or capture the same model at "
                            f"depth {self.graph.get('depth')}")
        self.validate()

    def validate(self, source: str = "the plan") -> None:
        """Raise :class:`PlanError` unless the plan is consistent in itself: every node on a
        stage of the mesh, the mesh as large as ``devices``, known schedule and policies."""
        stages = self.stages
        if self.assignment.size and (self.assignment.min() < 0
                                     or self.assignment.max() >= max(stages, 1)):
            bad = int(self.assignment.max() if self.assignment.max() >= stages
                      else self.assignment.min())
            raise PlanError(f"{source} places a node on device {bad}, outside 0..{stages - 1}:"
                            " re-plan, or fix its assignment")
        if self.layout.replicated and self.layout.ranks(stages) != self.devices:
            raise PlanError(f"{source}'s layout needs {self.layout.ranks(stages)} ranks but it "
                            f"says {self.devices} devices")
        if self.devices < 1 or self.devices % self.layout.tp or stages < 1:
            raise PlanError(f"{source} has {self.devices} devices, not a multiple of "
                            f"tp = {self.layout.tp} or fewer than sp = {self.layout.sp}")
        if (self.layout.sp > 1) != (self.spatial is not None):
            raise PlanError(f"{source} has sp {self.layout.sp} but "
                            f"{'no' if self.spatial is None else 'a'} spatial join: re-plan")
        if self.schedule not in SCHEDULES:
            raise PlanError(f"{source} asks for schedule {self.schedule!r}: use "
                            f"{' or '.join(SCHEDULES)}")
        if self.microbatches < 1:
            raise PlanError(f"{source} has {self.microbatches} micro-batches; at least 1")
        if self.policies is not None and self.policies.group_of.shape != self.assignment.shape:
            raise PlanError(f"{source}'s memory policies cover "
                            f"{self.policies.group_of.size} nodes, its assignment "
                            f"{self.assignment.size}")


def colocated_params(g: Graph, assignment: np.ndarray) -> np.ndarray:
    """``assignment`` with every parameter node (``param``: an exported graph's weight read)
    whose consumers all sit on one other device moved there: a weight lives where it is used
    (sent instead, it would cross every micro-batch, and a tensor-parallel shard cannot travel
    as a boundary tensor). A weight used on several devices (tied) stays where it was placed."""
    if not g.param_nodes.size or assignment.shape != (g.num_nodes,):
        return assignment
    is_param = np.zeros(g.num_nodes, dtype=bool)
    is_param[g.param_nodes] = True
    used = is_param[g.src]
    if (used & is_param[g.dst]).any():  # a weight read feeding another: one at a time
        return _colocated_in_order(g, assignment)
    src, on = g.src[used], assignment[g.dst[used]]
    lo = np.full(g.num_nodes, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(g.num_nodes, -1, dtype=np.int64)
    np.minimum.at(lo, src, on)
    np.maximum.at(hi, src, on)
    move = is_param & (lo == hi) & (hi != assignment)
    out = assignment.copy()
    out[move] = hi[move]
    return out


def _colocated_in_order(g: Graph, assignment: np.ndarray) -> np.ndarray:
    """:func:`colocated_params` one parameter node at a time, in index order."""
    out = assignment.copy()
    for v in g.param_nodes.tolist():
        users = {int(out[int(u)]) for u in g.successors(v)}
        if len(users) == 1 and out[v] not in users:
            out[v] = users.pop()
    return out


def make_plan(g: Graph, assignment: np.ndarray, *, strategy: str, devices: int,
              memory_bytes: float | None, **kwargs: Any) -> Plan:
    """A :class:`Plan` for graph ``g`` (records :func:`graph_ref`)."""
    plan = Plan(strategy=strategy, devices=int(devices), memory_bytes=memory_bytes,
                assignment=colocated_params(g, np.asarray(assignment, dtype=np.int64)),
                node_ids=g.ids.copy(),
                graph=graph_ref(g), **kwargs)
    plan.check(g)
    return plan


def to_dict(p: Plan) -> dict[str, Any]:
    """The ``outcore-plan/2`` JSON form of a plan."""
    doc: dict[str, Any] = {
        "format": FORMAT, "strategy": p.strategy, "devices": p.devices,
        "memory_bytes": p.memory_bytes,
        "assignment": {str(i): int(d) for i, d in zip(p.node_ids.tolist(), p.assignment.tolist())},
        "predicted": _jsonable(p.predicted), "schedule": p.schedule,
        "microbatches": p.microbatches, "optimizer": p.optimizer, "graph": p.graph,
        "layout": p.layout.to_dict(),
        "cluster": cluster_io.to_dict(p.cluster) if p.cluster is not None else None,
        "notes": list(p.notes), "devices_used": p.devices_used,
        "extra": _jsonable(p.extra),
    }
    if p.policies is not None:
        doc["memory_policy"] = p.policies.to_dict(p.node_ids, p.assignment)
    if p.spatial is not None:
        doc["spatial"] = p.spatial.to_dict()
    return doc


_V1_KNOWN = ("format", "strategy", "devices", "memory_bytes", "assignment", "predicted",
             "schedule", "microbatches", "optimizer", "graph", "cluster", "parallel",
             "memory_policy", "notes", "devices_used", "spatial")


def from_dict(doc: Any, source: str = "plan") -> Plan:
    """A plan from its JSON form (``outcore-plan/2``, or ``/1`` as earlier versions wrote it),
    validated: a plan that places a node outside its mesh is refused here, not in a worker."""
    if not isinstance(doc, dict) or doc.get("format") not in READS:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        hint = " (is this a graph? plans come from `outcore plan`)" \
            if str(got).startswith("outcore-graph") else ""
        raise FormatError(f"{source}: format is {got!r}, expected {FORMAT!r}{hint}")
    ids, assignment, devices = _assignment(doc, source)
    v1 = doc["format"] == "outcore-plan/1"
    memory = doc.get("memory_bytes")
    layout = _layout_v1(doc.get("parallel"), source) if v1 else \
        Layout.from_dict(doc.get("layout") or {}, source)
    cl = doc.get("cluster")
    try:
        plan = Plan(
            strategy=str(doc.get("strategy", "unknown")), devices=devices,
            memory_bytes=float(memory) if memory else None, assignment=assignment,
            node_ids=ids, graph=doc.get("graph") or {}, layout=layout,
            policies=_policies(doc.get("memory_policy"), ids, source),
            cluster=cluster_io.from_dict(cl, devices=devices, memory_bytes=memory,
                                         source=f"{source}: cluster") if cl else None,
            schedule=str(doc.get("schedule", "1f1b")),
            microbatches=int(doc.get("microbatches", 1)),
            optimizer=str(doc.get("optimizer", "adam")), predicted=doc.get("predicted") or {},
            notes=tuple(str(x) for x in doc.get("notes") or ()),
            devices_used=int(doc["devices_used"]) if doc.get("devices_used") else None,
            spatial=SpatialPlan.from_dict(doc["spatial"], source) if doc.get("spatial")
            else None,
            extra={k: v for k, v in doc.items() if k not in _V1_KNOWN} if v1
            else dict(doc.get("extra") or {}))
    except (TypeError, ValueError) as e:
        raise FormatError(f"{source}: unreadable plan field ({e})") from None
    plan.validate(source)
    return plan


def _assignment(doc: dict[str, Any], source: str) -> tuple[np.ndarray, np.ndarray, int]:
    assignment = doc.get("assignment")
    if not isinstance(assignment, dict) or not assignment:
        raise FormatError(f"{source}: 'assignment' must map node ids to devices")
    try:
        pairs = sorted((int(k), int(v)) for k, v in assignment.items())
        devices = int(doc["devices"])
    except (KeyError, TypeError, ValueError):
        raise FormatError(f"{source}: needs integer 'devices' and an assignment of integer "
                          "node ids to integer devices") from None
    return (np.array([k for k, _ in pairs], dtype=np.int64),
            np.array([v for _, v in pairs], dtype=np.int64), devices)


def _layout_v1(par: Any, source: str) -> Layout:
    """``outcore-plan/1``'s ``parallel`` record (GEMS replicas and data parallelism)."""
    if not par:
        return PLAIN
    return Layout.from_dict({k: par[k] for k in ("mode", "replicas", "dp", "maps") if k in par},
                            source)


def _policies(doc: Any, ids: np.ndarray, source: str) -> MemoryPolicies | None:
    """The ``memory_policy`` record, aligned to the plan's node ids."""
    if not doc:
        return None
    try:
        policies = tuple(str(gr["policy"]) for gr in doc["groups"])
        node_group = {int(k): int(v) for k, v in doc["node_group"].items()}
    except (KeyError, TypeError, ValueError):
        raise FormatError(f"{source}: 'memory_policy' needs 'groups' (each with a 'policy') and "
                          "'node_group' (node id -> group)") from None
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise FormatError(f"{source}: unknown memory policy {bad[0]!r}: use one of {POLICIES}")
    index = {int(i): k for k, i in enumerate(ids.tolist())}
    group_of = np.full(ids.size, -1, dtype=np.int64)
    for node, gidx in node_group.items():
        if node in index:
            group_of[index[node]] = gidx
    if group_of.size and group_of.max() >= len(policies):
        raise FormatError(f"{source}: a node is in memory-policy group {int(group_of.max())} of "
                          f"{len(policies)}")
    return MemoryPolicies(group_of, policies)


def align(p: Plan, g: Graph) -> Plan:
    """Reorder a loaded plan's arrays to ``g``'s node order (plans store ids, sorted)."""
    index = g.index_of_id
    missing = [i for i in p.node_ids.tolist() if i not in index]
    if missing or p.node_ids.size != g.num_nodes:
        extra = f" (e.g. node {missing[0]})" if missing else ""
        raise PlanError(f"the plan covers {p.node_ids.size} nodes{extra}, graph {g.name!r} has "
                        f"{g.num_nodes}: plan and graph do not match")
    order = np.array([index[i] for i in p.node_ids.tolist()], dtype=np.int64)
    assignment = np.empty(g.num_nodes, dtype=np.int64)
    assignment[order] = p.assignment
    policies = None
    if p.policies is not None:
        group_of = np.empty(g.num_nodes, dtype=np.int64)
        group_of[order] = p.policies.group_of
        policies = MemoryPolicies(group_of, p.policies.policies)
    return p.replace(assignment=assignment, node_ids=g.ids.copy(), policies=policies)


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


def save(p: Plan, path: str | os.PathLike) -> Path:
    return write_json(path, to_dict(p))


def load(path: str | os.PathLike) -> Plan:
    return from_dict(read_json(path, "plan file"), str(path))
