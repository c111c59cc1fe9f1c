"""The Plan value and its ``outcore-plan/1`` JSON form (DESIGN.md).

A plan says where every node of a graph runs (``assignment``: node index -> device), how the
iteration is scheduled (schedule name, micro-batches), for which cluster and memory limit, and
what the planner predicted. It never holds torch objects.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from outcore.errors import FormatError, PlanError
from outcore.graph.ir import Graph

FORMAT = "outcore-plan/1"


def fingerprint(g: Graph) -> str:
    """A short hash of the graph's structure (node names and edges), not of its costs."""
    h = hashlib.sha1()
    h.update(str(g.num_nodes).encode())
    if g.names is not None:
        h.update("\0".join(g.names).encode())
    else:
        h.update(g.ids.astype(np.int64).tobytes())
    h.update(g.src.astype(np.int64).tobytes())
    h.update(g.dst.astype(np.int64).tobytes())
    return h.hexdigest()[:16]


def graph_ref(g: Graph) -> dict[str, Any]:
    """What a plan records about the graph it was made for."""
    return {"name": g.name, "nodes": g.num_nodes, "edges": g.num_edges,
            "depth": g.meta.get("depth"), "batch_size": g.batch_size,
            "fingerprint": fingerprint(g)}


@dataclass(frozen=True, eq=False)
class Plan:
    """Where every node runs and how the iteration is scheduled.

    Attributes:
        strategy: planner that made it (``pardnn``, ``pipeline``, ...).
        devices: number of devices (ranks) the plan uses.
        memory_bytes: per-device memory limit it was made for (None: unlimited).
        assignment: ``int64[n]`` device of each node, by node index of the graph.
        node_ids: ``int64[n]`` the graph's node ids (for the JSON form).
        graph: :func:`graph_ref` of the graph.
        schedule: ``gpipe`` or ``1f1b``.
        microbatches: micro-batches per iteration.
        optimizer: optimizer the memory model assumed (``adam``: 4 × params).
        cluster: link and device description the plan was made for.
        predicted: ``iteration_s``, ``peak_bytes`` (per device), ... from the simulator.
        extra: anything else a strategy records (stages, replicas, memory policies).
    """

    strategy: str
    devices: int
    memory_bytes: float | None
    assignment: np.ndarray
    node_ids: np.ndarray
    graph: dict[str, Any] = field(default_factory=dict)
    schedule: str = "1f1b"
    microbatches: int = 1
    optimizer: str = "adam"
    cluster: dict[str, Any] = field(default_factory=dict)
    predicted: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def replace(self, **changes: Any) -> "Plan":
        return replace(self, **changes)

    @property
    def used_devices(self) -> int:
        return int(np.unique(self.assignment).size)

    def check(self, g: Graph) -> None:
        """Raise :class:`PlanError` unless this plan places every node of ``g`` on a device."""
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
        if self.assignment.size and (self.assignment.min() < 0
                                     or self.assignment.max() >= self.devices):
            raise PlanError(f"the plan places a node on a device outside 0..{self.devices - 1}")


def make_plan(g: Graph, assignment: np.ndarray, *, strategy: str, devices: int,
              memory_bytes: float | None, **kwargs: Any) -> Plan:
    """A :class:`Plan` for graph ``g`` (records :func:`graph_ref`)."""
    plan = Plan(strategy=strategy, devices=int(devices), memory_bytes=memory_bytes,
                assignment=np.asarray(assignment, dtype=np.int64), node_ids=g.ids.copy(),
                graph=graph_ref(g), **kwargs)
    plan.check(g)
    return plan


def to_dict(p: Plan) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": FORMAT, "strategy": p.strategy, "devices": p.devices,
        "memory_bytes": p.memory_bytes,
        "assignment": {str(i): int(d) for i, d in zip(p.node_ids.tolist(), p.assignment.tolist())},
        "predicted": _jsonable(p.predicted), "schedule": p.schedule,
        "microbatches": p.microbatches, "optimizer": p.optimizer, "graph": p.graph,
        "cluster": _jsonable(p.cluster),
    }
    doc.update(_jsonable(p.extra))
    return doc


_KNOWN = ("format", "strategy", "devices", "memory_bytes", "assignment", "predicted", "schedule",
          "microbatches", "optimizer", "graph", "cluster")


def from_dict(doc: Any, source: str = "plan") -> Plan:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        hint = " (is this a graph? plans come from `outcore plan`)" \
            if str(got).startswith("outcore-graph") else ""
        raise FormatError(f"{source}: format is {got!r}, expected {FORMAT!r}{hint}")
    assignment = doc.get("assignment")
    if not isinstance(assignment, dict) or not assignment:
        raise FormatError(f"{source}: 'assignment' must map node ids to devices")
    try:
        pairs = sorted((int(k), int(v)) for k, v in assignment.items())
        devices = int(doc["devices"])
    except (KeyError, TypeError, ValueError):
        raise FormatError(f"{source}: needs integer 'devices' and an assignment of integer "
                          "node ids to integer devices") from None
    graph = doc.get("graph") or {}
    return Plan(
        strategy=str(doc.get("strategy", "unknown")), devices=devices,
        memory_bytes=doc.get("memory_bytes"),
        assignment=np.array([v for _, v in pairs], dtype=np.int64),
        node_ids=np.array([k for k, _ in pairs], dtype=np.int64),
        graph=graph, schedule=str(doc.get("schedule", "1f1b")),
        microbatches=int(doc.get("microbatches", 1)), optimizer=str(doc.get("optimizer", "adam")),
        cluster=doc.get("cluster") or {}, predicted=doc.get("predicted") or {},
        extra={k: v for k, v in doc.items() if k not in _KNOWN},
    )


def align(p: Plan, g: Graph) -> Plan:
    """Reorder a loaded plan's arrays to ``g``'s node order (plans store ids, sorted)."""
    index = g.index_of_id
    missing = [i for i in p.node_ids.tolist() if i not in index]
    if missing or p.node_ids.size != g.num_nodes:
        extra = f" (e.g. node {missing[0]})" if missing else ""
        raise PlanError(f"the plan covers {p.node_ids.size} nodes{extra}, graph {g.name!r} has "
                        f"{g.num_nodes}: plan and graph do not match")
    assignment = np.empty(g.num_nodes, dtype=np.int64)
    assignment[[index[i] for i in p.node_ids.tolist()]] = p.assignment
    return p.replace(assignment=assignment, node_ids=g.ids.copy())


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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_dict(p), indent=1))
    os.replace(tmp, path)
    return path


def load(path: str | os.PathLike) -> Plan:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(f"plan file {str(path)!r} does not exist") from None
    except json.JSONDecodeError as e:
        raise FormatError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return from_dict(doc, str(path))
