"""Per-piece costs of one micro-batch: what the schedule builder and the simulator charge.

Node costs in the graph are for ``g.batch_size`` samples; a micro-batch of ``mb_size`` samples
scales times and activation bytes by ``mb_size / batch_size`` (a linear model: accurate for
large layers, optimistic for tiny ones where fixed per-op costs dominate).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from outcore.cost.memory import state_factor
from outcore.graph.ir import Graph
from outcore.plan.pieces import Pieces


@dataclass(frozen=True, eq=False)
class PieceCosts:
    """Costs per micro-batch, per piece / transfer / rank.

    Attributes:
        fwd_s, bwd_s: ``[pieces]`` forward and backward seconds of one micro-batch.
        saved_bytes: ``[pieces]`` activations kept from a piece's forward until its backward.
        transient_bytes: ``[pieces]`` largest single node output (working buffer).
        transfer_bytes: ``[transfers]`` bytes of one micro-batch's tensors.
        static_bytes: ``[ranks]`` parameters × optimizer state factor.
        param_bytes: ``[ranks]`` parameter bytes (what the optimizer updates).
        piece_param_bytes: ``[pieces]`` parameter bytes of each piece (its gradient bucket).
    """

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    saved_bytes: np.ndarray
    transient_bytes: np.ndarray
    transfer_bytes: np.ndarray
    static_bytes: np.ndarray
    param_bytes: np.ndarray
    piece_param_bytes: np.ndarray


def mb_scale(g: Graph, mb_size: float | None) -> float:
    """Factor from the graph's batch to a micro-batch of ``mb_size`` samples."""
    if mb_size is None or not g.batch_size:
        return 1.0
    return float(mb_size) / float(g.batch_size)


def piece_costs(g: Graph, pieces: Pieces, num_ranks: int, *, scale: float = 1.0,
                optimizer: str = "adam") -> PieceCosts:
    """Sum node costs over each piece, scaled to one micro-batch."""
    n_p = len(pieces.pieces)
    piece_of = pieces.piece_of
    fwd = np.bincount(piece_of, weights=g.fwd_s, minlength=n_p) * scale
    bwd = np.bincount(piece_of, weights=g.bwd_s, minlength=n_p) * scale
    saved = np.bincount(piece_of, weights=g.saved_bytes, minlength=n_p) * scale
    transient = np.zeros(n_p)
    np.maximum.at(transient, piece_of, g.out_bytes.astype(np.float64) * scale)
    tbytes = np.array([t.bytes for t in pieces.transfers], dtype=np.float64) * scale
    rank_of_node = np.array([pieces.pieces[p].device for p in piece_of.tolist()], dtype=np.int64) \
        if g.num_nodes else np.zeros(0, dtype=np.int64)
    params = np.bincount(rank_of_node, weights=g.param_bytes, minlength=num_ranks)
    piece_params = np.bincount(piece_of, weights=g.param_bytes, minlength=n_p)
    return PieceCosts(fwd, bwd, saved, transient, tbytes, params * state_factor(optimizer),
                      params, piece_params)
