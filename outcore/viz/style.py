"""Shared drawing helpers: output formats, colours, text sizes and time/byte axis units.

Everything here is plain matplotlib (``Figure`` objects, never ``pyplot``), so drawing never
touches a global figure or the user's interactive backend.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from outcore.errors import UsageError

log = logging.getLogger(__name__)

SUFFIXES = (".png", ".svg")

#: Edge colours: an ordinary tensor, and one that crosses devices (communication).
EDGE_GREY, CUT_RED = "#707070", "#C0392B"

#: Approximate width of one character of DejaVu Sans, in em (an upper estimate for labels).
CHAR_EM = 0.62

#: Colours of timeline actions by kind (Event.kind); send/recv are split by direction.
KIND_COLOURS = {
    "F": "#4C78A8", "B": "#F58518", "recompute": "#9ECAE9", "optim": "#79706E",
    "send_act": "#54A24B", "send_grad": "#B279A2", "recv_act": "#A6D9A0",
    "recv_grad": "#D9B8D0", "allreduce": "#E45756", "offload": "#72B7B2",
    "prefetch": "#EECA3B", "other": "#BAB0AC",
}
KIND_NAMES = {
    "F": "forward", "B": "backward", "recompute": "recompute", "optim": "optimizer step",
    "send_act": "send activations", "send_grad": "send gradients",
    "recv_act": "recv activations", "recv_grad": "recv gradients", "allreduce": "all-reduce",
    "offload": "offload", "prefetch": "prefetch", "other": "other",
}


def check_path(path: str | os.PathLike) -> Path:
    """The output path as a :class:`Path`; raise :class:`UsageError` for unknown suffixes."""
    p = Path(path)
    if p.suffix.lower() not in SUFFIXES:
        raise UsageError(f"cannot draw to {str(p)!r}: the file name must end in "
                         f"{' or '.join(SUFFIXES)} (got {p.suffix or 'no suffix'!r})")
    return p


def text_width_in(text: str, fontsize_pt: float) -> float:
    """Estimated width of ``text`` at ``fontsize_pt`` points, in inches."""
    return len(text) * CHAR_EM * fontsize_pt / 72.0


def save_figure(fig, path: Path, dpi: float) -> Path:
    """Write ``fig`` to ``path`` (PNG or SVG), lowering the PNG resolution for huge figures.

    Args:
        fig: a matplotlib ``Figure``.
        path: output file (suffix already checked).
        dpi: requested dots per inch for PNG; capped so a side stays under 16,000 pixels
            and the image under 60 megapixels.
    """
    import matplotlib

    w_in, h_in = fig.get_size_inches()
    cap = min(16000.0 / max(w_in, h_in), float(np.sqrt(6e7 / max(w_in * h_in, 1e-9))))
    if dpi > cap:
        log.info("figure is %.0f x %.0f in: lowering resolution from %.0f to %.0f dpi",
                 w_in, h_in, dpi, cap)
        dpi = cap
    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "outcore"}):
        fmt = path.suffix.lower()[1:]
        meta = {"Date": None} if fmt == "svg" else {}  # same input, same bytes
        fig.savefig(path, dpi=dpi, format=fmt, metadata=meta)
    log.info("wrote %s (%.0f x %.0f in)", path, w_in, h_in)
    return path


def device_colours(k: int) -> list[tuple[float, float, float]]:
    """``k`` distinguishable light fill colours (RGB in 0..1) for devices 0..k-1.

    Up to 10: tab10; up to 20: tab20; beyond: evenly spaced hues. All are blended 35% with
    white so that black labels stay readable.
    """
    from matplotlib import colormaps
    from matplotlib.colors import hsv_to_rgb

    if k <= 10:
        base = [colormaps["tab10"](i)[:3] for i in range(k)]
    elif k <= 20:
        cmap = colormaps["tab20"]
        base = [cmap(2 * i % 20 + (2 * i >= 20))[:3] for i in range(k)]
    else:
        hues = (np.arange(k) * 0.61803398875) % 1.0  # golden-ratio steps: neighbours differ
        sat = np.where(np.arange(k) % 2 == 0, 0.65, 0.45)
        base = [tuple(hsv_to_rgb((h, s, 0.9))) for h, s in zip(hues, sat)]
    return [tuple(0.65 * np.asarray(c) + 0.35) for c in base]


def luminance(rgb: tuple[float, ...]) -> float:
    """Relative luminance (0 black .. 1 white) of an RGB colour, to pick black or white text."""
    r, g, b = rgb[:3]
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def time_unit(span_s: float) -> tuple[float, str]:
    """A scale and unit name for a time axis spanning ``span_s`` seconds: ``(1e3, 'ms')``."""
    if span_s >= 2.0:
        return 1.0, "s"
    if span_s >= 2e-3:
        return 1e3, "ms"
    return 1e6, "us"


def byte_unit(max_bytes: float) -> tuple[float, str]:
    """A divisor and binary unit name for a byte axis reaching ``max_bytes``."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if max_bytes >= 2 * factor:
            return float(factor), unit
    return 1.0, "B"


def cost_norm(cost: np.ndarray):
    """Colour normalisation of node compute times: logarithmic when they span 100x or more."""
    from matplotlib.colors import LogNorm, Normalize

    pos = cost[cost > 0]
    lo, hi = (float(pos.min()), float(pos.max())) if pos.size else (0.0, 1.0)
    if pos.size and hi / lo >= 100:
        return LogNorm(vmin=lo, vmax=hi, clip=True)
    return Normalize(vmin=0.0, vmax=hi if hi > 0 else 1.0, clip=True)


def cost_cmap():
    """Light-to-mid blue: dark enough to see, light enough for black labels."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap

    return ListedColormap(colormaps["Blues"](np.linspace(0.04, 0.6, 256)))
