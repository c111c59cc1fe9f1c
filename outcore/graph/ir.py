"""The graph IR: a DAG of layers with costs, held in arrays.

Nodes are addressed by their *index* ``0..n-1`` (positions in the arrays) everywhere inside
outcore; the *id* is the integer the user's file gave the node (``ids[index]``), kept for I/O.
Edges are parallel arrays ``src``, ``dst``, ``edge_bytes`` of node indices. Successor and
predecessor lists are CSR arrays built on first use.

The module path of a node (``"layer1.0.conv1"``) keeps the model hierarchy so that
:func:`outcore.graph.coarsen.collapse` can fold any block into one node.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Sequence

import numpy as np

from outcore.errors import GraphError
from outcore.graph.order import find_cycle, topological_order

FORMAT = "outcore-graph/1"


@dataclass(frozen=True, eq=False)
class Graph:
    """An acyclic dataflow graph with per-node costs.

    Attributes (n nodes, m edges):
        name: model name.
        batch_size: batch the costs were measured or estimated for (``None`` if unknown).
        ids: ``int64[n]`` user-visible node ids, unique.
        fwd_s, bwd_s: ``float64[n]`` forward and backward time of each node, seconds.
        param_bytes: ``int64[n]`` bytes of parameters owned by the node.
        out_bytes: ``int64[n]`` bytes of the node's output.
        saved_bytes: ``int64[n]`` bytes autograd keeps from the forward until the backward.
        src, dst: ``int64[m]`` edge endpoints (node indices).
        edge_bytes: ``int64[m]`` bytes carried by each edge.
        names, ops, modules: per-node strings (``None`` = not recorded; see :meth:`name`).
        attrs: per-node dicts of extra fields kept through I/O (shapes, FLOPs, fx names), or None.
        meta: graph-level extra fields (input shape, depth, cost source, ...).
    """

    name: str
    batch_size: int | None
    ids: np.ndarray
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    param_bytes: np.ndarray
    out_bytes: np.ndarray
    saved_bytes: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    edge_bytes: np.ndarray
    names: tuple[str, ...] | None = None
    ops: tuple[str, ...] | None = None
    modules: tuple[str, ...] | None = None
    attrs: tuple[dict[str, Any], ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ sizes and labels
    @property
    def num_nodes(self) -> int:
        return int(self.ids.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.src.shape[0])

    def __len__(self) -> int:
        return self.num_nodes

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, nodes={self.num_nodes}, edges={self.num_edges})"

    def name_of(self, i: int) -> str:
        """Name of node index ``i`` (``n<id>`` when names were not recorded)."""
        return self.names[i] if self.names is not None else f"n{int(self.ids[i])}"

    def op_of(self, i: int) -> str:
        return self.ops[i] if self.ops is not None else "op"

    def module_of(self, i: int) -> str:
        return self.modules[i] if self.modules is not None else ""

    def attr(self, i: int, key: str, default: Any = None) -> Any:
        return self.attrs[i].get(key, default) if self.attrs is not None else default

    def nodes_with_op(self, op: str) -> np.ndarray:
        """Indices of the nodes whose op is ``op`` (empty when ops were not recorded)."""
        return self._nodes_by_op.get(op, np.zeros(0, dtype=np.int64))

    @cached_property
    def _nodes_by_op(self) -> dict[str, np.ndarray]:
        if self.ops is None:
            return {}
        by_op: dict[str, list[int]] = {}
        for i, op in enumerate(self.ops):
            by_op.setdefault(op, []).append(i)
        return {op: np.array(v, dtype=np.int64) for op, v in by_op.items()}

    @cached_property
    def saved_input_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(savers, producers)``: node ``savers[j]`` is the first to save the output of its
        input ``producers[j]`` for its backward (``attrs['saved_inputs']``, recorded by the
        capture; empty for graphs without it)."""
        return self._input_pairs("saved_inputs")

    @cached_property
    def resaved_input_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(savers, producers)``: node ``savers[j]`` saves the output of its input
        ``producers[j]`` after another node saved it first, whose saved bytes count it
        (``attrs['resaved_inputs']``): the producer itself, or the first saver of
        :attr:`saved_input_pairs`."""
        return self._input_pairs("resaved_inputs")

    @cached_property
    def storage_root(self) -> np.ndarray:
        """Per node, the node that made the storage its output views (``attrs['storage_of']``,
        recorded by the capture: a reshape or a chunk of it); the node itself where its
        output has a storage of its own (an in-place write's too), or the graph does not say."""
        root = np.arange(self.num_nodes, dtype=np.int64)
        if self.attrs is not None and self.names is not None:
            for v, a in enumerate(self.attrs):
                owner = a.get("storage_of")
                if owner is not None and owner in self.index_of_name:
                    root[v] = self.index_of_name[owner]
        return root

    def _input_pairs(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        savers: list[int] = []
        producers: list[int] = []
        if self.attrs is not None and self.names is not None:
            for v, a in enumerate(self.attrs):
                for name in a.get(key, ()):
                    if name in self.index_of_name:
                        savers.append(v)
                        producers.append(self.index_of_name[name])
        return np.array(savers, dtype=np.int64), np.array(producers, dtype=np.int64)

    @cached_property
    def structure(self) -> "Structure":
        """A token shared by this graph and every :meth:`replace` of it that keeps its nodes
        and edges (a rescaled copy): caches of what depends on the edges alone key on it."""
        return Structure()

    @cached_property
    def index_of_name(self) -> dict[str, int]:
        """Map from node name (:meth:`name_of`) to node index."""
        return {self.name_of(i): i for i in range(self.num_nodes)}

    @cached_property
    def index_of_id(self) -> dict[int, int]:
        """Map from user id to node index."""
        return {int(v): i for i, v in enumerate(self.ids.tolist())}

    # ------------------------------------------------------------------ adjacency (CSR)
    @cached_property
    def _succ(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _csr(self.src, self.dst, self.num_nodes)

    @cached_property
    def _pred(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _csr(self.dst, self.src, self.num_nodes)

    @property
    def succ_ptr(self) -> np.ndarray:
        """``int64[n+1]``: successors of i are ``succ_idx[succ_ptr[i]:succ_ptr[i+1]]``."""
        return self._succ[0]

    @property
    def succ_idx(self) -> np.ndarray:
        return self._succ[1]

    @property
    def succ_edge(self) -> np.ndarray:
        """Edge number of each entry of ``succ_idx``."""
        return self._succ[2]

    @property
    def pred_ptr(self) -> np.ndarray:
        return self._pred[0]

    @property
    def pred_idx(self) -> np.ndarray:
        return self._pred[1]

    @property
    def pred_edge(self) -> np.ndarray:
        return self._pred[2]

    def successors(self, i: int) -> np.ndarray:
        p = self.succ_ptr
        return self.succ_idx[p[i]:p[i + 1]]

    def predecessors(self, i: int) -> np.ndarray:
        p = self.pred_ptr
        return self.pred_idx[p[i]:p[i + 1]]

    @cached_property
    def param_nodes(self) -> np.ndarray:
        """``int64`` indices of the parameter nodes (op ``param``: an exported graph's weight
        reads), computed once."""
        if self.ops is None:
            return np.zeros(0, dtype=np.int64)
        return np.array([i for i, op in enumerate(self.ops) if op == "param"], dtype=np.int64)

    @cached_property
    def out_degree(self) -> np.ndarray:
        return np.diff(self.succ_ptr)

    @cached_property
    def in_degree(self) -> np.ndarray:
        return np.diff(self.pred_ptr)

    @cached_property
    def fingerprint(self) -> str:
        """A short hash of the structure (node names, or ids, and edges), not of the costs;
        made once (a search makes and checks dozens of plans of one graph: 0.6 s at 1M nodes
        when hashed each time) and kept by :meth:`replace` copies of the same structure."""
        h = hashlib.sha1()
        h.update(str(self.num_nodes).encode())
        if self.names is not None:
            h.update("\0".join(self.names).encode())
        else:
            h.update(self.ids.astype(np.int64).tobytes())
        h.update(self.src.astype(np.int64).tobytes())
        h.update(self.dst.astype(np.int64).tobytes())
        return h.hexdigest()[:16]

    # ------------------------------------------------------------------ totals
    @property
    def total_fwd_s(self) -> float:
        return float(self.fwd_s.sum())

    @property
    def total_compute_s(self) -> float:
        return float(self.fwd_s.sum() + self.bwd_s.sum())

    @property
    def total_param_bytes(self) -> int:
        return int(self.param_bytes.sum())

    def replace(self, **changes: Any) -> "Graph":
        """A new graph with some fields replaced. Caches of the structure (adjacency, names,
        ops) are carried over when the fields they derive from are unchanged: the search
        rescales one graph's costs for each micro-batch size it weighs."""
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__}
        fields.update(changes)
        out = Graph(**fields)
        self.structure  # noqa: B018 (made now, so that every copy that keeps the edges shares it)
        if "ops" not in changes:
            self._nodes_by_op  # noqa: B018 (likewise: every lowering of a copy reads it)
        for cache, needs in _STRUCTURE_CACHES.items():
            if cache in self.__dict__ and all(fields[f] is getattr(self, f) for f in needs):
                out.__dict__[cache] = self.__dict__[cache]
        return out


class Structure:
    """See :attr:`Graph.structure` (an object that weak references can point to)."""

    __slots__ = ("__weakref__",)


_MEMOS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def memo(owner: Graph | Structure, name: str) -> dict:
    """What a planner remembers of ``owner`` under ``name``, as long as ``owner`` lives: of a
    :class:`Graph` (its costs included), or of its :attr:`~Graph.structure` (what depends on
    the edges alone, shared by the copies the layout search rescales). Not part of the graph:
    nothing of it is copied or pickled with it."""
    return _MEMOS.setdefault(owner, {}).setdefault(name, {})


def attr_values(g: Graph, key: str, default: float = 0.0) -> np.ndarray:
    """Per node, the number ``attrs[key]`` records (``default`` where it records none or 0),
    remembered with the graph's structure for its attributes (the rescaled copies share it)."""
    known = memo(g.structure, f"attr {key}")
    if id(g.attrs) not in known:
        out = np.full(g.num_nodes, float(default))
        if g.attrs is not None:
            for v, a in enumerate(g.attrs):
                if a.get(key):
                    out[v] = float(a[key])
        known[id(g.attrs)] = out
    return known[id(g.attrs)]


# cached properties of a Graph that depend only on the fields named (see Graph.replace)
_STRUCTURE_CACHES = {
    "structure": ("src", "dst", "ids"),
    "_succ": ("src", "dst", "ids"), "_pred": ("src", "dst", "ids"),
    "out_degree": ("src", "dst", "ids"), "in_degree": ("src", "dst", "ids"),
    "_nodes_by_op": ("ops",), "param_nodes": ("ops",),
    "index_of_name": ("names", "ids"), "index_of_id": ("ids",),
    "saved_input_pairs": ("attrs", "names", "ids"),
    "resaved_input_pairs": ("attrs", "names", "ids"),
    "storage_root": ("attrs", "names", "ids"),
    "fingerprint": ("names", "ids", "src", "dst"),
}


def _csr(a: np.ndarray, b: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR of edges a->b grouped by ``a`` (stable: keeps edge order within a row)."""
    order = np.argsort(a, kind="stable")
    counts = np.bincount(a, minlength=n) if a.size else np.zeros(n, dtype=np.int64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, b[order].astype(np.int64, copy=False), order.astype(np.int64, copy=False)


def build(
    name: str,
    *,
    fwd_s: Sequence[float] | np.ndarray,
    src: Sequence[int] | np.ndarray = (),
    dst: Sequence[int] | np.ndarray = (),
    edge_bytes: Sequence[float] | np.ndarray | None = None,
    ids: Sequence[int] | np.ndarray | None = None,
    bwd_s: Sequence[float] | np.ndarray | None = None,
    param_bytes: Sequence[float] | np.ndarray | None = None,
    out_bytes: Sequence[float] | np.ndarray | None = None,
    saved_bytes: Sequence[float] | np.ndarray | None = None,
    names: Sequence[str] | None = None,
    ops: Sequence[str] | None = None,
    modules: Sequence[str] | None = None,
    attrs: Sequence[dict[str, Any]] | None = None,
    batch_size: int | None = None,
    meta: dict[str, Any] | None = None,
    check: bool = True,
) -> Graph:
    """Build a :class:`Graph` from node arrays and edges given as node *indices*.

    Missing fields take the format's defaults (docs/design.md): ``bwd_s = 2 * fwd_s``,
    ``param_bytes = 0``, ``out_bytes`` = largest outgoing edge, ``saved_bytes = out_bytes``.
    With ``check`` the graph is validated (finite non-negative costs, edges in range, no self
    loop, acyclic).
    """
    fwd = np.asarray(fwd_s, dtype=np.float64)
    n = fwd.shape[0]
    s = np.asarray(src, dtype=np.int64).reshape(-1)
    d = np.asarray(dst, dtype=np.int64).reshape(-1)
    if s.shape != d.shape:
        raise GraphError(f"graph {name!r}: {s.size} edge sources but {d.size} destinations")
    eb = _int_array(edge_bytes, s.size)
    node_ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
    bwd = 2.0 * fwd if bwd_s is None else np.asarray(bwd_s, dtype=np.float64)
    par = _int_array(param_bytes, n)
    if out_bytes is None:
        out = np.zeros(n, dtype=np.int64)
        if s.size:
            np.maximum.at(out, s, eb)
    else:
        out = _int_array(out_bytes, n)
    saved = out.copy() if saved_bytes is None else _int_array(saved_bytes, n)
    g = Graph(
        name=name, batch_size=batch_size, ids=node_ids, fwd_s=fwd, bwd_s=bwd, param_bytes=par,
        out_bytes=out, saved_bytes=saved, src=s, dst=d, edge_bytes=eb,
        names=tuple(names) if names is not None else None,
        ops=tuple(ops) if ops is not None else None,
        modules=tuple(modules) if modules is not None else None,
        attrs=tuple(attrs) if attrs is not None else None,
        meta=dict(meta or {}),
    )
    if check:
        validate(g)
    return g


def _int_array(values: Any, n: int) -> np.ndarray:
    if values is None:
        return np.zeros(n, dtype=np.int64)
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":  # whole already
        return np.asarray(values, dtype=np.int64)
    return np.asarray(np.rint(np.asarray(values, dtype=np.float64)), dtype=np.int64)


def validate(g: Graph) -> None:
    """Raise :class:`GraphError` naming the first problem found in ``g``."""
    n = g.num_nodes
    for label, arr in (("fwd_s", g.fwd_s), ("bwd_s", g.bwd_s), ("param_bytes", g.param_bytes),
                       ("out_bytes", g.out_bytes), ("saved_bytes", g.saved_bytes)):
        if arr.shape != (n,):
            raise GraphError(f"graph {g.name!r}: {label} has {arr.shape[0]} entries for {n} nodes")
        bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0)) if arr.dtype.kind == "f" \
            else np.flatnonzero(arr < 0)
        if bad.size:
            i = int(bad[0])
            raise GraphError(f"graph {g.name!r}: node {int(g.ids[i])} ({g.name_of(i)}) has "
                             f"{label} = {arr[i]}; costs must be finite and non-negative")
    for label, seq in (("names", g.names), ("ops", g.ops), ("modules", g.modules),
                       ("attrs", g.attrs)):
        if seq is not None and len(seq) != n:
            raise GraphError(f"graph {g.name!r}: {len(seq)} {label} for {n} nodes")
    if np.unique(g.ids).size != n:
        ids, counts = np.unique(g.ids, return_counts=True)
        raise GraphError(f"graph {g.name!r}: node id {int(ids[counts > 1][0])} is used twice")
    if g.num_edges:
        if g.src.min() < 0 or g.dst.min() < 0 or g.src.max() >= n or g.dst.max() >= n:
            raise GraphError(f"graph {g.name!r}: an edge refers to a node that does not exist")
        loops = np.flatnonzero(g.src == g.dst)
        if loops.size:
            i = int(g.src[loops[0]])
            raise GraphError(f"graph {g.name!r}: node {int(g.ids[i])} has an edge to itself")
        if (g.edge_bytes < 0).any():
            e = int(np.flatnonzero(g.edge_bytes < 0)[0])
            raise GraphError(f"graph {g.name!r}: edge {int(g.ids[g.src[e]])}->"
                             f"{int(g.ids[g.dst[e]])} has negative bytes")
    order = topological_order(g, strict=False)
    if order.size != n:
        cycle = find_cycle(g)
        shown = " -> ".join(str(int(g.ids[i])) for i in cycle[:8])
        more = " ..." if len(cycle) > 8 else ""
        raise GraphError(f"graph {g.name!r} has a cycle ({shown}{more}); a training graph must "
                         "be acyclic")
