"""Plan spatial parallelism: choose the join, place the rest, simulate (MPI4DL's SP + LP).

Jain et al. (MPI4DL, SP + LP): the first layers of a network on a huge image run on tiles over
``sp`` ranks; where activations have shrunk, the tiles join and the rest runs layer-parallel.
Steps:

1. *Join candidates*: the cuts of the graph's node order where everything before has a spatial
   version (:func:`outcore.plan.spatial.join_candidates`); every tiled tensor used after the
   cut (the join node's output, a U-Net's skip connections) is gathered there.
2. *Memory model*: for each candidate, a tile's memory (parameters x optimizer state of the
   tiled layers + its share of their saved activations) and the spatial stage's (its tile plus
   an even share of the rest of the graph over the ``stages`` ordinary devices, the gathered
   activations included). With a limit, the candidates where both fit are tried earliest first
   (the earliest point after which the rest is held under the limit: the fewest layers pay
   halo exchanges); then the others, least memory first. Without a limit, the candidate with
   the smallest estimated peak first. ``--sp-join`` names it instead.
3. *Placement*: the rest of the graph is planned with the ordinary search on ``stages = devices
   / dp - replicas x (sp - 1)`` devices (``dp`` data-parallel copies and, with GEMS MAST, two
   replicas: every copy has its own tile group), on the graph costed per tile
   (:func:`outcore.schedule.spatial.tiled_graph`); the tiled nodes go to the stage holding the
   inputs, without memory policies.
4. *Check*: the plan is simulated with its tile ranks; the first candidate that fits is kept.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from outcore.cost.memory import state_factor
from outcore.cost.spatial_geometry import TileGrid
from outcore.errors import InfeasibleError, UsageError
from outcore.graph.ir import Graph
from outcore.plan.plan import Plan
from outcore.plan.policies import MemoryPolicies
from outcore.plan.request import PlanRequest
from outcore.plan.spatial import SpatialPlan, crossing, join_candidates, prefix_of, tile_fraction
from outcore.schedule.spatial import tiled_graph
from outcore.sim.simulate import simulate
from outcore.units import format_bytes

__all__ = ["plan_spatial", "rank_joins"]

TRIES = 12


def _estimates(g: Graph, grid: TileGrid, stages: int, optimizer: str, j: int
               ) -> tuple[float, float]:
    """(tile memory, spatial stage memory) for join node ``j`` (see module docstring)."""
    f = state_factor(optimizer)
    frac = np.array([tile_fraction(g, i, grid) for i in range(j + 1)])
    tile = float((g.param_bytes[:j + 1] * f).sum() + (g.saved_bytes[:j + 1] * frac).sum())
    gathered = crossing(g, range(j + 1))
    rest = float((g.param_bytes[j + 1:] * f).sum() + g.saved_bytes[j + 1:].sum()
                 + g.out_bytes[gathered].sum())
    return tile, tile + rest / stages


def rank_joins(g: Graph, grid: TileGrid, stages: int, memory_bytes: float | None,
               optimizer: str) -> list[tuple[int, str]]:
    """Join candidates in the order to try, each with the reason (for the plan's notes)."""
    cands = join_candidates(g, grid)
    if not cands:
        raise UsageError(f"no layer of {g.name!r} can run on {grid.rows}x{grid.cols} tiles: "
                         "the graph must start with convolutions, pooling, batch norm or "
                         "element-wise layers on images with a row and a column per tile")
    est = {j: _estimates(g, grid, stages, optimizer, j) for j in cands}
    if memory_bytes:
        ok = [j for j in cands if max(est[j]) <= memory_bytes]
        rest = sorted((j for j in cands if j not in ok), key=lambda j: (max(est[j]), j))
        lim = format_bytes(memory_bytes)
        return [(j, f"the earliest point where a tile ({format_bytes(est[j][0])}) and the "
                    f"spatial stage with its share of the rest ({format_bytes(est[j][1])}) "
                    f"fit {lim}") for j in ok] + \
               [(j, f"no point fits {lim} by the memory model; this one needs the least "
                    f"({format_bytes(max(est[j]))} estimated)") for j in rest]
    order = sorted(cands, key=lambda j: (max(est[j]), j))
    return [(j, f"no memory limit: the smallest estimated peak per rank "
                f"({format_bytes(max(est[j]))})") for j in order]


def plan_spatial(g: Graph, req: PlanRequest, search: Callable[[Graph, PlanRequest], Plan]
                 ) -> Plan:
    """The plan of ``req`` (``req.sp > 1``): tiled prefix, join, ordinary plan of the rest."""
    grid = TileGrid.parse(req.sp_grid) if req.sp_grid else TileGrid(rows=req.sp, cols=1)
    replicas = 2 if req.parallel == "mast" else 1   # each GEMS replica has its own tiles
    stages = req.devices // req.dp - replicas * (req.sp - 1)   # ordinary slots of a dp copy
    if stages < 1 or (replicas > 1 and stages < 2):
        raise UsageError(f"--sp {req.sp} with {req.parallel} on {req.devices} devices leaves "
                         f"{stages} model-parallel device(s): use more devices")
    if req.sp_join:
        order = [(prefix_of(g, req.sp_join, grid), "named by --sp-join")]
    else:
        order = rank_joins(g, grid, stages, req.memory_bytes, req.optimizer)[:TRIES]
    base_req = req.replace(devices=stages * req.dp, sp=1, sp_join=None, sp_grid=None)
    notes: list[str] = []
    fallback: Plan | None = None
    for j, why in order:
        name = g.name_of(j)
        sp = SpatialPlan(grid=f"{grid.rows}x{grid.cols}", join=name,
                         tiled=tuple(int(i) for i in g.ids[:j + 1]), stage=0, reason=why)
        try:
            base = search(tiled_graph(g, sp, req.cluster, stages, req.dp), base_req)
        except InfeasibleError as e:
            notes.append(f"sp join at {name}: rest does not fit ({str(e).splitlines()[0]})")
            continue
        plan = _attach(g, base, req, sp, j)
        sim = simulate(plan, g, cluster=req.cluster)
        plan = plan.replace(predicted={**base.predicted, **sim.to_dict()})
        line = (f"sp {req.sp} ({sp.grid} tiles) joins after {name} (node {j + 1} of "
                f"{g.num_nodes}): {why}; simulated {sim.iteration_s * 1e3:.1f} ms, peak "
                f"{format_bytes(float(sim.peak_bytes.max()))}")
        if sim.fits:
            return plan.with_notes(*notes, line)
        notes.append(line + " (does not fit)")
        fallback = fallback or plan.with_notes(*notes)
    if fallback is not None and not req.memory_bytes:
        return fallback
    raise InfeasibleError(f"no spatial join fits {format_bytes(req.memory_bytes or 0)} with "
                          f"--sp {req.sp} on {req.devices} devices: " + "; ".join(notes[-3:])
                          + ". Use more tiles (--sp), more devices or more memory")


def _attach(g: Graph, base: Plan, req: PlanRequest, sp: SpatialPlan, j: int) -> Plan:
    """``base`` (the ordinary plan on ``stages`` devices) with the tiled nodes on the inputs'
    stage, no memory policy on them, and the spatial layout."""
    assignment = base.assignment.copy()
    stage = int(assignment[0])
    assignment[:j + 1] = stage
    policies = base.policies
    if policies is not None:
        group_of = policies.group_of.copy()
        group_of[:j + 1] = -1
        policies = MemoryPolicies(group_of, policies.policies)
    sp = SpatialPlan(grid=sp.grid, join=sp.join, tiled=sp.tiled, stage=stage, reason=sp.reason)
    return base.replace(devices=req.devices, assignment=assignment, policies=policies,
                        layout=replace(base.layout, sp=req.sp), spatial=sp,
                        devices_used=base.devices_used)
