"""What to tell a user whose graph does not fit: the smallest fix that would.

The device count named is the fewest *contiguous* stages (over the program order) that fit the
limit, found by a memory-only greedy; ParDNN and the pipeline planner both try that split, so a
request for that many devices succeeds. It is an upper bound on the true minimum (a placement that
is not contiguous might fit on fewer). The memory named is the least per-device limit under which
the requested device count fits with a contiguous split (found by binary search).
"""

from __future__ import annotations

import numpy as np

from outcore.errors import InfeasibleError
from outcore.placers.context import Context
from outcore.placers.stages import fewest_stages, least_memory
from outcore.units import format_bytes


def node_floor_bytes(ctx: Context) -> tuple[float, int]:
    """(least bytes the largest node needs on any device, its index): params, saved, output."""
    g = ctx.g
    if g.num_nodes == 0:
        return 0.0, 0
    need = (g.param_bytes * float(ctx.factor) + float(ctx.microbatches) * g.saved_bytes
            + g.out_bytes.astype(np.float64))
    i = int(np.argmax(need))
    return float(need[i]), i


def spread_floor_bytes(ctx: Context) -> float:
    """The least per-device limit under which a placement on ``ctx.devices`` devices or fewer
    could fit by the planners' memory model: the devices together must hold every parameter's
    state, one micro-batch's saved activations, the largest output on its device and, on each
    other device in use, at least the smallest output (a device in use holds one). Below it
    every planner fails, which this proves at once."""
    g = ctx.g
    if g.num_nodes == 0:
        return 0.0
    out = np.asarray(g.out_bytes, np.float64)
    base = (float(g.param_bytes.sum()) * float(ctx.factor) + float(g.saved_bytes.sum())
            + float(out.max()))
    least = float(out.min())
    return min((base + (k - 1) * least) / k for k in range(1, ctx.devices + 1))


def holds_floor(ctx: Context, devices: int) -> bool:
    """Whether ``devices`` of the context's devices may hold the graph under its memory limit
    (no limit, or the limit at least :func:`spread_floor_bytes` of that many devices)."""
    return ctx.memory_bytes is None or \
        ctx.memory_bytes >= spread_floor_bytes(ctx.with_devices(devices))


def infeasible(ctx: Context, strategy: str, best_peak_bytes: float | None = None,
               *, inflight: str = "all", own_placement: bool = True) -> InfeasibleError:
    """An :class:`InfeasibleError` naming the fewest devices and least memory that would fit.

    ``own_placement`` is False for baselines, whose placement is fixed: the devices named are
    then those with which ``pardnn``/``pipeline`` fit.
    """
    limit = float(ctx.memory_bytes or 0.0)
    k = ctx.devices
    floor, node = node_floor_bytes(ctx)
    worst = f" (the best placement needs {format_bytes(best_peak_bytes)})" \
        if best_peak_bytes is not None else ""
    if floor > limit:
        name = ctx.g.name_of(node)
        return InfeasibleError(
            f"{strategy}: node {name} alone needs {format_bytes(floor)} and the limit is "
            f"{format_bytes(limit)} per device, so no number of devices fits it without memory "
            f"policies; use devices with at least {format_bytes(floor)}, or enable activation "
            "checkpointing or offload",
            min_devices=None, min_memory_bytes=least_memory(ctx, k, inflight=inflight))
    kmin = fewest_stages(ctx, inflight=inflight)
    mem = least_memory(ctx, k, inflight=inflight)
    who = "" if own_placement else " with strategy 'pardnn' or 'pipeline'"
    fix_dev = f"use {kmin} devices{who}" if kmin is not None else "no device count fits"
    assert mem is not None  # one device holds anything, so k devices have a least memory
    return InfeasibleError(
        f"{strategy}: no placement on {k} device{'s' if k != 1 else ''} fits "
        f"{format_bytes(limit)} per device{worst}; {fix_dev}, or {format_bytes(mem)} per "
        f"device on {k}", min_devices=kmin, min_memory_bytes=mem)
