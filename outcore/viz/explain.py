"""Time against memory for every candidate plan the search judged (``outcore plan --explain``).

One point per (layout, placement) row of :func:`outcore.search.explain.rows`: predicted
iteration time against peak memory per device, the chosen plan marked, the memory limit drawn
as a line, points that do not fit greyed out.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from outcore.viz.style import save_figure

__all__ = ["draw_candidates"]


def draw_candidates(rows: list[dict[str, Any]], path: str | os.PathLike, *,
                    memory_bytes: float | None = None, title: str = "candidate plans",
                    dpi: float = 110) -> Path:
    """Scatter of iteration time (ms) against peak memory (MiB) of ``rows``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 5.0), layout="constrained")
    ax = fig.subplots()
    timed = [r for r in rows if r["iteration_s"] is not None and r["peak_bytes"] is not None]
    for fits, colour, label in ((True, "tab:blue", "fits"), (False, "0.6", "does not fit")):
        pts = [r for r in timed if r["fits"] == fits and not r["chosen"]]
        if pts:
            ax.scatter([r["peak_bytes"] / 2**20 for r in pts],
                       [r["iteration_s"] * 1e3 for r in pts], c=colour, s=22, label=label)
    for r in timed:
        if r["chosen"]:
            ax.scatter([r["peak_bytes"] / 2**20], [r["iteration_s"] * 1e3], marker="*",
                       s=220, c="tab:red", label=f"chosen: {r['strategy']}, {r['layout']}")
    if memory_bytes:
        ax.axvline(memory_bytes / 2**20, color="k", linestyle="--", linewidth=1,
                   label="memory limit")
    ax.set_xlabel("peak memory per device (MiB)")
    ax.set_ylabel("predicted iteration (ms)")
    ax.set_title(title, loc="left", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    return save_figure(fig, Path(path), dpi)
