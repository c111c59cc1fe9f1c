"""ParDNN: critical-path partitioning of a training graph under a memory limit.

Qararyah, Wahib, Dikbayır, Belviranli, Unat, "A Computational-Graph Partitioning Method for
Training Memory-Constrained DNNs", Parallel Computing 2021 (arXiv 2008.08636). The steps, named
as in the paper (section 4):

* **Step 1** - *slicing* (:mod:`~outcore.placers.pardnn.slicing`): K primary clusters along
  successive critical paths, secondary linear clusters through the rest; *mapping*
  (:mod:`~outcore.placers.pardnn.mapping`): secondaries onto primaries by level-aware load
  balancing; *refinement* (:mod:`~outcore.placers.pardnn.refine`): path swapping and node
  switching on the critical path of the emulated schedule.
* **Step 2** (:mod:`~outcore.placers.pardnn.memory`): emulate, model memory per device, and
  repair every overflow by moving the nodes with the least communication per byte freed.

What this driver adds (``docs/planning.md`` explains why):

* refinement runs after step 2 and keeps only moves that still fit, so the repair does not undo
  it (with no memory limit the order makes no difference);
* it plans for every device count in {K, K/2, K/4, ..., 1} (powers of two below K) and keeps the
  fastest plan that fits, so a plan is never slower than the best plan found on fewer devices,
  and may use fewer devices than asked;
* under a memory limit it also starts step 2 and the refinement from a memory-balanced contiguous
  split, and keeps whichever start ends faster, so that a fitting plan is found whenever a
  contiguous one exists (the message of :class:`~outcore.errors.InfeasibleError` relies on it).
"""

from __future__ import annotations

import logging

import numpy as np

from outcore.placers.context import Context
from outcore.placers.feasibility import holds_floor
from outcore.placers.pardnn.mapping import map_secondaries
from outcore.placers.pardnn.memory import repair_memory
from outcore.placers.pardnn.refine import refine
from outcore.placers.pardnn.slicing import slice_graph
from outcore.placers.registry import Placement, Placer
from outcore.placers.result import Candidate, best_of, evaluate, listed
from outcore.placers.stages import assignment_from_bounds, device_counts, stage_bounds
from outcore.units import format_seconds

log = logging.getLogger(__name__)

LARGE_GRAPH_NODES = 250_000
# refine the two best device counts below this many nodes, else the best one: on the five
# generators at 20k and 45k nodes (K = 4, 16 GB/s, no cap, 1.25x and 1.0x the fair share) the
# second refinement never changed ParDNN's plan nor the search's, and took up to 0.26 s of it
REFINE_TWO_BELOW = 20_000


def refine_rounds(ctx: Context) -> int:
    """Refinement rounds (each one emulation): K + 2, at most 8; 3 on graphs over 250k nodes."""
    if ctx.g.num_nodes > LARGE_GRAPH_NODES:
        return 3
    return min(ctx.devices + 2, 8)


def plan(ctx: Context) -> tuple[Candidate | None, list[str], list[Candidate]]:
    """Run ParDNN for ``ctx``; return (best fitting candidate or None, notes, all candidates)."""
    notes: list[str] = []
    cands: list[Candidate] = []
    paths: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    limited = ctx.memory_bytes is not None
    keep = 2 if ctx.g.num_nodes < REFINE_TWO_BELOW else 1
    for k in device_counts(ctx.devices):
        sub = ctx.with_devices(k)
        if k == 1:
            one = evaluate(sub, np.zeros(ctx.g.num_nodes, np.int64), "1 device")
            cands.append(one.light())
            continue
        if not holds_floor(ctx, k):
            notes.append(f"K={k}: not tried, {k} devices cannot hold the graph's memory floor")
            continue
        sl = slice_graph(sub, k)
        a = map_secondaries(sub, sl)
        paths[k] = (sl.sec_ptr, sl.sec_nodes)
        line = (f"K={k}: step 1 sliced {sl.primaries} primary and {sl.num_secondaries} "
                "secondary clusters")
        del sl
        if limited:
            a, rs = repair_memory(sub, a)
            line += f"; step 2 moved {rs.moved_nodes} nodes in {rs.passes} passes"
            if not rs.fits:
                line += " and did not fit"
        notes.append(line)
        cands.append(evaluate(sub, a, f"pardnn K={k}", traced=True))
        if limited:
            bounds = stage_bounds(sub, k, inflight="all")
            if bounds is not None:
                seed = assignment_from_bounds(sub, bounds)
                cands.append(evaluate(sub, seed, f"pardnn K={k} from a contiguous split",
                                      traced=True))
        cands = _keep_best_emulations(cands, keep)
    multi = sorted((c for c in cands if c.fits and c.label != "1 device"),
                   key=lambda c: (c.makespan_s, c.label))
    rounds = refine_rounds(ctx)
    for c in multi[:keep]:
        k = int(c.label.split("K=")[1].split()[0])
        sub = ctx.with_devices(k)
        sec_ptr, sec_nodes = paths[k]
        a, em, st = refine(sub, c.assignment, sec_ptr, sec_nodes, rounds=rounds,
                           em=c.emulation)
        notes.append(f"{c.label}: refinement {st.rounds} rounds, {st.accepted} accepted, "
                     f"{st.moved_nodes} nodes moved, {format_seconds(st.start_s)} -> "
                     f"{format_seconds(st.end_s)}")
        cands.append(evaluate(sub, a, c.label + ", refined", em=em).light())
    best = best_of(cands)
    notes.append(listed(cands))
    if best is not None:
        notes.append(f"chose {best.label}")
    log.debug("pardnn: %s", "; ".join(notes))
    return best, notes, cands


def _keep_best_emulations(cands: list[Candidate], keep: int) -> list[Candidate]:
    """Keep full emulations (needed to refine) only for the ``keep`` best fitting candidates."""
    ranked = sorted((i for i, c in enumerate(cands) if c.fits and c.label != "1 device"),
                    key=lambda i: (cands[i].makespan_s, cands[i].label))
    top = set(ranked[:keep])
    return [c if i in top else c.light() for i, c in enumerate(cands)]


class ParDNN(Placer):
    """The ``pardnn`` placer (module docstring)."""

    name = "pardnn"
    summary = ("ParDNN (Qararyah et al. 2021): critical-path slicing, level-aware mapping, "
               "refinement on the emulated schedule, memory repair; may use fewer devices")
    in_auto = True

    def place(self, ctx: Context, seed: int) -> Placement:
        return Placement(*plan(ctx))
