"""Where AxoNN's 2-D grid pays off against Megatron's 1-D layout (pure; no torch).

One pair ``A -> element-wise -> B`` (an MLP block: ``A`` is ``[hidden, width]``, ``B``
``[width, hidden]``; ``tokens`` rows of activations, ``elem_bytes`` per value) on ``tp = rows x
cols`` ranks laid out as :mod:`outcore.tensor.grid` does (rank ``r * cols + c``: a column group
is ``cols`` consecutive ranks, a row group strides by ``cols``). Collectives per step of one
micro-batch, forward and backward (AxoNN: Singh & Bhatele, IPDPS 2022; Singh et al., SC 2024):

=====================  ==================================  ==================================
                       forward                             backward
=====================  ==================================  ==================================
1-D (``rows = 1``)     all-reduce of ``B``'s output over   all-reduce of ``A``'s input grad
                       ``tp``                              over ``tp``
2-D                    ``A``: all-reduce of its output     ``A``: all-reduce of its input
                       (``1/cols``) over the row group;    grad (``1/rows``) over the column
                       ``B``: all-reduce of its output     group, all-gather over the row
                       (``1/rows``) over the column group, group; ``B``: all-reduce of its
                       all-gather over the row group       input grad (``1/cols``) over the
                                                           row group
=====================  ==================================  ==================================

Arithmetic is ``1/tp`` of the pair's either way. The grid's collectives move more bytes in all
but its largest volumes stay inside the row group: when ``tp`` spans nodes and a column group
fits in one, 1-D all-reduces the whole activation across the slow links and the grid only
``1/rows`` of it. :func:`best_grid` prices every factorisation of ``tp`` with the cluster's
links (a group inside a node uses the intra-node link, otherwise the inter-node one).
"""

from __future__ import annotations

from dataclasses import dataclass

from outcore.hardware.collectives import allreduce_s, ring_reduce_scatter_s
from outcore.hardware.spec import Cluster, LinkSpec

__all__ = ["GridCost", "pair_grid_s", "best_grid", "grids"]


@dataclass(frozen=True)
class GridCost:
    """One pair's collective seconds (forward + backward) on a ``rows x cols`` grid."""

    rows: int
    cols: int
    comm_s: float
    compute_s: float

    @property
    def total_s(self) -> float:
        return self.comm_s + self.compute_s


def grids(tp: int) -> list[tuple[int, int]]:
    """Every ``(rows, cols)`` with ``rows x cols = tp``, 1-D (``rows = 1``) first."""
    return [(r, tp // r) for r in range(1, tp + 1) if tp % r == 0]


def _link(cluster: Cluster, span: int) -> LinkSpec:
    """The slowest link a group of consecutive-or-strided ranks spanning ``span`` ranks
    crosses: intra-node when it fits in one node."""
    return cluster.intra if span <= cluster.devices_per_node else cluster.inter


def pair_grid_s(tokens: int, hidden: int, width: int, rows: int, cols: int,
                cluster: Cluster, *, elem_bytes: int = 2, flops_s: float | None = None) -> GridCost:
    """Seconds of one pair's collectives (and arithmetic, at ``flops_s`` per rank: the
    cluster's device peak times its efficiency by default) on a ``rows x cols`` grid."""
    tp = rows * cols
    act, mid = tokens * hidden * elem_bytes, tokens * width * elem_bytes
    col_link = _link(cluster, cols)                  # cols consecutive ranks
    row_link = _link(cluster, (rows - 1) * cols + 1)  # rows ranks, stride cols
    if rows == 1:
        comm = 2 * allreduce_s(act, cols, col_link)
    else:
        gather = ring_reduce_scatter_s(act, rows, row_link)  # (same cost as the all-gather)
        comm = (allreduce_s(mid / cols, rows, row_link)          # A forward
                + allreduce_s(act / rows, cols, col_link) + gather  # B forward + gather
                + allreduce_s(act / rows, cols, col_link) + gather  # A's input grad
                + allreduce_s(mid / cols, rows, row_link))          # B's input grad
    d = cluster.device
    rate = flops_s or (d.peak_flops_tc or d.peak_flops) * d.efficiency
    compute = 3 * 2 * 2 * tokens * hidden * width / tp / rate  # fwd + 2x bwd, two matmuls
    return GridCost(rows=rows, cols=cols, comm_s=comm, compute_s=compute)


def best_grid(tp: int, tokens: int, hidden: int, width: int, cluster: Cluster,
              **kw: float) -> list[GridCost]:
    """Every factorisation of ``tp`` priced by :func:`pair_grid_s`, fastest first."""
    return sorted((pair_grid_s(tokens, hidden, width, r, c, cluster, **kw)
                   for r, c in grids(tp)), key=lambda g: g.total_s)
