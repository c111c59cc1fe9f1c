"""The header of a graph picture: title, summary lines, device legend, cost scale, edge key.

Laid out in inches, like the graph below it, so the figure can be sized before drawing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from outcore.units import format_seconds
from outcore.viz.style import CUT_RED, EDGE_GREY, cost_cmap, cost_norm, text_width_in

TITLE_PT, LINE_PT, LEGEND_PT = 12.0, 8.0, 8.0
PAD_IN = 0.3
ROW_IN = 0.22
SCALE_IN = 0.55
SCALE_LABEL = "forward + backward time per box"


@dataclass(frozen=True, eq=False)
class Header:
    """What goes above the graph.

    Attributes:
        title: first line, bold.
        lines: smaller lines under it (what was condensed, totals, cut).
        entries: legend swatches ``(rgb, text)``, one per device.
        scale: compute time per drawn box when boxes are shaded by it (a colour scale is drawn).
        cut_legend: whether the edge key shows the red "crosses devices" edge.
    """

    title: str
    lines: list[str]
    entries: list[tuple[tuple[float, ...], str]] = field(default_factory=list)
    scale: np.ndarray | None = None
    cut_legend: bool = False

    def entry_width_in(self) -> float:
        return max((text_width_in(t, LEGEND_PT) for _, t in self.entries), default=0.0) + 0.55

    def min_width_in(self) -> float:
        texts = [text_width_in(self.title, TITLE_PT) * 1.1]
        texts += [text_width_in(t, LINE_PT) for t in self.lines]
        texts.append(self.entry_width_in())
        if self.scale is not None:
            texts.append(1.2 + 0.2 + text_width_in(SCALE_LABEL, LEGEND_PT))
        return max(texts) + 2 * PAD_IN

    def columns(self, width_in: float) -> int:
        return max(1, int((width_in - 2 * PAD_IN) // max(self.entry_width_in(), 1e-9)))

    def height_in(self, width_in: float) -> float:
        rows = math.ceil(len(self.entries) / self.columns(width_in)) if self.entries else 0
        h = PAD_IN + 0.3 + ROW_IN * len(self.lines) + ROW_IN * rows + ROW_IN
        return h + (SCALE_IN if self.scale is not None else 0.0)


def draw_header(ax, header: Header, width_in: float) -> float:
    """Draw ``header`` at the top of ``ax`` (inch coordinates, y down); return its height."""
    y = PAD_IN + 0.1
    ax.text(PAD_IN, y, header.title, fontsize=TITLE_PT, fontweight="bold", va="center")
    y += 0.3
    for line in header.lines:
        ax.text(PAD_IN, y, line, fontsize=LINE_PT, va="center", color="#333333")
        y += ROW_IN
    y = _draw_entries(ax, header, width_in, y)
    y = _draw_edge_key(ax, header, y)
    if header.scale is not None:
        room = width_in - 2 * PAD_IN - 0.2 - text_width_in(SCALE_LABEL, LEGEND_PT)
        y = _draw_scale(ax, header.scale, y, min(3.0, max(room, 1.2)))
    return y


def _draw_entries(ax, header: Header, width_in: float, y: float) -> float:
    from matplotlib.patches import Rectangle

    if not header.entries:
        return y
    ncol, colw = header.columns(width_in), header.entry_width_in()
    for k, (rgb, text) in enumerate(header.entries):
        row, col = divmod(k, ncol)
        x0, yy = PAD_IN + col * colw, y + row * ROW_IN
        ax.add_artist(Rectangle((x0, yy - 0.07), 0.26, 0.14, facecolor=rgb, edgecolor="#303030",
                               lw=0.6))
        ax.text(x0 + 0.34, yy, text, fontsize=LEGEND_PT, va="center")
    return y + ROW_IN * math.ceil(len(header.entries) / ncol)


def _draw_edge_key(ax, header: Header, y: float) -> float:
    keys = [(EDGE_GREY, "tensor (line width grows with bytes)")]
    if header.cut_legend:
        keys.append((CUT_RED, "crosses devices (communication)"))
    x = PAD_IN
    for colour, text in keys:
        ax.annotate("", xy=(x + 0.34, y), xytext=(x, y),
                    arrowprops=dict(arrowstyle="-|>", color=colour, lw=1.2, mutation_scale=8))
        ax.text(x + 0.42, y, text, fontsize=LEGEND_PT, va="center")
        x += 0.6 + text_width_in(text, LEGEND_PT)
    return y + ROW_IN


def _draw_scale(ax, cost: np.ndarray, y: float, length_in: float) -> float:
    """A horizontal colour bar of compute time with a few labelled ticks."""
    norm, cmap = cost_norm(cost), cost_cmap()
    y0 = y - 0.02
    ax.imshow(np.linspace(0, 1, 256)[None, :], cmap=cmap, aspect="auto",
              extent=(PAD_IN, PAD_IN + length_in, y0 + 0.14, y0), zorder=1)
    ax.text(PAD_IN + length_in + 0.12, y0 + 0.07, SCALE_LABEL,
            fontsize=LEGEND_PT, va="center")
    left_edge = float("inf")
    for value in sorted(_ticks(norm), reverse=True):  # the top end is always labelled
        xt = PAD_IN + float(norm(value)) * length_in
        half = text_width_in(format_seconds(value), LEGEND_PT - 1) / 2 + 0.05
        if xt + half > left_edge:
            continue  # would overlap the label to its right
        left_edge = xt - half
        ax.plot([xt, xt], [y0 + 0.14, y0 + 0.19], color="#303030", lw=0.6)
        ax.text(xt, y0 + 0.29, format_seconds(value), fontsize=LEGEND_PT - 1, ha="center",
                va="center")
    return y + SCALE_IN


def _ticks(norm) -> list[float]:
    from matplotlib.colors import LogNorm

    lo, hi = float(norm.vmin), float(norm.vmax)
    if isinstance(norm, LogNorm):
        decades = [10.0 ** k for k in range(math.ceil(math.log10(lo)),
                                            math.floor(math.log10(hi)) + 1)]
        return [lo] + [d for d in decades if lo * 1.5 < d < hi / 1.5] + [hi]
    return [lo, (lo + hi) / 2, hi]
