"""Outputs a piece's forward leaves for a later piece of its own rank, in the memory model
(:mod:`outcore.schedule.costs`): held from the producer's forward until the last of those
pieces has run its forward (the executor frees a local tensor once its readers have read
it), whatever runs on the rank between them.

TinyViT's attention blocks read a bias table gathered from a parameter (``[heads, 196,
196]``, 0.73 MiB, the same for every sample). A DAG placement puts each gather in a piece of
its own, run long before the attention that reads it: three of them waited at once on a
rank, 2.2 MiB its prediction did not hold."""

from __future__ import annotations

import numpy as np

from outcore.graph.ir import Graph
from outcore.plan.pieces import Pieces

__all__ = ["input_share", "saves_own_output", "waiting_outputs"]


def waiting_outputs(g: Graph, pieces: Pieces, storage_bytes: np.ndarray) -> np.ndarray:
    """Per piece, the bytes its forward leaves waiting for later pieces of its rank, less
    the bytes waiting for it that it is the last of its rank to read (freed when its forward
    ends; a layer of it that saves one holds it on, counted in its saved bytes). Each storage
    once, at ``storage_bytes`` (per node, at the micro-batch). Not counted: parameters,
    buffers and model inputs (held all step), and tensors the producer's own piece saves for
    its backward (its saved bytes hold them until after their readers have run)."""
    n_p = pieces.num_pieces
    out = np.zeros(n_p)
    if not pieces.num_transfers:
        return out
    tid = np.repeat(np.arange(pieces.num_transfers), np.diff(pieces.tensor_ptr))
    local = pieces.transfer_local[tid]
    if not local.any():
        return out
    piece_of, root = pieces.piece_of, g.storage_root
    U = pieces.tensor_idx[local]
    Q = pieces.transfer_dst[tid[local]]
    R = root[U]
    fixed = np.zeros(g.num_nodes, dtype=bool)  # held all step
    for op in ("param", "constant", "input"):
        fixed[g.nodes_with_op(op)] = True
    # made on this rank (a tensor received from another rank and handed on by its first
    # reader is held as received, where the simulator counts it)
    device = pieces.device_of
    keep = ~fixed[R] & ~fixed[U] & (storage_bytes[R] > 0) & \
        (device[piece_of[U]] == device[Q])
    # saved in the producer's piece: by the producer itself, or by a layer reading it there
    holds = saves_own_output(g)
    keep &= ~holds[U] & ~holds[R]
    made_in = piece_of[U]
    saved_there = np.zeros(0, np.int64)
    for s, u in (g.saved_input_pairs, g.resaved_input_pairs):
        if s.size:
            saved_there = np.union1d(saved_there, root[u] * n_p + piece_of[s])
    keep &= ~np.isin(R * n_p + made_in, saved_there)
    if not keep.any():
        return out
    R, made_in, Q = R[keep], made_in[keep], Q[keep]
    # each storage once: from its first producer piece to its last reader (pieces are
    # numbered in a topological order of the piece graph, which a rank runs its forwards in)
    order = np.lexsort((Q, R))
    R, made_in, Q = R[order], made_in[order], Q[order]
    starts = np.flatnonzero(np.r_[True, R[1:] != R[:-1]])
    ends = np.r_[starts[1:], R.size] - 1
    first = np.minimum.reduceat(made_in, starts)
    last = Q[ends]
    nbytes = storage_bytes[R[starts]].astype(np.float64)
    np.add.at(out, first, nbytes)
    np.subtract.at(out, last, nbytes)
    return out


def input_share(g: Graph, savers: np.ndarray, producers: np.ndarray) -> np.ndarray:
    """Of each saver's saved bytes, those that are its input's tensor (the producer's output,
    at most what the saver saves); none for a parameter node's, which saved bytes never count
    (a GPT-2 stage's lm_head saving its received tied weight had 16 KiB of its own input
    taken off)."""
    share = np.minimum(g.out_bytes[producers], g.saved_bytes[savers]).astype(np.float64)
    is_param = np.zeros(g.num_nodes, dtype=np.bool_)
    is_param[g.nodes_with_op("param")] = True
    share[is_param[producers]] = 0.0
    return share


def saves_own_output(g: Graph) -> np.ndarray:
    """Per node, whether what it saves beyond its inputs (:func:`input_share`) covers its own
    output (a ReLU's): its saved bytes hold that output until its backward."""
    own = g.saved_bytes.astype(np.float64)
    savers, producers = g.saved_input_pairs
    if savers.size:
        np.subtract.at(own, savers, input_share(g, savers, producers))
    return (own >= g.out_bytes) & (g.out_bytes > 0)
