"""Parameters several layers read (a language model's output layer tied to its embedding) in
the memory model (:mod:`outcore.schedule.costs`): where their gradients wait, and the copy a
rank keeps of one whose owner is on another rank."""

from __future__ import annotations

import numpy as np

from outcore.graph.ir import Graph

__all__ = ["param_owners", "shared_copies", "tied_bytes"]


def tied_bytes(g: Graph, piece_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node, the bytes of the parameters it reads that another node of its piece owns
    (capture's ``shared_params``: an output layer tied to the embedding), whose gradient
    autograd holds until the owner's joins it; at such an owner, the bytes of the parameter
    shared; and the bytes of the parameters it reads that a node of another piece owns, whose
    gradient goes to ``.grad`` at once (a piece's backward is its own autograd call; another
    rank's copy is a parameter of its own). A parameter's bytes: its node's over its
    parameters, as the buckets count them."""
    n = g.num_nodes
    shared, tied, apart = np.zeros(n), np.zeros(n), np.zeros(n)
    if g.attrs is None:
        return shared, tied, apart
    size, owner = param_owners(g)
    for v in range(n):
        for name in g.attr(v, "shared_params", []) or []:
            if name not in owner:
                continue
            if piece_of[owner[name]] == piece_of[v]:
                shared[v] += size[name]
                tied[owner[name]] = size[name]
            else:
                apart[v] += size[name]
    return shared, tied, apart


def param_owners(g: Graph) -> tuple[dict[str, float], dict[str, int]]:
    """Each named parameter's bytes and the node that owns it (capture's ``params``)."""
    size: dict[str, float] = {}
    owner: dict[str, int] = {}
    for v in range(g.num_nodes):
        owned = g.attr(v, "params", []) or []
        for name in owned:
            size[name] = float(g.param_bytes[v]) / len(owned)
            owner[name] = v
    return size, owner


def shared_copies(g: Graph, piece_of: np.ndarray, rank_of_piece: np.ndarray,
                   n_p: int) -> np.ndarray:
    """Per piece, the bytes of the shared parameters it reads that a node on another rank
    owns: the rank keeps a copy of its own (counted once per rank, on its first such
    piece), with its gradient and optimizer state."""
    out = np.zeros(n_p)
    if g.attrs is None or not n_p:
        return out
    size, owner = param_owners(g)
    counted: set[tuple[int, str]] = set()
    for v in range(g.num_nodes):
        p = int(piece_of[v])
        for name in g.attr(v, "shared_params", []) or []:
            if name in owner and rank_of_piece[piece_of[owner[name]]] != rank_of_piece[p] \
                    and (int(rank_of_piece[p]), name) not in counted:
                counted.add((int(rank_of_piece[p]), name))
                out[p] += size[name]
    return out
