"""Draw a timeline: a Gantt chart per rank over memory over time, or two timelines compared.

Each rank has a compute lane (forward and backward in distinct colours, the micro-batch number on
a bar when it fits, idle time hatched) and a thinner communication lane below it (sends of
activations and gradients, receives, all-reduces); overlapping events of one lane are stacked
into sub-lanes. Below, one memory line per rank, with the device limit dashed.
"""

from __future__ import annotations

import logging
import os
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from outcore.trace import Event, Timeline
from outcore.units import format_bytes, format_seconds
from outcore.viz.style import (
    KIND_COLOURS,
    KIND_NAMES,
    byte_unit,
    check_path,
    luminance,
    save_figure,
    text_width_in,
    time_unit,
)

log = logging.getLogger(__name__)

COMPUTE_H, COMM_H, RANK_GAP = 0.46, 0.24, 0.3  # lane heights in rank-row units (1 per rank)
IDLE_FILL, IDLE_HATCH = "#F7F3F3", "#E2CACA"
MB_PT = 7.0
AXES_PAD_IN = 2.1  # left and right margins of the axes together, inches


def category(e: Event) -> str:
    """Colour key of an event: ``F``, ``B``, ``send_act``, ``send_grad``, ``allreduce``, ..."""
    kind = e.kind
    if kind in ("F", "B", "recompute", "optim", "allreduce", "offload", "prefetch"):
        return kind
    if kind in ("send", "recv", "SF", "SB", "RF", "RB"):
        grad = "SB" in e.label or "RB" in e.label or "grad" in e.label or kind in ("SB", "RB")
        way = "send" if kind in ("send", "SF", "SB") else "recv"
        return f"{way}_{'grad' if grad else 'act'}"
    if kind in ("AR", "all_reduce", "allreduce_dp"):
        return "allreduce"
    return "other"


def stack_lanes(events: list[Event]) -> tuple[list[int], int]:
    """Sub-lane of each event (greedy interval partitioning) and the number of sub-lanes."""
    ends: list[float] = []
    out = [0] * len(events)
    for k in sorted(range(len(events)), key=lambda k: (events[k].start_s, k)):
        e = events[k]
        free = next((j for j, end in enumerate(ends) if end <= e.start_s + 1e-15), None)
        if free is None:
            free = len(ends)
            ends.append(e.end_s)
        ends[free] = e.end_s
        out[k] = free
    return out, max(len(ends), 1)


def draw_timeline(timeline: Timeline, path: str | os.PathLike, *, title: str | None = None,
                  max_ranks: int = 64, dpi: float = 110) -> Path:
    """Draw ``timeline`` to ``path`` (``.png`` or ``.svg``) and return the path.

    Args:
        timeline: events and memory of one iteration (simulated or measured).
        path: output file; the suffix picks the format.
        title: title (default: source, schedule, micro-batches and iteration time).
        max_ranks: most ranks drawn; above, evenly spaced ranks are shown (the title says so).
        dpi: PNG resolution, dots per inch.
    """
    out = check_path(path)
    return _draw([timeline], [title or _title(timeline)], out, max_ranks, dpi)


def draw_comparison(predicted: Timeline, measured: Timeline, path: str | os.PathLike, *,
                    title: str | None = None, max_ranks: int = 64, dpi: float = 110) -> Path:
    """Draw a predicted and a measured timeline one above the other on one time axis.

    Args:
        predicted, measured: the two timelines (any sources; labels come from the arguments).
        path: output file (``.png`` or ``.svg``).
        title: overall title (default: both iteration times and their ratio).
        max_ranks: most ranks drawn per timeline.
        dpi: PNG resolution, dots per inch.
    """
    out = check_path(path)
    p, m = predicted.iteration_s, measured.iteration_s
    diff = f" ({100 * (m - p) / p:+.1f}%)" if p > 0 else ""
    labels = [f"predicted: {format_seconds(p)}", f"measured: {format_seconds(m)}{diff}"]
    return _draw([predicted, measured], labels, out, max_ranks, dpi,
                 suptitle=title or "predicted vs measured iteration")


def _title(tl: Timeline) -> str:
    parts = [f"{tl.source} timeline"]
    if tl.meta.get("schedule"):
        parts.append(str(tl.meta["schedule"]))
    if tl.meta.get("microbatches"):
        parts.append(f"{tl.meta['microbatches']} micro-batches")
    parts.append(f"{tl.num_ranks} ranks")
    parts.append(f"iteration {format_seconds(tl.iteration_s)}")
    return " · ".join(parts)


def _ranks_shown(tl: Timeline, max_ranks: int) -> list[int]:
    if tl.num_ranks <= max_ranks:
        return list(range(tl.num_ranks))
    return sorted(set(np.linspace(0, tl.num_ranks - 1, max_ranks).round().astype(int).tolist()))


def _span(timelines: list[Timeline]) -> float:
    ends = [e.end_s for tl in timelines for e in tl.events] + [tl.iteration_s for tl in timelines]
    return max(max(ends, default=0.0), 1e-9)


def _draw(timelines: list[Timeline], labels: list[str], out: Path, max_ranks: int, dpi: float,
          suptitle: str | None = None) -> Path:
    from matplotlib.figure import Figure

    span = _span(timelines)
    scale, unit = time_unit(span)
    shown = [_ranks_shown(tl, max_ranks) for tl in timelines]
    busiest = max((max(Counter(e.rank for e in tl.events).values(), default=0)
                   for tl in timelines), default=0)
    width = float(np.clip(7.0 + 0.09 * busiest, 10.0, 24.0))
    has_mem = any(len(tl.memory) for tl in timelines)
    heights = [0.5 + 0.62 * len(s) for s in shown] + ([2.3] if has_mem else [])
    fig = Figure(figsize=(width, sum(heights) + 1.3), layout="constrained")
    axes = fig.subplots(len(heights), 1, sharex=True, height_ratios=heights, squeeze=False)[:, 0]
    used: set[str] = set()
    for ax, tl, label, ranks in zip(axes, timelines, labels, shown):
        used |= _gantt(ax, tl, ranks, scale, (width - AXES_PAD_IN) / (span * scale))
        note = f" ({len(ranks)} of {tl.num_ranks} ranks shown)" if len(ranks) < tl.num_ranks else ""
        ax.set_title(label + note, loc="left", fontsize=10)
    if has_mem:
        _memory(axes[-1], timelines, shown, scale, labels if len(timelines) > 1 else None)
    axes[-1].set_xlabel(f"time ({unit})")
    axes[-1].set_xlim(0, span * scale * 1.005)
    _legend(fig, used, "outside lower center" if suptitle else "outside upper center")
    if suptitle:
        fig.suptitle(suptitle, fontsize=12, fontweight="bold", x=0.01, ha="left")
    return save_figure(fig, out, dpi)


def _gantt(ax, tl: Timeline, ranks: list[int], scale: float, in_per_unit: float) -> set[str]:
    """Draw the lanes of ``ranks`` into ``ax``; return the event categories drawn."""
    from matplotlib.patches import Rectangle

    used: set[str] = set()
    ticks, names = [], []
    end = tl.iteration_s * scale
    busy = tl.busy_s()
    lane_events: dict[tuple[int, bool], list[Event]] = defaultdict(list)
    for e in tl.events:
        lane_events[(e.rank, e.stream == "comm")].append(e)
    for row, r in enumerate(ranks):
        top = row * 1.0
        lanes = ((top, COMPUTE_H, "compute"), (top + COMPUTE_H + 0.02, COMM_H, "comm"))
        ax.add_patch(Rectangle((0, top), end, COMPUTE_H, facecolor=IDLE_FILL, hatch="////",
                               edgecolor=IDLE_HATCH, lw=0, zorder=0))
        for y, h, stream in lanes:
            evs = lane_events[(r, stream == "comm")]
            used |= _bars(ax, evs, y, h, scale, in_per_unit, label_mb=stream == "compute")
        ticks += [top + COMPUTE_H / 2, top + COMPUTE_H + 0.02 + COMM_H / 2]
        names += [f"rank {r}", "comm"]
        share = busy[r] / tl.iteration_s if tl.iteration_s > 0 else 0.0
        ax.text(1.005, top + COMPUTE_H / 2, f"busy {100 * share:.0f}%", fontsize=8,
                va="center", transform=ax.get_yaxis_transform())
    ax.set_yticks(ticks, names)
    for label in ax.get_yticklabels()[1::2]:
        label.set_fontsize(7)
        label.set_color("#666666")
    ax.set_ylim(len(ranks) - RANK_GAP + 0.1, -0.1)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", color="#DDDDDD", lw=0.5)
    ax.set_axisbelow(True)
    if tl.iteration_s > 0:
        ax.axvline(end, color="#333333", lw=0.8, ls=":")
    return used | ({"idle"} if ranks else set())


def _bars(ax, evs: list[Event], y: float, h: float, scale: float, in_per_unit: float,
          label_mb: bool) -> set[str]:
    """Bars of one lane (stacked into sub-lanes when events overlap)."""
    if not evs:
        return set()
    sub, k = stack_lanes(evs)
    hh = h / k
    min_w = 1.2 / 72 / in_per_unit  # at least ~1.2 pt wide, so instants stay visible
    groups: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for e, j in zip(evs, sub):
        x0, w = e.start_s * scale, max(e.duration_s * scale, min_w)
        groups.setdefault((category(e), j), []).append((x0, w))
    for (cat, j), xr in groups.items():
        ax.broken_barh(xr, (y + j * hh, hh), facecolors=KIND_COLOURS[cat], edgecolor="white",
                       linewidth=0.3, zorder=2)
    if label_mb:
        for e, j in zip(evs, sub):
            _mb_text(ax, e, y + (j + 0.5) * hh, scale, in_per_unit)
    return {c for c, _ in groups}


def _mb_text(ax, e: Event, y: float, scale: float, in_per_unit: float) -> None:
    """Write the micro-batch number on a bar when it fits."""
    if e.mb < 0:
        return
    text = str(e.mb)
    if e.duration_s * scale * in_per_unit < text_width_in(text, MB_PT) + 0.04:
        return
    colour = "white" if luminance(_rgb(KIND_COLOURS[category(e)])) < 0.55 else "black"
    ax.text((e.start_s + e.duration_s / 2) * scale, y, text, ha="center", va="center",
            fontsize=MB_PT, color=colour, zorder=3, clip_on=True)


def _rgb(colour: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return to_rgb(colour)


def _memory(ax, timelines: list[Timeline], shown: list[list[int]], scale: float,
            labels: list[str] | None) -> None:
    """One step line per rank (solid for the first timeline, dashed for the second).

    Up to 10 ranks get tab10 colours; more get an ordered viridis ramp (rank 0 dark).
    """
    from matplotlib import colormaps

    top = max([float(np.max(b)) for tl in timelines for _, b in tl.memory if len(b)] +
              [tl.memory_limit_bytes or 0.0 for tl in timelines] + [1.0])
    div, unit = byte_unit(top)
    many = max(tl.num_ranks for tl in timelines) > 10
    styles = ("-", "--")
    for k, (tl, ranks) in enumerate(zip(timelines, shown)):
        for r in ranks:
            colour = colormaps["viridis"](r / max(tl.num_ranks - 1, 1) * 0.9) if many \
                else colormaps["tab10"](r)
            if r >= len(tl.memory) or not len(tl.memory[r][0]):
                continue
            t, b = np.asarray(tl.memory[r][0], float), np.asarray(tl.memory[r][1], float)
            t, b = np.append(t, max(tl.iteration_s, t[-1])), np.append(b, b[-1])
            who = f"{labels[k].split(':')[0]} " if labels else ""
            ax.plot(t * scale, b / div, drawstyle="steps-post", lw=1.3, ls=styles[k % 2],
                    color=colour, label=f"{who}rank {r} (peak {format_bytes(b.max())})")
    limits = {tl.memory_limit_bytes for tl in timelines if tl.memory_limit_bytes}
    for lim in sorted(limits):
        if np.isfinite(lim):
            ax.axhline(lim / div, color="#C0392B", ls=(0, (5, 3)), lw=1.2,
                       label=f"limit {format_bytes(lim)}")
    ax.set_ylabel(f"memory ({unit})")
    ax.set_ylim(0, top / div * 1.08)
    ax.grid(color="#DDDDDD", lw=0.5)
    handles = ax.get_legend_handles_labels()[0]
    if 0 < len(handles) <= 20:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title("memory over time per rank", loc="left", fontsize=10)


def _legend(fig, used: set[str], where: str) -> None:
    from matplotlib.patches import Patch

    order = [c for c in KIND_COLOURS if c in used]
    handles = [Patch(facecolor=KIND_COLOURS[c], label=KIND_NAMES[c]) for c in order]
    if "idle" in used:
        handles.append(Patch(facecolor=IDLE_FILL, edgecolor=IDLE_HATCH, hatch="////",
                             label="idle"))
    if handles:
        fig.legend(handles=handles, loc=where, ncol=min(len(handles), 8),
                   fontsize=8, frameon=False)
