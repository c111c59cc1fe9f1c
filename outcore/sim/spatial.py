"""The extra tile ranks of a spatial plan in a simulated iteration (MPI4DL's SP; no torch).

The schedule gives the extra tile ranks no piece: they run the tiled layers of the spatial
stage's first piece in lock-step with its rank (tile 0), whose timeline already carries the
per-tile compute, halo and gather times (:mod:`outcore.schedule.spatial`). Their figures are
therefore derived from that rank's: busy time = micro-batches x the tiled layers' forward and
backward; peak = the tiled layers' parameters and optimizer state, plus the saved tile
activations of as many micro-batches as tile 0 holds in flight, plus what one micro-batch's
peak holds beyond its saved activations (:func:`outcore.schedule.spatial.walk_peak`).
"""

from __future__ import annotations

from dataclasses import replace

from outcore.graph.ir import Graph
from outcore.plan.plan import Plan
from outcore.plan.spatial import home_rank, tile_ranks
from outcore.schedule.lower import Lowered
from outcore.schedule.spatial import inflight, tile_rank_costs

__all__ = ["with_tile_ranks"]


def with_tile_ranks(result, plan: Plan, g: Graph, low: Lowered):
    """``result`` (a :class:`~outcore.sim.simulate.SimResult`) with the tile ranks' busy time,
    idle time, bytes sent and peak memory filled in."""
    sp = plan.spatial
    assert sp is not None  # called for spatial plans only
    stages = plan.stages
    dp = plan.layout.dp
    tc = tile_rank_costs(g, sp, low.cluster, stages, plan.optimizer, dp)
    sched = low.schedule
    n = g.num_nodes
    first = int(sp.indices(g)[0])
    M = sched.microbatches
    scale = float(sched.meta.get("scale", 1.0))
    busy, idle = result.busy_s.copy(), result.idle_s.copy()
    comm, peak = result.comm_bytes.astype(float), result.peak_bytes.astype(float)
    for c in range(plan.layout.copies):
        # the copy's tiled piece on its spatial stage's rank (the copied graph: c * n + i)
        piece = int(sched.pieces.piece_of[c * n + first])
        home = home_rank(stages, sp, c, plan.layout.maps)
        live = inflight(sched.actions[home], piece)
        for r in tile_ranks(stages, sp.tiles, dp, c):
            busy[r] = M * (tc.fwd_s + tc.bwd_s) * scale
            idle[r] = max(result.iteration_s - busy[r], 0.0)
            comm[r] = M * tc.comm_bytes * scale
            peak[r] = tc.static_bytes + live * tc.saved_bytes * scale + \
                tc.transient_bytes * scale
    return replace(result, busy_s=busy, idle_s=idle, comm_bytes=comm, peak_bytes=peak)
