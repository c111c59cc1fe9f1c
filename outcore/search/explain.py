"""Why a plan won: the search's candidates as rows, best first (no torch).

The layout search (:mod:`outcore.search.layouts`) keeps one compact record per layout it
considered in ``plan.extra["candidates"]`` (mesh, micro-batches, memory-policy pass, outcome,
and the placements the simulator judged for it, in ``placements``); the placement search keeps
its simulated placements in ``plan.extra["placements"]``. :func:`rows` flattens them into one
row per (layout, placement), the best few placements of each layout, with why each lost:
``outcore plan --explain`` prints them as a table and draws time against memory.
"""

from __future__ import annotations

from typing import Any

from outcore.plan.plan import Plan

__all__ = ["rows", "runner_up"]


def rows(p: Plan, *, per_layout: int = 3) -> list[dict[str, Any]]:
    """One row per (layout, placement): ``layout``, ``strategy``, ``iteration_s``,
    ``peak_bytes``, ``fits``, ``chosen``, ``why`` (why it lost, or ``chosen``); evaluated rows
    first by time, then the layouts pruned or refused (no time)."""
    limit = p.memory_bytes
    best_s = float(p.predicted.get("iteration_s", 0.0))
    records = p.extra.get("candidates") or [_own_layout(p)]
    out: list[dict[str, Any]] = []
    for rec in records:
        placements = rec.get("placements") or []
        if rec.get("dp", 1) * rec.get("replicas", 1) > 1:
            placements = []  # placements were timed on one copy: show the replicated plan only
        if not placements:
            chosen = rec["outcome"] == "chosen"
            fits = chosen or rec["outcome"].startswith(("slower", "tie"))
            out.append(_row(rec, rec.get("strategy", ""), rec.get("iteration_s"),
                            rec.get("peak_bytes"), rec["outcome"], chosen, fits))
            continue
        for k, pl in enumerate(placements[:per_layout]):
            chosen = rec["outcome"] == "chosen" and k == 0
            fits = pl["fits"] and (not limit or pl["peak_bytes"] <= limit * (1 + 1e-9))
            why = "chosen" if chosen else _why(rec, k, pl, fits, best_s)
            out.append(_row(rec, pl["strategy"], pl["iteration_s"], pl["peak_bytes"], why,
                            chosen, fits))
    timed = sorted((r for r in out if r["iteration_s"] is not None),
                   key=lambda r: (not r["chosen"], r["iteration_s"]))
    return timed + [r for r in out if r["iteration_s"] is None]


def runner_up(p: Plan) -> dict[str, Any] | None:
    """The fastest row that fits and was not chosen (None if there is none)."""
    for r in rows(p):
        if not r["chosen"] and r["fits"] and r["iteration_s"] is not None:
            return r
    return None


def _own_layout(p: Plan) -> dict[str, Any]:
    """The record of a plan made without the layout search (its own layout only; of a
    replicated one, the plan alone: its placements were timed on one copy)."""
    timed = None if p.layout.replicated else p.extra.get("placements")
    return {"layout": p.layout.describe() or "as given", "microbatches": p.microbatches,
            "memory_policy": "", "outcome": "chosen",
            "placements": timed or [
                {"strategy": p.strategy, "iteration_s": p.predicted.get("iteration_s"),
                 "peak_bytes": max(p.predicted.get("peak_bytes") or [0]), "fits": True}]}


def _why(rec: dict[str, Any], k: int, pl: dict[str, Any], fits: bool, best_s: float) -> str:
    if not fits:
        return "does not fit"
    if k > 0:
        return f"slower placement ({pl['iteration_s'] / best_s:.2f}x)" if best_s else "slower"
    return rec["outcome"] if rec["outcome"] != "fits" else "slower"


def _row(rec: dict[str, Any], strategy: str, time_s: float | None, peak: float | None,
         why: str, chosen: bool, fits: bool = False) -> dict[str, Any]:
    return {"layout": rec["layout"], "memory_policy": rec.get("memory_policy", ""),
            "microbatches": rec.get("microbatches"), "strategy": strategy,
            "iteration_s": time_s, "peak_bytes": peak, "fits": fits, "chosen": chosen,
            "why": why}
