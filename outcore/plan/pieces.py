"""Cut a placed graph into pieces: the units a rank runs forward and backward.

A piece is a connected set of nodes on one device that can run its whole forward once its inputs
have arrived (DESIGN.md, execution model). With ``hop(v)`` = the largest number of boundaries on
any path into ``v`` — a device change, or leaving a node whose output another device consumes
(such a node ends its piece, so its message departs at once) — the pieces are the connected
components of nodes with equal ``(device, hop)``. Every edge between pieces goes from a lower hop
to a higher one, so the piece graph is acyclic even when a device holds nodes on both sides of
another device's nodes; a device's pieces are ordered by hop. Pieces are numbered in (hop, first node) order, a topological
order of the piece graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from outcore.graph.algorithms import topological_order, weakly_connected_components
from outcore.graph.ir import Graph


@dataclass(frozen=True)
class Piece:
    """Nodes (indices, topological order) that one device runs as one forward/backward."""

    id: int
    device: int
    hop: int
    nodes: tuple[int, ...]
    group: int = -1  # memory-policy group (-1: none)


@dataclass(frozen=True)
class Transfer:
    """Tensors flowing from piece ``src`` to piece ``dst`` (one message per micro-batch).

    ``tensors`` are the producer nodes (indices) whose outputs cross; ``bytes`` is their total at
    the graph's batch size. ``local`` transfers stay on one device (no communication).
    """

    id: int
    src: int
    dst: int
    tensors: tuple[int, ...]
    bytes: int
    local: bool


@dataclass(frozen=True, eq=False)
class Pieces:
    pieces: tuple[Piece, ...]
    transfers: tuple[Transfer, ...]
    piece_of: np.ndarray  # int64[n]: piece of each node

    @cached_property
    def by_device(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for p in self.pieces:
            out.setdefault(p.device, []).append(p.id)
        return out

    @cached_property
    def inputs_of(self) -> list[list[int]]:
        """Transfer ids into each piece."""
        out: list[list[int]] = [[] for _ in self.pieces]
        for t in self.transfers:
            out[t.dst].append(t.id)
        return out

    @cached_property
    def outputs_of(self) -> list[list[int]]:
        """Transfer ids out of each piece."""
        out: list[list[int]] = [[] for _ in self.pieces]
        for t in self.transfers:
            out[t.src].append(t.id)
        return out


def hops(g: Graph, assignment: np.ndarray, order: np.ndarray | None = None,
         sends: np.ndarray | None = None) -> np.ndarray:
    """``hop(v)``: the most boundaries on any path from a source to ``v``.

    An edge ``u -> v`` is a boundary when ``assignment`` differs (pass a device, or any finer
    key such as device and memory-policy group) or when ``sends[u]``: a node whose output
    leaves for another device ends its piece, so that the message departs as soon as the node
    has run, not when the rest of its piece has.
    """
    order = topological_order(g) if order is None else order
    dev = assignment.tolist()
    cut_after = sends.tolist() if sends is not None else [False] * g.num_nodes
    ptr, pred = g.pred_ptr.tolist(), g.pred_idx.tolist()
    h = [0] * g.num_nodes
    for v in order.tolist():
        best = 0
        dv = dev[v]
        for k in range(ptr[v], ptr[v + 1]):
            u = pred[k]
            x = h[u] + (dev[u] != dv or cut_after[u])
            if x > best:
                best = x
        h[v] = best
    # a source (an input, a constant, a parameter read) whose consumers all share its key and
    # need not send joins its earliest consumer's piece instead of forming a piece of its own
    sptr, succ = g.succ_ptr.tolist(), g.succ_idx.tolist()
    for v in range(g.num_nodes):
        if ptr[v] == ptr[v + 1] and sptr[v] < sptr[v + 1] and not cut_after[v]:
            consumers = succ[sptr[v]:sptr[v + 1]]
            if all(dev[w] == dev[v] for w in consumers):
                h[v] = min(h[w] for w in consumers)
    return np.asarray(h, dtype=np.int64)


def cut(g: Graph, assignment: np.ndarray, groups: np.ndarray | None = None,
        whole: np.ndarray | None = None) -> Pieces:
    """The pieces and transfers of graph ``g`` placed by ``assignment`` (node index -> device).

    ``groups`` (optional, ``int64[n]``) splits pieces further: nodes of different groups never
    share a piece (memory policies: a checkpointed segment is one piece). ``whole``
    (optional, ``bool[n]``): nodes whose sends do not end their piece (a spatial plan's tiled
    nodes run as one piece; their gathered outputs leave when it ends).
    """
    assignment = np.asarray(assignment, dtype=np.int64)
    order = topological_order(g)
    key = assignment
    if groups is not None:
        groups = np.asarray(groups, dtype=np.int64)
        key = assignment * (int(groups.max()) + 2) + groups + 1
    sends = np.zeros(g.num_nodes, dtype=bool)
    remote = assignment[g.src] != assignment[g.dst]
    sends[g.src[remote]] = True
    if whole is not None:
        sends[whole] = False
    hop = hops(g, key, order, sends)
    # components among edges whose endpoints share (device, group, hop)
    same = (key[g.src] == key[g.dst]) & (hop[g.src] == hop[g.dst])
    sub = g.replace(src=g.src[same], dst=g.dst[same], edge_bytes=g.edge_bytes[same])
    comp = weakly_connected_components(sub)
    pos = np.empty(g.num_nodes, dtype=np.int64)
    pos[order] = np.arange(g.num_nodes)
    first = np.full(int(comp.max()) + 1 if comp.size else 0, g.num_nodes, dtype=np.int64)
    np.minimum.at(first, comp, pos)
    comp_hop = np.zeros(first.size, dtype=np.int64)
    comp_hop[comp] = hop
    rank = np.lexsort((first, comp_hop))  # piece order: (hop, first position)
    new_id = np.empty_like(rank)
    new_id[rank] = np.arange(rank.size)
    piece_of = new_id[comp]
    members: list[list[int]] = [[] for _ in range(rank.size)]
    for v in order.tolist():
        members[piece_of[v]].append(v)
    pieces = tuple(Piece(k, int(assignment[m[0]]), int(hop[m[0]]), tuple(m),
                         int(groups[m[0]]) if groups is not None else -1)
                   for k, m in enumerate(members))
    ps, pd = piece_of[g.src], piece_of[g.dst]
    crossing = np.flatnonzero(ps != pd)
    tensor_bytes: dict[tuple[int, int], dict[int, int]] = {}
    for e in crossing.tolist():
        key = (int(ps[e]), int(pd[e]))
        prod = int(g.src[e])
        d = tensor_bytes.setdefault(key, {})
        d[prod] = max(d.get(prod, 0), int(g.edge_bytes[e]))
    transfers = tuple(
        Transfer(k, a, b, tuple(sorted(tensors)), int(sum(tensors.values())),
                 pieces[a].device == pieces[b].device)
        for k, ((a, b), tensors) in enumerate(sorted(tensor_bytes.items())))
    return Pieces(pieces, transfers, piece_of)
