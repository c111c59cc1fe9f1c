"""Layered (Sugiyama-style) layout of a DAG, top to bottom, in pure Python and numpy.

The steps follow Sugiyama, Tagawa and Toda (1981) as refined by Gansner et al., "A technique for
drawing directed graphs" (IEEE TSE 1993):

1. *layering*: longest path from the sources; a source is then pulled down to just above its
   first consumer (a parameter read deep in the model does not sit on the top row);
2. *long edges*: an edge spanning several layers is routed through a chain of dummy vertices, one
   chain per source shared by all its long edges (a skip connection is one line that branches);
3. *ordering*: a depth-first initial order, then barycenter sweeps down and up with the
   ``transpose`` step of adjacent swaps, keeping the order with the fewest crossings;
4. *coordinates*: each layer is moved to the weighted mean of its neighbours under minimum
   separation, solved exactly per layer by isotonic regression (pool adjacent violators).

All lengths are inches: the drawing code uses them directly as figure coordinates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from outcore.graph.algorithms import depth_levels, topological_order
from outcore.graph.ir import build


@dataclass(frozen=True, eq=False)
class Layout:
    """Positions of a layered drawing.

    Vertices ``0..num_nodes-1`` are the graph's nodes, the rest are dummies on long edges.

    Attributes:
        num_nodes: number of real nodes.
        layer: ``int[V]`` layer of each vertex (0 = top).
        pos: ``int[V]`` position of each vertex within its layer (0 = left).
        x, y: ``float[V]`` centre of each vertex, inches (y grows downward).
        width: ``float[V]`` box width, inches (0 for dummies).
        node_height: box height, inches.
        layers: vertices of each layer, left to right.
        vedges: ``int[E', 2]`` distinct vertex edges, each from layer ``i`` to ``i + 1``.
        routes: for each input edge, its vertex path ``(src, dummies..., dst)``; ``()`` if flat.
        flat: input edges that do not go downward (only with given layers), drawn as arcs.
        crossings: edge crossings of the chosen order (between adjacent layers).
    """

    num_nodes: int
    layer: np.ndarray
    pos: np.ndarray
    x: np.ndarray
    y: np.ndarray
    width: np.ndarray
    node_height: float
    layers: tuple[tuple[int, ...], ...]
    vedges: np.ndarray
    routes: tuple[tuple[int, ...], ...]
    flat: tuple[int, ...]
    crossings: int

    @property
    def width_in(self) -> float:
        return float((self.x + self.width / 2).max()) if self.x.size else 0.0

    @property
    def height_in(self) -> float:
        return float(self.y.max() + self.node_height / 2) if self.y.size else 0.0


def assign_layers(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Layer of each node: longest path from the sources, sources pulled next to a consumer.

    Args:
        n: number of nodes.
        src, dst: ``int[m]`` edge endpoints (node indices); the graph must be acyclic.
    """
    g = build("layout", fwd_s=np.zeros(n), src=src, dst=dst, check=False)
    order = topological_order(g)
    level = depth_levels(g, order)
    ptr, succ = g.succ_ptr, g.succ_idx
    for u in np.flatnonzero((g.in_degree == 0) & (g.out_degree > 0)).tolist():
        level[u] = int(level[succ[ptr[u]:ptr[u + 1]]].min()) - 1
    return level


def route_edges(layer: np.ndarray, src: np.ndarray, dst: np.ndarray
                ) -> tuple[np.ndarray, list[tuple[int, ...]], list[int], np.ndarray]:
    """Split long edges into dummy chains (one chain per source, shared).

    Returns ``(vertex_layer, routes, flat, vedges)``: the layer of every vertex (nodes then
    dummies), each edge's vertex path, the edges that do not go downward, and the distinct
    vertex edges between adjacent layers.
    """
    vlayer = [int(v) for v in layer.tolist()]
    chain: dict[tuple[int, int], int] = {}
    routes: list[tuple[int, ...]] = []
    flat: list[int] = []
    vedges: dict[tuple[int, int], None] = {}
    for e, (u, v) in enumerate(zip(src.tolist(), dst.tolist())):
        if vlayer[v] <= vlayer[u]:
            flat.append(e)
            routes.append(())
            continue
        path = [u]
        for lay in range(vlayer[u] + 1, vlayer[v]):
            d = chain.get((u, lay))
            if d is None:
                d = chain[(u, lay)] = len(vlayer)
                vlayer.append(lay)
            path.append(d)
        path.append(v)
        for a, b in zip(path[:-1], path[1:]):
            vedges[(a, b)] = None
        routes.append(tuple(path))
    ve = np.array(sorted(vedges), dtype=np.int64).reshape(-1, 2)
    return np.asarray(vlayer, dtype=np.int64), routes, flat, ve


def _adjacency(num: int, vedges: np.ndarray) -> tuple[list[list[int]], list[list[int]]]:
    preds: list[list[int]] = [[] for _ in range(num)]
    succs: list[list[int]] = [[] for _ in range(num)]
    for a, b in vedges.tolist():
        succs[a].append(b)
        preds[b].append(a)
    return preds, succs


def initial_order(vlayer: np.ndarray, vedges: np.ndarray) -> list[list[int]]:
    """Vertices of each layer in depth-first discovery order from the sources (by index)."""
    num = vlayer.size
    preds, succs = _adjacency(num, vedges)
    rank = [-1] * num
    count = 0
    for root in range(num):
        if preds[root] or rank[root] >= 0:
            continue
        stack = [root]
        while stack:
            v = stack.pop()
            if rank[v] >= 0:
                continue
            rank[v] = count
            count += 1
            stack.extend(w for w in reversed(succs[v]) if rank[w] < 0)
    layers: list[list[int]] = [[] for _ in range(int(vlayer.max()) + 1 if num else 0)]
    for v in sorted(range(num), key=lambda v: rank[v]):
        layers[int(vlayer[v])].append(v)
    return layers


def _inversions(seq: list[int]) -> int:
    """Pairs ``i < j`` with ``seq[i] > seq[j]`` (Fenwick tree)."""
    if not seq:
        return 0
    size = max(seq) + 2
    tree = [0] * (size + 1)
    total = 0
    for k, value in enumerate(seq):
        i, below = value + 1, 0
        while i > 0:  # elements seen so far that are <= value
            below += tree[i]
            i -= i & -i
        total += k - below
        i = value + 1
        while i <= size:
            tree[i] += 1
            i += i & -i
    return total


def count_crossings(layers: list[list[int]], vedges: np.ndarray) -> int:
    """Edge crossings between adjacent layers for the given vertex order."""
    pos: dict[int, int] = {v: k for lay in layers for k, v in enumerate(lay)}
    by_layer: dict[int, list[tuple[int, int]]] = {}
    layer_of = {v: i for i, lay in enumerate(layers) for v in lay}
    for a, b in vedges.tolist():
        by_layer.setdefault(layer_of[a], []).append((pos[a], pos[b]))
    return sum(_inversions([q for _, q in sorted(pairs)]) for pairs in by_layer.values())


def _sweep(layers: list[list[int]], nbrs: list[list[int]], down: bool) -> None:
    """One barycenter pass; vertices without neighbours keep their relative place."""
    rng = range(1, len(layers)) if down else range(len(layers) - 2, -1, -1)
    for i in rng:
        ref = layers[i - 1] if down else layers[i + 1]
        where = {v: (k + 0.5) / len(ref) for k, v in enumerate(ref)}
        lay = layers[i]
        keys = []
        for k, v in enumerate(lay):
            near = [where[w] for w in nbrs[v]]
            keys.append((sum(near) / len(near) if near else (k + 0.5) / len(lay), k))
        layers[i] = [lay[k] for _, k in sorted(keys)]


def _transpose(layers: list[list[int]], preds: list[list[int]], succs: list[list[int]],
               passes: int = 4) -> None:
    """Swap adjacent vertices while that removes crossings with both neighbour layers."""
    pos = {v: k for lay in layers for k, v in enumerate(lay)}

    def cross(v: int, w: int) -> int:  # crossings when v is left of w
        c = 0
        for nb in (preds, succs):
            for a in nb[v]:
                c += sum(1 for b in nb[w] if pos[a] > pos[b])
        return c

    for _ in range(passes):
        improved = False
        for lay in layers:
            for k in range(len(lay) - 1):
                v, w = lay[k], lay[k + 1]
                if cross(v, w) > cross(w, v):
                    lay[k], lay[k + 1] = w, v
                    pos[v], pos[w] = k + 1, k
                    improved = True
        if not improved:
            return


def reduce_crossings(layers: list[list[int]], vedges: np.ndarray, sweeps: int = 8
                     ) -> tuple[list[list[int]], int]:
    """Barycenter sweeps with transposition; the best order seen and its crossings.

    Args:
        layers: initial vertex order per layer (not modified).
        vedges: ``int[E', 2]`` vertex edges between adjacent layers.
        sweeps: down-and-up passes at most (stops early after 3 passes without progress).
    """
    num = 1 + max((v for lay in layers for v in lay), default=-1)
    preds, succs = _adjacency(num, vedges)
    current = [list(lay) for lay in layers]
    best, best_c = [list(lay) for lay in current], count_crossings(current, vedges)
    stale = 0
    for _ in range(sweeps):
        if best_c == 0 or stale >= 3:
            break
        for down in (True, False):
            _sweep(current, preds if down else succs, down)
            _transpose(current, preds, succs)
            c = count_crossings(current, vedges)
            if c < best_c:
                best, best_c, stale = [list(lay) for lay in current], c, -1
        stale += 1
    return best, best_c


def _isotonic(target: np.ndarray, weight: np.ndarray, sep: np.ndarray) -> np.ndarray:
    """Minimise ``sum w (x - target)^2`` subject to ``x[k+1] - x[k] >= sep[k]`` (PAVA)."""
    offset = np.concatenate([[0.0], np.cumsum(sep)])
    t = (target - offset).tolist()
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for ti, wi in zip(t, weight.tolist()):
        blocks.append([ti, wi, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            w = w1 + w2
            blocks.append([(m1 * w1 + m2 * w2) / w, w, c1 + c2])
    y = np.concatenate([np.full(c, m) for m, _, c in blocks]) if blocks else np.zeros(0)
    return y + offset


def assign_x(layers: list[list[int]], vedges: np.ndarray, width: np.ndarray,
             num_nodes: int, gap_in: float = 0.22, iterations: int = 6,
             pinned: np.ndarray | None = None) -> np.ndarray:
    """Horizontal centre of every vertex, inches (left edge of the drawing at 0).

    Args:
        layers: vertex order per layer.
        vedges: vertex edges between adjacent layers.
        width: ``float[V]`` box widths, inches (0 for dummies).
        num_nodes: vertices below this index are real nodes, the rest dummies.
        gap_in: minimum gap between two real boxes; dummies keep half of it.
        iterations: down-and-up placement passes.
        pinned: optional ``float[num_nodes]`` x to hold nodes at (NaN: free), inches.
    """
    preds, succs = _adjacency(width.size, vedges)
    x = np.zeros(width.size)
    dummy = np.arange(width.size) >= num_nodes
    pin = np.full(width.size, np.nan)
    if pinned is not None:
        pin[:num_nodes] = pinned

    def seps(lay: list[int]) -> np.ndarray:
        a, b = np.asarray(lay[:-1], dtype=np.int64), np.asarray(lay[1:], dtype=np.int64)
        g = np.where(dummy[a] & dummy[b], 0.25, np.where(dummy[a] | dummy[b], 0.6, 1.0))
        return (width[a] + width[b]) / 2 + gap_in * g

    def place(lay: list[int], near_by: list[list[int]], far_by: list[list[int]]) -> None:
        """Move ``lay`` towards its neighbours in ``near_by`` (else, weakly, ``far_by``)."""
        target, weight = [], []
        for v in lay:
            if not np.isnan(pin[v]):
                target.append(pin[v])
                weight.append(1e6)
            elif near_by[v]:
                target.append(float(np.mean(x[near_by[v]])))
                weight.append(2.0 if dummy[v] else 1.0)
            elif far_by[v]:
                target.append(float(np.mean(x[far_by[v]])))
                weight.append(0.3)
            else:
                target.append(x[v])
                weight.append(0.05)
        x[lay] = _isotonic(np.asarray(target), np.asarray(weight), seps(lay))

    for lay in layers:
        if lay:
            x[lay] = np.concatenate([[0.0], np.cumsum(seps(lay))])
            x[lay] -= x[lay].mean()
            x[lay] = np.where(np.isnan(pin[lay]), x[lay], pin[lay])
    for _ in range(iterations):
        for lay in layers[1:]:
            place(lay, preds, succs)
        for lay in layers[-2::-1]:
            place(lay, succs, preds)
    for lay in layers[1:]:  # last word to the parents: chains run straight down
        place(lay, preds, succs)
    if width.size:
        x -= (x - width / 2).min()
    return x


def assign_y(layers: list[list[int]], vedges: np.ndarray, x: np.ndarray,
             node_height: float) -> np.ndarray:
    """Vertical centre of every layer, inches; gaps grow with the sideways run of edges."""
    layer_of = np.zeros(x.size, dtype=np.int64)
    for i, lay in enumerate(layers):
        layer_of[lay] = i
    run = np.zeros(max(len(layers), 1))
    if vedges.size:
        np.maximum.at(run, layer_of[vedges[:, 0]], np.abs(x[vedges[:, 0]] - x[vedges[:, 1]]))
    gaps = np.minimum(0.3 + 0.14 * np.sqrt(run), 1.1)
    tops = np.concatenate([[0.0], np.cumsum(node_height + gaps[:-1])])
    return tops[layer_of] + node_height / 2


def column_centres(column: np.ndarray, width: np.ndarray, gap_in: float = 0.5) -> np.ndarray:
    """x of each node when every column is as wide as its widest box, plus ``gap_in``."""
    cols, idx = np.unique(column, return_inverse=True)
    col_w = np.zeros(cols.size)
    np.maximum.at(col_w, idx, width)
    left = np.concatenate([[0.0], np.cumsum(col_w + gap_in)[:-1]])
    return (left + col_w / 2)[idx]


def layered_layout(n: int, src: np.ndarray, dst: np.ndarray, width: np.ndarray, *,
                   node_height: float = 0.36, layer: np.ndarray | None = None,
                   column: np.ndarray | None = None, sweeps: int = 8) -> Layout:
    """Lay out a DAG top to bottom.

    Args:
        n: number of nodes.
        src, dst: ``int[m]`` edges (node indices).
        width: ``float[n]`` box width of each node, inches.
        node_height: box height, inches.
        layer: optional given layer per node; edges not going downward are then ``flat``.
            Default: :func:`assign_layers` (every edge goes down).
        column: optional column per node (swimlanes, e.g. the device of a band): nodes are
            ordered by column and centred in it, long edges run on the right; no crossing
            reduction is done.
        sweeps: crossing-reduction passes.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if layer is None:
        layer = assign_layers(n, src, dst)
    layer = np.asarray(layer, dtype=np.int64) - (int(np.min(layer)) if n else 0)
    vlayer, routes, flat, vedges = route_edges(layer, src, dst)
    layers = initial_order(vlayer, vedges)
    vwidth = np.concatenate([np.asarray(width, dtype=np.float64), np.zeros(vlayer.size - n)])
    pinned = None
    if column is None:
        layers, crossings = reduce_crossings(layers, vedges, sweeps)
    else:
        col = np.asarray(column, dtype=np.int64)
        layers = [sorted(lay, key=lambda v: col[v] if v < n else np.inf) for lay in layers]
        crossings = count_crossings(layers, vedges)
        pinned = column_centres(col, vwidth[:n])
    x = assign_x(layers, vedges, vwidth, n, pinned=pinned)
    y = assign_y(layers, vedges, x, node_height)
    pos = np.zeros(vlayer.size, dtype=np.int64)
    for lay in layers:
        pos[lay] = np.arange(len(lay))
    return Layout(n, vlayer, pos, x, y, vwidth, node_height,
                  tuple(tuple(lay) for lay in layers), vedges, tuple(routes), tuple(flat),
                  crossings)


def folded(lay: Layout, max_aspect: float = 3.0, gap_in: float = 0.8) -> Layout:
    """``lay`` cut, between layers, into side-by-side columns when it is more than
    ``max_aspect`` times taller than wide (a chain of a hundred layers is one long strip:
    folded, it reads as a page). Each column holds consecutive layers of about equal height;
    edges that cross a fold run from the bottom of one column to the top of the next."""
    height, width = lay.height_in, max(lay.width_in, 0.5)
    if not lay.layers or height <= max_aspect * width:
        return lay
    cols = max(2, math.ceil(math.sqrt(height / (1.5 * (width + gap_in)))))
    tops = np.array([float(lay.y[list(layer)].min()) - lay.node_height / 2
                     for layer in lay.layers])
    col_of_layer = np.minimum((tops / (height / cols)).astype(np.int64), cols - 1)
    col_top = np.array([tops[col_of_layer == c].min() if (col_of_layer == c).any() else 0.0
                        for c in range(cols)])
    col = col_of_layer[lay.layer]
    return replace(lay, x=lay.x + col * (width + gap_in), y=lay.y - col_top[col])
