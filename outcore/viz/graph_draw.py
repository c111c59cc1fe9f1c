"""Draw a graph (optionally coloured by device) as a layered top-to-bottom picture.

``draw_graph(g, "resnet.png", assignment=plan.assignment)`` writes a PNG or SVG: one box per node
(name and op, shaded by compute time or filled with the device colour), edges as curves routed
around the boxes, communication edges in red, and a legend of devices with their node count and
compute share. Large graphs are condensed first (:mod:`outcore.viz.condense`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from outcore.errors import UsageError
from outcore.graph.ir import Graph
from outcore.units import format_bytes, format_seconds
from outcore.viz.condense import View, condense, device_shares
from outcore.viz.layout import Layout, folded, layered_layout
from outcore.viz.legend import Header, draw_header
from outcore.viz.style import (
    CUT_RED,
    EDGE_GREY,
    check_path,
    cost_cmap,
    cost_norm,
    device_colours,
    save_figure,
    text_width_in,
)

log = logging.getLogger(__name__)

NAME_PT, OP_PT = 7.0, 6.0
NODE_H_IN = 0.36
MARGIN_IN = 0.3
IO_FILL, PLAIN_FILL = "#FFF1C9", "#E6ECF5"


@dataclass(frozen=True)
class Boxes:
    """What each drawn node shows: two label lines, width (inches), fill stripes, cost share."""

    line1: list[str]
    line2: list[str]
    width: np.ndarray
    fills: list[list[tuple[tuple[float, ...], float]]]
    cost: np.ndarray
    io: np.ndarray
    by_device: bool


def node_label(name: str, module: str) -> str:
    """A readable name: the dotted module path when the node is a module call."""
    if not module or name.startswith(module):
        return name
    flat = module.replace(".", "_")
    if name == flat:
        return module
    if name.startswith(flat + "_"):
        rest = name[len(flat) + 1:]
        return f"{module}#{int(rest) + 1}" if rest.isdigit() else f"{module}.{rest}"
    return f"{module}/{name}"


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, keeping the end (``…ayer4.2.conv3``)."""
    if len(text) <= limit:
        return text
    tail = text[-(limit - 1):]
    cut = min((k for k in (tail.find("."), tail.find("_"), tail.find("/")) if 0 <= k < 6),
              default=-1)
    return "…" + tail[cut + 1:]


def draw_graph(g: Graph, path: str | os.PathLike, *, assignment: Any = None,
               title: str | None = None, max_nodes: int = 400, label_chars: int = 26,
               dpi: float = 110) -> Path:
    """Draw ``g`` to ``path`` (``.png`` or ``.svg``) and return the path.

    Args:
        g: the graph.
        path: output file; the suffix picks the format (anything else: :class:`UsageError`).
        assignment: device of each node (``int[n]`` by node index, or a Plan); fills boxes with
            device colours and adds a legend (device, node count, compute share).
        title: first line of the title (default: the graph's name).
        max_nodes: most boxes to draw; above, the graph is collapsed by module depth, or cut
            into topological level bands (the title says which).
        label_chars: longest node name shown, characters (longer names keep their end).
        dpi: PNG resolution, dots per inch (lowered automatically for huge figures).
    """
    out = check_path(path)
    if max_nodes < 1:
        raise UsageError(f"max_nodes must be at least 1, got {max_nodes}")
    devices = _assignment(g, assignment)
    view = condense(g, max_nodes, devices)
    boxes = _boxes(view, g, devices, label_chars)
    vg = view.graph
    lay = folded(layered_layout(vg.num_nodes, vg.src, vg.dst, boxes.width,
                                node_height=NODE_H_IN + 0.04 * boxes.by_device,
                                layer=view.layer, column=view.column))
    log.info("graph %r: %d boxes in %d layers, %d crossings", g.name, vg.num_nodes,
             len(lay.layers), lay.crossings)
    header = _header(g, view, devices, title)
    fig = _render(view, lay, boxes, header, cut_edges(view, g, devices))
    return save_figure(fig, out, dpi)


def _assignment(g: Graph, assignment: Any) -> np.ndarray | None:
    """The assignment as ``int64[n]`` (accepts a Plan), checked against ``g``."""
    if assignment is None:
        return None
    arr = np.asarray(getattr(assignment, "assignment", assignment))
    if arr.shape != (g.num_nodes,) or (arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0)):
        raise UsageError(f"assignment must give a device number (0, 1, ...) for each of the "
                         f"{g.num_nodes} nodes of graph {g.name!r}; got shape {arr.shape} "
                         f"of {arr.dtype}")
    return arr.astype(np.int64)


def _boxes(view: View, g: Graph, devices: np.ndarray | None, label_chars: int) -> Boxes:
    """Labels, widths and fills of the drawn nodes."""
    vg = view.graph
    cost = vg.fwd_s + vg.bwd_s
    shares = device_shares(view, g, devices) if devices is not None else None
    line1, line2 = [], []
    for i in range(vg.num_nodes):
        line1.append(shorten(node_label(vg.name_of(i), vg.module_of(i)), label_chars))
        parts = [vg.op_of(i)] + ([format_seconds(float(cost[i]))] if cost[i] > 0 else [])
        if shares is not None:  # colours alone are ambiguous for many devices
            devs = [str(d) for d, _ in shares[i]]
            parts.append("dev " + "+".join(devs[:3]) + ("+…" if len(devs) > 3 else ""))
        line2.append(" · ".join(parts))
    width = np.array([max(text_width_in(a, NAME_PT), text_width_in(b, OP_PT)) + 0.16
                      for a, b in zip(line1, line2)])
    io = np.array([vg.op_of(i) in ("input", "output") for i in range(vg.num_nodes)], dtype=bool)
    share = cost / cost.max() if (cost > 0).any() else np.zeros(vg.num_nodes)
    return Boxes(line1, line2, np.maximum(width, 0.5), _fills(view, devices, shares, io), share,
                 io, devices is not None)


def _fills(view: View, devices: np.ndarray | None, shares: list | None, io: np.ndarray
           ) -> list[list[tuple[tuple[float, ...], float]]]:
    """Per drawn node, ``(rgb, share of width)`` stripes: devices, else a compute-time shade."""
    from matplotlib.colors import to_rgb

    cost = view.graph.fwd_s + view.graph.bwd_s
    if devices is not None and shares is not None:
        colours = device_colours(int(devices.max()) + 1 if devices.size else 1)
        return [[(colours[d], s) for d, s in row] for row in shares]
    shades = _cost_shades(cost) if (cost > 0).any() else [to_rgb(PLAIN_FILL)] * cost.size
    return [[(to_rgb(IO_FILL) if io[i] and cost[i] == 0 else shades[i], 1.0)]
            for i in range(cost.size)]


def _cost_shades(cost: np.ndarray) -> list[tuple[float, ...]]:
    """Fill colour of each box from its compute time (the header's colour scale)."""
    norm, cmap = cost_norm(cost), cost_cmap()
    return [tuple(cmap(float(norm(c)) if c > 0 else 0.0)[:3]) for c in cost]


def _header(g: Graph, view: View, devices: np.ndarray | None, title: str | None) -> Header:
    """Title, summary line and legend entries."""
    parts = [f"{g.num_nodes} nodes, {g.num_edges} edges"]
    if g.total_compute_s > 0:
        parts.append(f"fwd+bwd {format_seconds(g.total_compute_s)}")
    if g.total_param_bytes > 0:
        parts.append(f"params {format_bytes(g.total_param_bytes)}")
    entries: list[tuple[tuple[float, ...], str]] = []
    if devices is not None and devices.size:
        cut = devices[g.src] != devices[g.dst]
        parts.append(f"{int(cut.sum())} edges cross devices "
                     f"({format_bytes(float(g.edge_bytes[cut].sum()))})")
        entries = _device_entries(g, devices)
    lines = [view.note] if view.note else []
    lines.append(" · ".join(parts))
    cost = view.graph.fwd_s + view.graph.bwd_s
    scale = cost if devices is None and (cost > 0).any() else None
    return Header(title or g.name, lines, entries, scale, cut_legend=devices is not None)


def _device_entries(g: Graph, devices: np.ndarray) -> list[tuple[tuple[float, ...], str]]:
    """Legend rows: colour and "device d: n nodes, p% compute" for every device."""
    k = int(devices.max()) + 1
    colours = device_colours(k)
    count = np.bincount(devices, minlength=k)
    comp = np.bincount(devices, weights=g.fwd_s + g.bwd_s, minlength=k)
    total = comp.sum()
    out = []
    for d in range(k):
        text = f"device {d}: {count[d]} nodes"
        if total > 0:
            text += f", {100 * comp[d] / total:.1f}% compute"
        out.append((colours[d], text))
    return out


def _render(view: View, lay: Layout, boxes: Boxes, header: Header, cut: np.ndarray):
    """The figure: header on top, then the layout, in inch coordinates."""
    from matplotlib.figure import Figure

    body_w = lay.width_in + 2 * MARGIN_IN
    width = max(body_w, header.min_width_in(), 4.0)
    head_h = header.height_in(width)
    height = head_h + lay.height_in + 2 * MARGIN_IN
    fig = Figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    draw_header(ax, header, width)
    dx, dy = (width - lay.width_in) / 2, head_h + MARGIN_IN
    _draw_edges(ax, view, lay, cut, dx, dy)
    _draw_nodes(ax, lay, boxes, dx, dy)
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    return fig


def _ports(lay: Layout) -> dict[tuple[int, int], tuple[float, float]]:
    """Sideways offsets (inches) where each vertex edge leaves its source and enters its target."""
    out_of: dict[int, list[int]] = {}
    into: dict[int, list[int]] = {}
    for a, b in lay.vedges.tolist():
        out_of.setdefault(a, []).append(b)
        into.setdefault(b, []).append(a)
    off: dict[tuple[int, int], list[float]] = {}
    for side, table in ((0, out_of), (1, into)):
        for v, others in table.items():
            others = sorted(others, key=lambda w: (lay.x[w], w))
            k, w = len(others), lay.width[v]
            span = min(0.35 * w, 0.07 * (k - 1)) if k > 1 else 0.0
            for o, t in zip(others, np.linspace(-span, span, k)):
                key = (v, o) if side == 0 else (o, v)
                off.setdefault(key, [0.0, 0.0])[side] = float(t)
    return {k: (v[0], v[1]) for k, v in off.items()}


def _route_path(lay: Layout, route: tuple[int, ...], ports, dx: float, dy: float):
    """A smooth path along a route: vertical through dummies, S-curves between layers."""
    from matplotlib.path import Path as MPath

    h = lay.node_height / 2
    pts = [(lay.x[route[0]] + ports[(route[0], route[1])][0] + dx, lay.y[route[0]] + h + dy)]
    for d in route[1:-1]:
        pts.append((lay.x[d] + dx, lay.y[d] - h + dy))
        pts.append((lay.x[d] + dx, lay.y[d] + h + dy))
    pts.append((lay.x[route[-1]] + ports[(route[-2], route[-1])][1] + dx,
                lay.y[route[-1]] - h + dy))
    verts, codes = [pts[0]], [MPath.MOVETO]
    for k in range(1, len(pts)):
        (x0, y0), (x1, y1) = pts[k - 1], pts[k]
        if k % 2 == 0:  # inside a dummy's layer band: straight down
            verts.append((x1, y1))
            codes.append(MPath.LINETO)
            continue
        mid = (y1 - y0) / 2
        verts += [(x0, y0 + mid), (x1, y1 - mid), (x1, y1)]
        codes += [MPath.CURVE4] * 3
    return MPath(verts, codes)


def _draw_edges(ax, view: View, lay: Layout, cut: np.ndarray, dx: float, dy: float) -> None:
    from matplotlib.patches import FancyArrowPatch

    vg = view.graph
    nb = vg.edge_bytes.astype(np.float64)
    lw = np.full(vg.num_edges, 0.8)
    if (nb > 0).any():
        lo, hi = np.log1p(nb[nb > 0].min()), np.log1p(nb.max())
        lw = 0.5 + 1.3 * (np.log1p(nb) - lo) / max(hi - lo, 1e-9)
        lw = np.clip(lw, 0.5, 1.8)
    ports = _ports(lay)
    order = sorted(range(vg.num_edges), key=lambda e: (bool(cut[e]), e))
    for e in order:
        colour = CUT_RED if cut[e] else EDGE_GREY
        style = dict(arrowstyle="-|>,head_length=0.5,head_width=0.22", mutation_scale=8,
                     color=colour, lw=float(lw[e]) + (0.3 if cut[e] else 0.0), alpha=0.85,
                     zorder=2 + bool(cut[e]))
        route = lay.routes[e]
        if route:
            ax.add_artist(FancyArrowPatch(path=_route_path(lay, route, ports, dx, dy), **style))
        else:
            a, b, curve = _flat_ends(lay, int(vg.src[e]), int(vg.dst[e]), dx, dy)
            ax.add_artist(FancyArrowPatch(a, b, connectionstyle=curve, **style))


def _flat_ends(lay: Layout, u: int, v: int, dx: float, dy: float) -> tuple[tuple, tuple, str]:
    """Ends and curve of an edge within one layer (bands): side to side between neighbours
    (rightward above the middle, leftward below), else an arc over the layer."""
    h = lay.node_height / 2
    if abs(int(lay.pos[u]) - int(lay.pos[v])) == 1:
        sign = 1.0 if lay.x[v] > lay.x[u] else -1.0
        y = lay.y[u] + dy - 0.08 * sign
        return ((lay.x[u] + sign * lay.width[u] / 2 + dx, y),
                (lay.x[v] - sign * lay.width[v] / 2 + dx, y), "arc3,rad=0")
    rad = -0.3 if lay.x[v] > lay.x[u] else 0.3
    return ((lay.x[u] + dx, lay.y[u] - h + dy), (lay.x[v] + dx, lay.y[v] - h + dy),
            f"arc3,rad={rad}")


def cut_edges(view: View, g: Graph, devices: np.ndarray | None) -> np.ndarray:
    """For each drawn edge, whether some original edge it stands for crosses devices."""
    vg = view.graph
    if devices is None or vg.num_edges == 0:
        return np.zeros(vg.num_edges, dtype=bool)
    crossing = devices[g.src] != devices[g.dst]
    m = vg.num_nodes
    keys = view.group[g.src[crossing]] * m + view.group[g.dst[crossing]]
    return np.isin(vg.src * m + vg.dst, keys)


def _draw_nodes(ax, lay: Layout, boxes: Boxes, dx: float, dy: float) -> None:
    from matplotlib.patches import FancyBboxPatch, Rectangle

    h = lay.node_height
    for i in range(lay.num_nodes):
        w = float(boxes.width[i])
        x0, y0 = lay.x[i] - w / 2 + dx, lay.y[i] - h / 2 + dy
        style = "round,pad=0,rounding_size=0.12" if boxes.io[i] else \
            "round,pad=0,rounding_size=0.04"
        outline = FancyBboxPatch((x0, y0), w, h, boxstyle=style, facecolor="none",
                                 edgecolor="#303030", lw=1.1 if boxes.io[i] else 0.6, zorder=5)
        ax.add_artist(outline)
        left = x0
        for colour, share in boxes.fills[i]:
            r = Rectangle((left, y0), w * share, h, facecolor=colour, lw=0, zorder=4)
            ax.add_artist(r)
            r.set_clip_path(outline)
            left += w * share
        if boxes.by_device and boxes.cost[i] > 0:
            ax.add_artist(Rectangle((x0 + 0.05, y0 + h - 0.045), (w - 0.1) * boxes.cost[i], 0.025,
                                   facecolor="#404040", lw=0, zorder=6))
        up = 0.015 if boxes.by_device else 0.0  # room for the cost bar
        ax.text(lay.x[i] + dx, lay.y[i] + dy - 0.065 - up, boxes.line1[i], ha="center",
                va="center", fontsize=NAME_PT, zorder=7)
        ax.text(lay.x[i] + dx, lay.y[i] + dy + 0.08 - up, boxes.line2[i], ha="center",
                va="center", fontsize=OP_PT, color="#333333", style="italic", zorder=7)


