"""Choose what to draw of a large graph: the graph itself, its module blocks, or level bands.

A picture of 10^4 boxes helps nobody. Above ``max_nodes``, a graph with module paths is collapsed
to the deepest module depth that fits (:func:`outcore.graph.coarsen.collapse`); a graph without
them (or one still too large at depth 1) is cut into bands of consecutive topological levels,
split by device when an assignment is given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from outcore.graph.algorithms import depth_levels
from outcore.graph.coarsen import collapse, groups
from outcore.graph.ir import Graph, build

log = logging.getLogger(__name__)

#: Bands drawn at most when a graph is cut into topological level bands.
MAX_BANDS = 48


@dataclass(frozen=True, eq=False)
class View:
    """The graph to draw and how its nodes relate to the original graph.

    Attributes:
        graph: the graph drawn (the original, its block graph, or its band graph).
        group: ``int[n_original]`` drawn node of every original node.
        mode: ``nodes``, ``modules`` or ``bands``.
        depth: module depth when ``mode == 'modules'``.
        layer: given layer of each drawn node (bands only; otherwise None).
        column: swimlane of each drawn node (bands: its device; otherwise None).
        note: what was done, for the title (empty when nothing was done).
    """

    graph: Graph
    group: np.ndarray
    mode: str
    depth: int | None = None
    layer: np.ndarray | None = None
    column: np.ndarray | None = None
    note: str = ""


def module_depth(g: Graph) -> int:
    """Deepest module path of ``g`` in components (0 when no module paths were recorded)."""
    if g.modules is None:
        return 0
    return max((m.count(".") + 1 for m in g.modules if m), default=0)


def condense(g: Graph, max_nodes: int, assignment: np.ndarray | None = None) -> View:
    """The view of ``g`` to draw with at most ``max_nodes`` boxes (see module docstring).

    Args:
        g: the graph.
        max_nodes: largest number of boxes to draw.
        assignment: ``int[n]`` device per node, or None (bands are then not split by device).
    """
    n = g.num_nodes
    if n <= max_nodes:
        return View(g, np.arange(n), "nodes")
    for depth in range(module_depth(g) - 1, 0, -1):
        blocks = collapse(g, depth)
        if blocks.num_nodes <= max_nodes:
            group, _ = groups(g, depth)
            log.info("graph %r: %d nodes > %d, drawing module depth %d (%d blocks)",
                     g.name, n, max_nodes, depth, blocks.num_nodes)
            return View(blocks, group, "modules", depth=depth,
                        note=f"collapsed to module depth {depth}: {blocks.num_nodes} blocks "
                             f"of {n} nodes")
    return bands(g, max_nodes, assignment)


def bands(g: Graph, max_nodes: int, assignment: np.ndarray | None = None) -> View:
    """Aggregate ``g`` into bands of consecutive topological levels (× device).

    Each band covers an equal range of levels; with an assignment a band holds one box per device
    present in it. Costs and bytes are summed; edges between boxes carry summed bytes.
    """
    n = g.num_nodes
    level = depth_levels(g)
    num_levels = int(level.max()) + 1 if n else 1
    dev = np.zeros(n, dtype=np.int64) if assignment is None else np.asarray(assignment, np.int64)
    k = int(np.unique(dev).size) if n else 1
    nb = max(1, min(num_levels, max_nodes // max(k, 1), MAX_BANDS))
    band = (level * nb) // num_levels
    key = band * (int(dev.max()) + 1 if n else 1) + dev
    uniq, group = np.unique(key, return_inverse=True)
    m = uniq.size
    ndev = int(dev.max()) + 1 if n else 1
    box_band, box_dev = uniq // ndev, uniq % ndev

    def sums(arr: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=arr, minlength=m)

    gs, gd = group[g.src], group[g.dst]
    cross = gs != gd
    pair = gs[cross] * m + gd[cross]
    upair, inv = np.unique(pair, return_inverse=True)
    ebytes = np.bincount(inv, weights=g.edge_bytes[cross], minlength=upair.size)
    lo = np.full(nb, num_levels, dtype=np.int64)
    hi = np.zeros(nb, dtype=np.int64)
    np.minimum.at(lo, band, level)
    np.maximum.at(hi, band, level)
    count = np.bincount(group, minlength=m)
    names = [f"levels {lo[b]}-{hi[b]}" if lo[b] != hi[b] else f"level {lo[b]}"
             for b in box_band.tolist()]
    ops = [f"{c} nodes" for c in count.tolist()]
    view = build(g.name, fwd_s=sums(g.fwd_s), bwd_s=sums(g.bwd_s),
                 param_bytes=sums(g.param_bytes), out_bytes=sums(g.out_bytes),
                 saved_bytes=sums(g.saved_bytes), src=upair // m, dst=upair % m,
                 edge_bytes=ebytes, names=names, ops=ops, batch_size=g.batch_size,
                 meta={**g.meta, "bands": nb}, check=False)
    log.info("graph %r: %d nodes > %d, drawing %d level bands (%d boxes)", g.name, n,
             max_nodes, nb, m)
    split = " x device" if assignment is not None and k > 1 else ""
    return View(view, group, "bands", layer=box_band, column=box_dev,
                note=f"{n} nodes in {nb} bands of topological levels{split}: {m} boxes")


def device_shares(view: View, g: Graph, assignment: np.ndarray
                  ) -> list[list[tuple[int, float]]]:
    """For each drawn node, ``(device, share of its compute)`` pairs, largest share first.

    Shares weigh nodes by forward + backward time (by node count when the graph has no costs).
    """
    w = g.fwd_s + g.bwd_s
    if not (w > 0).any():
        w = np.ones(g.num_nodes)
    m = view.graph.num_nodes
    ndev = int(np.max(assignment)) + 1 if assignment.size else 1
    table = np.bincount(view.group * ndev + assignment, weights=w + 1e-30,
                        minlength=m * ndev).reshape(m, ndev)
    out = []
    for row in table:
        total = row.sum()
        devs = np.flatnonzero(row > 0)
        pairs = sorted(((int(d), float(row[d] / total)) for d in devs), key=lambda p: (-p[1], p[0]))
        out.append(pairs)
    return out
