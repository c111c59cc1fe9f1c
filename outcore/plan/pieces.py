"""Cut a placed graph into pieces: the units a rank runs forward and backward.

A piece is a connected set of nodes on one device that can run its whole forward once its inputs
have arrived (docs/runtime.md, "Execution model"). With ``hop(v)`` = the largest number of
boundaries on any path into ``v`` — a device change, or leaving a node whose output another device
consumes (such a node ends its piece, so its message departs at once) — the pieces are the connected
components of nodes with equal ``(device, hop)``. Every edge between pieces goes from a lower hop to
a higher one, so the piece graph is acyclic even when a device holds nodes on both sides of another
device's nodes; a device's pieces are ordered by hop. Pieces are numbered in (hop, first node)
order, a topological order of the piece graph. A tensor crosses to a device once (:func:`_relayed`):
the first of the device's pieces that take it receives it and hands it on.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from outcore.graph.algorithms import topological_order
from outcore.graph.ir import Graph
from outcore.plan.pieces_kernel import hop_levels, piece_components, sends_kernel


class Piece(NamedTuple):
    """Nodes (indices, topological order) that one device runs as one forward/backward.

    (A named tuple, not a dataclass: a cut of a large graph makes tens of thousands.)"""

    id: int
    device: int
    hop: int
    nodes: tuple[int, ...]
    group: int = -1  # memory-policy group (-1: none)


class Transfer(NamedTuple):
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
    """The cut of a placed graph, as columns: per piece its device, hop, memory-policy group
    and nodes (``node_idx[node_ptr[k]:node_ptr[k + 1]]``, topological order); per transfer its
    source and destination piece, bytes, whether it stays on one device and its tensors
    (``tensor_idx[tensor_ptr[t]:tensor_ptr[t + 1]]``). :attr:`pieces` and :attr:`transfers`
    are the same as named tuples, made when first read (a cut of a large plan has tens of
    thousands; the lowering and the simulator read the columns)."""

    piece_of: np.ndarray  # int64[n]: piece of each node
    device_of: np.ndarray  # int64[pieces]
    hop_of: np.ndarray  # int64[pieces]
    group_of: np.ndarray  # int64[pieces]: memory-policy group (-1: none)
    node_ptr: np.ndarray  # int64[pieces + 1]
    node_idx: np.ndarray  # int64[n]
    transfer_src: np.ndarray  # int64[transfers]: source piece
    transfer_dst: np.ndarray  # int64[transfers]: destination piece
    transfer_bytes: np.ndarray  # int64[transfers]
    transfer_local: np.ndarray  # bool[transfers]
    tensor_ptr: np.ndarray  # int64[transfers + 1]
    tensor_idx: np.ndarray  # int64: producer nodes, per transfer

    @property
    def num_pieces(self) -> int:
        return int(self.device_of.size)

    @property
    def num_transfers(self) -> int:
        return int(self.transfer_src.size)

    @cached_property
    def pieces(self) -> tuple[Piece, ...]:
        flat, bounds = self.node_idx.tolist(), self.node_ptr.tolist()
        dev, hop, grp = self.device_of.tolist(), self.hop_of.tolist(), self.group_of.tolist()
        return tuple(Piece(k, dev[k], hop[k], tuple(flat[bounds[k]:bounds[k + 1]]), grp[k])
                     for k in range(len(dev)))

    @cached_property
    def transfers(self) -> tuple[Transfer, ...]:
        flat, bounds = self.tensor_idx.tolist(), self.tensor_ptr.tolist()
        a, b = self.transfer_src.tolist(), self.transfer_dst.tolist()
        total, local = self.transfer_bytes.tolist(), self.transfer_local.tolist()
        new = tuple.__new__  # (the fields are made here: Transfer's own __new__ adds nothing)
        return tuple(new(Transfer, (k, a[k], b[k], tuple(flat[bounds[k]:bounds[k + 1]]),
                                    total[k], local[k])) for k in range(len(a)))

    def nodes_of(self, piece: int) -> np.ndarray:
        """The nodes of ``piece`` (topological order)."""
        return self.node_idx[self.node_ptr[piece]:self.node_ptr[piece + 1]]

    def tensors_of(self, transfer: int) -> np.ndarray:
        """The producer nodes whose outputs ``transfer`` carries."""
        return self.tensor_idx[self.tensor_ptr[transfer]:self.tensor_ptr[transfer + 1]]

    @property
    def transfer_pieces(self) -> tuple[np.ndarray, np.ndarray]:
        """``(int64[transfers], int64[transfers])``: each transfer's source and destination
        piece."""
        return self.transfer_src, self.transfer_dst

    @cached_property
    def transfer_devices(self) -> list[tuple[int, int]]:
        """Per transfer, ``(source device, destination device)`` (the ranks its send and
        receive run on)."""
        return list(zip(self.device_of[self.transfer_src].tolist(),
                        self.device_of[self.transfer_dst].tolist()))

    @cached_property
    def by_device(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for k, d in enumerate(self.device_of.tolist()):
            out.setdefault(d, []).append(k)
        return out

    @cached_property
    def inputs_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ptr, ids)``: the transfers into piece ``p`` are ``ids[ptr[p]:ptr[p + 1]]``, in
        id order."""
        return _csr(self.transfer_dst, self.num_pieces)

    @cached_property
    def outputs_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ptr, ids)``: the transfers out of each piece, in id order."""
        return _csr(self.transfer_src, self.num_pieces)

    @cached_property
    def inputs_of(self) -> list[list[int]]:
        """Transfer ids into each piece."""
        return _lists(*self.inputs_csr)

    @cached_property
    def outputs_of(self) -> list[list[int]]:
        """Transfer ids out of each piece."""
        return _lists(*self.outputs_csr)


def _csr(key: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Row pointers and the indices of ``key`` grouped by value (``0..n-1``), ascending
    within a group."""
    ids = np.argsort(key, kind="stable").astype(np.int64)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(key, minlength=n), out=ptr[1:])
    return ptr, ids


def _lists(ptr: np.ndarray, ids: np.ndarray) -> list[list[int]]:
    flat, bounds = ids.tolist(), ptr.tolist()
    return [flat[bounds[k]:bounds[k + 1]] for k in range(len(bounds) - 1)]


def hops(g: Graph, assignment: np.ndarray, order: np.ndarray | None = None,
         sends: np.ndarray | None = None) -> np.ndarray:
    """``hop(v)``: the most boundaries on any path from a source to ``v``.

    An edge ``u -> v`` is a boundary when ``assignment`` differs (pass a device, or any finer
    key such as device and memory-policy group) or when ``sends[u]``: a node whose output
    leaves for another device ends its piece, so that the message departs as soon as the node
    has run, not when the rest of its piece has. A source (an input, a constant, a parameter
    read) whose consumers all share its key and need not send joins its earliest consumer's
    piece instead of forming a piece of its own. Compiled (:mod:`outcore.plan.pieces_kernel`).
    """
    order = topological_order(g) if order is None else order
    cut_after = (np.zeros(g.num_nodes, dtype=np.bool_) if sends is None
                 else np.asarray(sends, dtype=np.bool_))
    return hop_levels(np.asarray(order, np.int64), g.pred_ptr, g.pred_idx, g.succ_ptr,
                      g.succ_idx, np.asarray(assignment, np.int64), cut_after)


def device_sends(g: Graph, assignment: np.ndarray) -> np.ndarray:
    """``bool[n]``: the nodes whose output another device consumes; each ends its piece
    (:func:`hops`' ``sends``, as :func:`cut` and the emulator's order use it)."""
    return sends_kernel(g.succ_ptr, g.succ_idx, np.asarray(assignment, np.int64))


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
    sends = device_sends(g, assignment)
    if whole is not None:
        sends[whole] = False
    hop = hops(g, key, order, sends)
    # components among edges whose endpoints share (device, group, hop)
    root = piece_components(g.num_nodes, np.asarray(g.src, np.int64),
                            np.asarray(g.dst, np.int64), key, hop)
    pos = np.empty(g.num_nodes, dtype=np.int64)
    pos[order] = np.arange(g.num_nodes)
    first = np.full(g.num_nodes, g.num_nodes, dtype=np.int64)
    np.minimum.at(first, root, pos)
    roots = np.flatnonzero(root == np.arange(g.num_nodes))
    rank = np.lexsort((first[roots], hop[roots]))  # piece order: (hop, first position)
    new_id = np.empty(g.num_nodes, dtype=np.int64)
    new_id[roots[rank]] = np.arange(rank.size)
    piece_of = new_id[root]
    by_piece = _by_keys(pos, piece_of)  # nodes by piece, then topological position
    starts = np.searchsorted(piece_of[by_piece], np.arange(rank.size + 1))
    heads = by_piece[starts[:-1]]
    dev_of = assignment[heads]
    grp_of = groups[heads] if groups is not None else np.full(rank.size, -1, np.int64)
    columns = _transfers(g, piece_of, dev_of, relay=whole is None)
    return Pieces(piece_of, dev_of, hop[heads], grp_of, starts.astype(np.int64), by_piece,
                  *columns)


def _by_keys(*keys: np.ndarray) -> np.ndarray:
    """``np.lexsort(keys)`` (the last key primary), as one stable argsort of a combined key
    when the keys are non-negative and their ranges multiply below 2**62 (a 1M-node cut sorts
    its crossing edges several times)."""
    if not keys[0].size:
        return np.zeros(0, np.int64)
    spans = [int(k.max()) + 1 for k in keys]
    if min(int(k.min()) for k in keys) < 0 or float(np.prod(spans, dtype=np.float64)) >= 2.0**62:
        return np.lexsort(keys)
    combined = np.zeros(keys[0].size, np.int64)
    for k, span in zip(reversed(keys), reversed(spans)):
        combined *= span
        combined += k
    return np.argsort(combined, kind="stable")


def _relayed(a: np.ndarray, b: np.ndarray, prod: np.ndarray, nbytes: np.ndarray,
             dev: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(src piece, dst piece, producer, bytes)`` rows with each tensor crossing to a device
    once: of the pieces of one device that take the same tensor from another device, the
    first (lowest id) receives it, at the largest of their edges, and passes it on to the
    others as a local transfer (its piece module outputs the input as it is). Without this,
    a trunk tensor that 16 head branches on one device consume crossed 16 times, and each copy
    was held until its gradient went back (SUPER on a 10k-node transformer: 8.7 GiB received
    for 2.7 GiB of distinct tensors). The new local edges go from a lower piece id to a
    higher one (pieces are numbered in hop order, and the pieces of one device that take one
    tensor directly share a hop or follow it), so the piece graph stays acyclic. ``dev`` is
    the device of each piece."""
    remote = np.flatnonzero(dev[a] != dev[b])
    if remote.size < 2:
        return a, b, prod, nbytes
    key = prod[remote] * (int(dev.max()) + 1) + dev[b[remote]]
    o = _by_keys(b[remote], key)  # per (tensor, device): its consumer pieces, first first
    rows, key = remote[o], key[o]
    first = np.ones(rows.size, dtype=bool)
    first[1:] = key[1:] != key[:-1]
    group = np.cumsum(first) - 1
    carrier = rows[first][group]  # the row of each group's first consumer piece
    if np.array_equal(carrier, rows):
        return a, b, prod, nbytes
    a, nbytes = a.copy(), nbytes.copy()
    largest = np.zeros(int(group[-1]) + 1, dtype=nbytes.dtype)
    np.maximum.at(largest, group, nbytes[rows])
    nbytes[rows[first]] = largest
    later = rows[~first]
    a[later] = b[carrier[~first]]  # handed on by the first consumer piece, on its device
    o = _by_keys(prod, b, a)
    return a[o], b[o], prod[o], nbytes[o]


def _transfers(g: Graph, piece_of: np.ndarray, dev: np.ndarray, *, relay: bool = True
               ) -> tuple[np.ndarray, ...]:
    """One transfer per (source piece, destination piece) pair of crossing edges, in that
    order; its tensors are the distinct producers, each counted once at its largest edge (a
    tuple's whole bytes where a getitem reads it).
    With ``relay``, a tensor crosses to a device once (:func:`_relayed`). Returns the columns
    ``(src, dst, bytes, local, tensor_ptr, tensor_idx)``."""
    ps, pd = piece_of[g.src], piece_of[g.dst]
    crossing = np.flatnonzero(ps != pd)
    a, b = ps[crossing], pd[crossing]
    prod = np.asarray(g.src, np.int64)[crossing]
    nbytes = np.asarray(g.edge_bytes, np.int64)[crossing]
    # an element of a tuple (a getitem's edge carries its bytes) crosses with the whole tuple:
    # the executor sends a producer's value as it is (a split's three parts for one of them)
    parts = np.isin(np.asarray(g.dst, np.int64)[crossing], g.nodes_with_op("getitem"))
    if parts.any():
        nbytes[parts] = np.maximum(nbytes[parts], np.asarray(g.out_bytes, np.int64)[prod[parts]])
    o = _by_keys(prod, b, a)
    a, b, prod, nbytes = a[o], b[o], prod[o], nbytes[o]
    new = np.ones(a.size, dtype=bool)
    new[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1]) | (prod[1:] != prod[:-1])
    starts = np.flatnonzero(new)  # one row per (a, b, producer), at its largest edge
    big = np.maximum.reduceat(nbytes, starts) if starts.size else nbytes[:0]
    a, b, prod, nbytes = a[starts], b[starts], prod[starts], big
    if relay:
        a, b, prod, nbytes = _relayed(a, b, prod, nbytes, dev)
    head = np.ones(a.size, dtype=bool)
    head[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    starts = np.flatnonzero(head)
    total = np.add.reduceat(nbytes, starts) if starts.size else np.zeros(0, np.int64)
    ptr = np.append(starts, a.size).astype(np.int64)
    return (a[starts].astype(np.int64), b[starts].astype(np.int64), total.astype(np.int64),
            dev[a[starts]] == dev[b[starts]], ptr, prod.astype(np.int64))
