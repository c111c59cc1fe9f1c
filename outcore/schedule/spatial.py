"""Costs of a plan's tiled layers for its lowering (pure; MPI4DL's SP, see docs/spatial.md).

A plan with ``layout.sp > 1`` is lowered on a copy of its graph whose tiled nodes carry the
costs of the largest tile, as the spatial stage's rank (tile 0) runs them:

* time and saved activations of each tiled node: its share of the serial cost (the largest
  tile's share of the node's output area);
* the halo exchange of every windowed layer (convolution, pooling) is added to its forward and,
  sent back as gradients, to its backward: bytes from :func:`outcore.cost.spatial.halo_bytes`
  (rows, then columns; the largest tile), time from the cluster's link between two tile ranks;
* batch norm's statistics (two all-reduces of ``2C`` floats forward, one backward);
* the gather at the join (:func:`outcore.cost.spatial.gather_bytes` into tile 0) of every
  gathered tensor (the join node's output and skip connections used after the join) is added
  to its node's forward, the scatter of its gradient to its backward.

The extra tile ranks run the same tiled nodes in the same order (they hold no piece of the
schedule); :func:`tile_rank_costs` gives what they compute and hold, for the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from outcore.cost.memory import state_factor
from outcore.cost.spatial import LayerGeometry, gather_bytes, halo_bytes
from outcore.cost.spatial_geometry import TileGrid
from outcore.graph.ir import Graph
from outcore.hardware.spec import Cluster
from outcore.plan.spatial import SpatialPlan, tile_fraction, tile_ranks
from outcore.schedule.workspace import workspace

__all__ = ["TileCosts", "collectives", "comm_times", "geometry_of_node", "inflight", "tiled_graph",
           "tile_rank_costs", "walk_peak"]


def _pair(v) -> tuple[int, int]:
    if isinstance(v, list):
        return (int(v[0]), int(v[-1]))
    return (int(v), int(v)) if isinstance(v, int) else (1, 1)


def geometry_of_node(g: Graph, i: int) -> LayerGeometry | None:
    """The :class:`LayerGeometry` of a windowed node from its recorded config; None for the
    others (element-wise, batch norm: no halo)."""
    op, cfg = g.op_of(i), g.attr(i, "config") or {}
    if op in ("conv2d", "maxpool2d", "avgpool2d"):
        k = _pair(cfg.get("kernel_size", 1))
        stride = cfg.get("stride") or (1 if op == "conv2d" else k)
        return LayerGeometry(kind="pool" if op == "avgpool2d" else "conv", kernel=k,
                             stride=_pair(stride) if not isinstance(stride, tuple) else stride,
                             padding=_pair(cfg.get("padding", 0)),
                             dilation=_pair(cfg.get("dilation", 1)))
    return None


def _link_s(cluster: Cluster, a: int, b: int, nbytes: float) -> float:
    if nbytes <= 0:
        return 0.0
    if max(a, b) >= cluster.size:
        a, b = 0, min(1, cluster.size - 1)
    return cluster.link(a, b).time(nbytes) if a != b else 0.0


def _in_shape(g: Graph, i: int) -> list | None:
    shapes = g.attr(i, "in_shapes")
    if shapes and isinstance(shapes[0], list) and len(shapes[0]) == 4:
        return shapes[0]
    preds = g.predecessors(i)
    return g.attr(int(preds[0]), "shape") if len(preds) else None


def comm_times(g: Graph, sp: SpatialPlan, cluster: Cluster, stages: int, dp: int = 1
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node: forward and backward communication seconds of the tiled layers (halo, batch
    norm statistics, gather/scatter at the join) and halo + gather bytes received (tile 0)."""
    fwd, bwd, nbytes = (np.zeros(g.num_nodes) for _ in range(3))
    for i, rows in collectives(g, sp, cluster, stages, dp).items():
        for phase, kind, b, secs in rows:
            (fwd if phase == "F" else bwd)[i] += secs
            nbytes[i] += b if phase == "F" and kind != "sp allreduce" else 0.0
    return fwd, bwd, nbytes


def collectives(g: Graph, sp: SpatialPlan, cluster: Cluster, stages: int, dp: int = 1
                ) -> dict[int, list[tuple[str, str, float, float]]]:
    """Per tiled node with any, the communication it runs inside its forward (``F``) and
    backward (``B``): ``(phase, kind, bytes, seconds)`` for the largest tile, kinds as the
    runtime records them (``sp halo``, ``sp allreduce``, ``sp gather``, ``sp scatter``)."""
    grid = TileGrid.parse(sp.grid)
    peer = tile_ranks(stages, grid.tiles, dp)[0]
    out: dict[int, list[tuple[str, str, float, float]]] = {}
    lat = _link_s(cluster, sp.stage, peer, 1.0)
    for i in sp.indices(g).tolist():
        geo, shape = geometry_of_node(g, i), _in_shape(g, i)
        if geo is not None and shape:
            hb = max(halo_bytes(geo, shape[0], shape[1], (shape[2], shape[3]), grid))
            two_steps = 2 if grid.rows > 1 and grid.cols > 1 else 1
            t = _link_s(cluster, sp.stage, peer, hb) + (two_steps - 1) * lat
            if hb > 0:  # (a window inside its tile, a strided 1x1 convolution's, moves none)
                out[i] = [("F", "sp halo", hb, t), ("B", "sp halo", hb, t)]
        elif g.op_of(i) == "batchnorm2d" and shape:
            ring = 2 * (grid.tiles - 1)
            stats = shape[1] * 4  # a float per channel: the mean's sums, then the variance's
            step = _link_s(cluster, sp.stage, peer, 2 * stats / grid.tiles)
            out[i] = [("F", "sp allreduce", stats, ring * step),
                      ("F", "sp allreduce", stats, ring * step),
                      ("B", "sp allreduce", 2 * stats, ring * step)]
    for j in sp.gathered(g).tolist():
        shape = g.attr(j, "shape")
        if isinstance(shape, list) and len(shape) == 4:
            gb = gather_bytes(shape[0], shape[1], (shape[2], shape[3]), grid)
            t = _link_s(cluster, sp.stage, peer, gb)
            out.setdefault(j, []).extend([("F", "sp gather", gb, t), ("B", "sp scatter", gb, t)])
    return out


def tiled_graph(g: Graph, sp: SpatialPlan, cluster: Cluster, stages: int, dp: int = 1
                ) -> Graph:
    """``g`` with its tiled nodes costed for the largest tile (see the module docstring)."""
    grid = TileGrid.parse(sp.grid)
    idx = sp.indices(g)
    frac = np.ones(g.num_nodes)
    for i in idx.tolist():
        frac[i] = tile_fraction(g, i, grid)
    cf, cb, _ = comm_times(g, sp, cluster, stages, dp)
    out_bytes = g.out_bytes * frac
    # gathered on tile 0: the whole tensor and the received tiles (padded to the largest)
    gathered = sp.gathered(g)
    out_bytes[gathered] = g.out_bytes[gathered] * (1 + grid.tiles * frac[gathered])
    inside = np.isin(g.src, idx) & np.isin(g.dst, idx)
    return g.replace(fwd_s=g.fwd_s * frac + cf, bwd_s=g.bwd_s * frac + cb,
                     saved_bytes=g.saved_bytes * frac, out_bytes=out_bytes,
                     edge_bytes=np.where(inside, g.edge_bytes * frac[g.src], g.edge_bytes))


@dataclass(frozen=True)
class TileCosts:
    """What one extra tile rank computes and holds per micro-batch (of the graph's batch).

    fwd_s, bwd_s: compute and communication of the tiled nodes; saved_bytes: activations kept
    until the backward; transient_bytes: what the peak of one micro-batch's forward and
    backward holds beyond ``saved_bytes`` (see :func:`walk_peak`; may be negative: the
    backward frees each layer's saved activations as it goes); static_bytes: parameters x
    optimizer state of the tiled layers; comm_bytes: halo and gather bytes sent."""

    fwd_s: float
    bwd_s: float
    saved_bytes: float
    transient_bytes: float
    static_bytes: float
    comm_bytes: float


WINDOWED = frozenset({"conv2d", "convtranspose2d", "conv_transpose2d", "maxpool2d", "avgpool2d",
                      "upsample"})


def _needs_region(g: Graph, i: int) -> bool:
    """Whether a windowed layer reads rows beyond its tile (halo or padding): then its input
    region is a new tensor, rebuilt in the backward; a window that tiles its input exactly
    (a 2x2 stride-2 pool) runs on the tile itself."""
    geo = geometry_of_node(g, i)
    if geo is None:
        return True
    return any(p > 0 or d * (k - 1) + 1 > s for k, s, p, d in
               zip(geo.kernel, geo.stride, geo.padding, geo.dilation))


def _work_bytes(g: Graph, i: int, out: np.ndarray) -> float:
    """Working set of node ``i``'s backward beyond the saved activations, from its tile
    output bytes ``out`` (indexed like ``g``): the gradient of its output and of its input,
    and for a windowed layer with a halo or padding its input region rebuilt from the kept
    strips (about its input tile); for the spatial batch norm, ``x - mean`` beside the two gradients
    (``outcore.parallel.spatial.layers._TileBatchNorm``); element-wise layers and adds: the two
    gradients."""
    op = g.op_of(i)
    if op == "input":
        return 0.0
    preds = [int(p) for p in g.predecessors(i)]
    inp = max((float(out[p]) for p in preds), default=float(out[i]))
    if op in WINDOWED:
        return float(out[i]) + (2.0 if _needs_region(g, i) else 1.0) * inp
    if op == "batchnorm2d":
        return 3.0 * float(out[i])
    if op == "cat":
        return float(out[i]) + sum(float(out[p]) for p in preds)
    return 2.0 * float(out[i])


def walk_peak(g: Graph, idx: np.ndarray, saved: np.ndarray, out: np.ndarray,
              scratch: bool = False) -> float:
    """Peak of one micro-batch on a tile rank, walking the tiled nodes (indices ``idx``, in
    order): in the forward, the activations saved so far plus the node's output and input; in
    the backward (reverse order), the activations still saved (those of the nodes up to it:
    the later ones were freed by their backwards) plus the node's working set
    (:func:`_work_bytes`). ``saved`` and ``out`` are per-tile bytes indexed like ``g``.
    ``scratch``: add operators' scratch memory (:func:`~outcore.schedule.workspace.workspace`; on
    CPU devices)."""
    kept = np.cumsum(saved[idx])
    waiting = _waiting_grads(g, idx, out)
    peak = 0.0
    for k, i in enumerate(idx.tolist()):
        preds = [int(p) for p in g.predecessors(i)]
        inp = sum(float(out[p]) for p in preds)
        # an operator's scratch memory (a convolution's, on its tile)
        ws_f, ws_b = workspace(g, i, max((float(out[p]) for p in preds), default=0.0),
                               float(out[i])) if scratch else (0.0, 0.0)
        peak = max(peak, kept[k] + float(out[i]) + inp + ws_f,
                   kept[k] + _work_bytes(g, i, out) + ws_b + waiting[k])
    return float(peak)


def _waiting_grads(g: Graph, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Per position of ``idx`` in the backward, the gradients of forked tensors that wait for
    their other consumers: a tensor two layers read (a residual block's input) holds the
    gradient the later one returned while the earlier one runs its backward."""
    pos = {int(i): k for k, i in enumerate(idx.tolist())}
    diff = np.zeros(len(idx) + 1)
    for t in idx.tolist():
        cons = [pos[int(c)] for c in g.successors(t) if int(c) in pos]
        if len(cons) > 1:
            diff[min(cons)] += float(out[t])
            diff[max(cons)] -= float(out[t])
    return np.cumsum(diff)[:len(idx)]


def tile_rank_costs(g: Graph, sp: SpatialPlan, cluster: Cluster, stages: int,
                    optimizer: str = "adam", dp: int = 1) -> TileCosts:
    """Costs of an extra tile rank (the tiled nodes of :func:`tiled_graph`)."""
    gt = tiled_graph(g, sp, cluster, stages, dp)
    idx = sp.indices(g)
    _, _, nbytes = comm_times(g, sp, cluster, stages, dp)
    grid = TileGrid.parse(sp.grid)
    out = np.zeros(g.num_nodes)
    for i in idx.tolist():
        out[i] = g.out_bytes[i] * tile_fraction(g, int(i), grid)
    saved = float(gt.saved_bytes[idx].sum())
    return TileCosts(float(gt.fwd_s[idx].sum()), float(gt.bwd_s[idx].sum()), saved,
                     walk_peak(g, idx, gt.saved_bytes, out,
                               scratch=cluster.device.host_is_device) - saved,
                     float(g.param_bytes[idx].sum() * state_factor(optimizer)),
                     float(nbytes[idx].sum()))


def inflight(actions, piece: int) -> int:
    """Most micro-batches between their forward and backward of ``piece`` in one rank's list."""
    live = most = 0
    for a in actions:
        if a.piece == piece and a.op == "F":
            live += 1
            most = max(most, live)
        elif a.piece == piece and a.op == "B":
            live -= 1
    return max(most, 1)

