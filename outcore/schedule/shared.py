"""Parameters several layers read (a language model's output layer tied to its embedding) in
the memory model (:mod:`outcore.schedule.costs`): where their gradients wait, and the copy a
rank keeps of one whose owner is on another rank."""

from __future__ import annotations

import numpy as np

from outcore.graph.ir import Graph, memo
from outcore.graph.tensor_ties import param_owners

__all__ = ["shared_copies", "shared_reads", "tied_bytes"]


def shared_reads(g: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every read of a parameter another node owns (capture's ``shared_params``), in node
    order: ``(reader, owner, bytes, parameter index)``. It depends on the graph alone (and
    its parameter bytes, which a micro-batch does not change), so it is remembered with it:
    every costing of a placement reads it."""
    known = memo(g, "shared_reads")
    if not known:
        rows: list[tuple[int, int, float, int]] = []
        if g.attrs is not None:
            size, owner = param_owners(g)
            index = {name: k for k, name in enumerate(owner)}
            for v in range(g.num_nodes):
                for name in g.attr(v, "shared_params", []) or []:
                    if name in owner:
                        rows.append((v, owner[name], size[name], index[name]))
        cols = list(zip(*rows)) if rows else [(), (), (), ()]
        known["reads"] = (np.array(cols[0], np.int64), np.array(cols[1], np.int64),
                          np.array(cols[2], np.float64), np.array(cols[3], np.int64))
    return known["reads"]


def tied_bytes(g: Graph, piece_of: np.ndarray,
               reads: tuple[np.ndarray, ...] | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node, the bytes of the parameters it reads that another node of its piece owns,
    whose gradient autograd holds until the owner's joins it; at such an owner, the bytes of
    the parameter shared; and the bytes of the parameters it reads that a node of another
    piece owns, whose gradient goes to ``.grad`` at once (a piece's backward is its own
    autograd call; another rank's copy is a parameter of its own). ``reads``:
    :func:`shared_reads` of ``g`` or of a graph with the same parameters."""
    n = g.num_nodes
    reader, owner, nbytes, _ = reads if reads is not None else shared_reads(g)
    tied = np.zeros(n)
    if not reader.size:
        return np.zeros(n), tied, np.zeros(n)
    same = piece_of[reader] == piece_of[owner]
    tied[owner[same]] = nbytes[same]
    return (np.bincount(reader[same], weights=nbytes[same], minlength=n), tied,
            np.bincount(reader[~same], weights=nbytes[~same], minlength=n))


def shared_copies(g: Graph, piece_of: np.ndarray, rank_of_piece: np.ndarray, n_p: int,
                  reads: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
    """Per piece, the bytes of the shared parameters it reads that a node on another rank
    owns: the rank keeps a copy of its own (counted once per rank, on its first such
    piece in node order), with its gradient and optimizer state."""
    reader, owner, nbytes, param = reads if reads is not None else shared_reads(g)
    out = np.zeros(n_p)
    if not reader.size or not n_p:
        return out
    rank = rank_of_piece[piece_of[reader]]
    cross = np.flatnonzero(rank != rank_of_piece[piece_of[owner]])
    if not cross.size:
        return out
    # the first read of each (rank, parameter), in node order
    _, first = np.unique(np.stack([rank[cross], param[cross]]), axis=1, return_index=True)
    keep = cross[first]
    np.add.at(out, piece_of[reader[keep]], nbytes[keep])
    return out
