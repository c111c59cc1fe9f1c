"""Where AxoNN's 2-D grid pays off against Megatron's 1-D layout (pure; no torch).

One pair ``A -> element-wise -> B`` (an MLP block: ``A`` is ``[hidden, width]``, ``B``
``[width, hidden]``; ``tokens`` rows of activations, ``elem_bytes`` per value) on ``tp = rows x
cols`` ranks laid out as :mod:`outcore.parallel.tensor.grid` does (rank ``r * cols + c``: a column
group is ``cols`` consecutive ranks, a row group strides by ``cols``). Collectives per step of one
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
from typing import Any, cast

from outcore.hardware.collectives import allreduce_s, ring_reduce_scatter_s
from outcore.hardware.spec import Cluster, LinkSpec

__all__ = ["GridCost", "pair_comm_s", "pair_grid_s", "best_grid", "grids", "grid_note"]


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


def pair_comm_s(act_bytes: float, mid_bytes: float, rows: int, cols: int,
                cluster: Cluster) -> float:
    """Seconds of one pair's collectives, forward and backward, on a ``rows x cols`` grid:
    ``act_bytes`` of the pair's input / output activation, ``mid_bytes`` of the activation
    between its two Linears (the table above)."""
    col_link = _link(cluster, cols)                  # cols consecutive ranks
    row_link = _link(cluster, (rows - 1) * cols + 1)  # rows ranks, stride cols
    if rows == 1:
        return 2 * allreduce_s(act_bytes, cols, col_link)
    gather = ring_reduce_scatter_s(act_bytes, rows, row_link)  # (as costly as the all-gather)
    return cast(float, allreduce_s(mid_bytes / cols, rows, row_link)  # A forward
            + allreduce_s(act_bytes / rows, cols, col_link) + gather  # B forward + gather
            + allreduce_s(act_bytes / rows, cols, col_link) + gather  # A's input grad
            + allreduce_s(mid_bytes / cols, rows, row_link))          # B's input grad


def pair_grid_s(tokens: int, hidden: int, width: int, rows: int, cols: int,
                cluster: Cluster, *, elem_bytes: int = 2, flops_s: float | None = None) -> GridCost:
    """Seconds of one pair's collectives (and arithmetic, at ``flops_s`` per rank: the
    cluster's device peak times its efficiency by default) on a ``rows x cols`` grid."""
    tp = rows * cols
    comm = pair_comm_s(tokens * hidden * elem_bytes, tokens * width * elem_bytes, rows, cols,
                       cluster)
    d = cluster.device
    rate = flops_s or (d.peak_flops_tc or d.peak_flops) * d.efficiency
    compute = 3 * 2 * 2 * tokens * hidden * width / tp / rate  # fwd + 2x bwd, two matmuls
    return GridCost(rows=rows, cols=cols, comm_s=comm, compute_s=compute)


def best_grid(tp: int, tokens: int, hidden: int, width: int, cluster: Cluster,
              **kw: Any) -> list[GridCost]:
    """Every factorisation of ``tp`` priced by :func:`pair_grid_s`, fastest first."""
    return sorted((pair_grid_s(tokens, hidden, width, r, c, cluster, **kw)
                   for r, c in grids(tp)), key=lambda g: g.total_s)


def grid_note(layout, cluster: Cluster) -> str | None:
    """A plan note on the row x column grid for ``layout`` (a
    :class:`~outcore.graph.tensor_pairs.TensorLayout`): its largest Megatron pair's collectives
    per micro-batch on the 1-D layout the plan uses beside the best grid's (arithmetic is
    ``1/tp`` either way); ``None`` without pairs or when ``tp`` has no other factorisation."""
    if not layout.pairs or len(grids(layout.tp)) < 3:  # tp prime: only 1 x tp and tp x 1
        return None
    i, pair = max(enumerate(layout.pairs), key=lambda ip: ip[1].param_bytes)
    mid = sum(s.out_bytes for s in layout.splits if s.pair == i and s.style == "colwise")
    costs = {(r, c): pair_comm_s(pair.out_bytes, mid, r, c, cluster)
             for r, c in grids(layout.tp) if c > 1}  # (heads divide tp, so any columns)
    one = costs[(1, layout.tp)]
    (r, c), best = min(costs.items(), key=lambda kv: kv[1])
    head = (f"tensor grid: pair {i} ({', '.join(pair.columns)} -> {', '.join(pair.rows)}) "
            f"collectives {one * 1e3:.3f} ms per micro-batch in the plan's 1-D layout "
            f"(1 x {layout.tp})")
    if (r, c) == (1, layout.tp):
        return head + "; no row x column grid moves them faster on this cluster"
    return (head + f"; a {r} x {c} grid would take {best * 1e3:.3f} ms "
            f"({one / best:.2f}x faster): tensor_parallel(model, tp={layout.tp}, mode=\"2d\", "
            f"grid=({r}, {c})) in the Python API (plans use the 1-D layout)")
