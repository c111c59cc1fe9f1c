"""How the search judges a plan: whether it fits, the row ``--explain`` lists for it, the note
it leaves, and :class:`Beaten`, the end of a layout's search that cannot win (no torch)."""

from __future__ import annotations

from outcore.errors import InfeasibleError
from outcore.plan.plan import Plan

__all__ = ["Beaten", "candidate_note", "fits", "placement_row"]


def fits(p: Plan) -> bool:
    """True when the plan's predicted peaks fit its memory limit."""
    peaks = p.predicted.get("peak_bytes") or [0]
    return not p.memory_bytes or max(peaks) <= p.memory_bytes * (1 + 1e-9)


class Beaten(InfeasibleError):
    """A layout's search stopped: its placements are already slower than ``beat_s``, the
    time another layout's plan has (:func:`~outcore.search.copies.plan_layout`); its plan
    could not win."""


def placement_row(p: Plan) -> dict:
    """A placement as ``outcore plan --explain`` lists it (the schedule when not 1F1B)."""
    return {"strategy": p.strategy + (f" ({p.schedule})" if p.schedule != "1f1b" else ""),
            "iteration_s": float(p.predicted["iteration_s"]),
            "peak_bytes": float(max(p.predicted["peak_bytes"])), "fits": fits(p)}


def candidate_note(name: str, p: Plan) -> str:
    """The plan's note on a simulated placement: its time, peak and memory policies."""
    pol = p.policies
    return (f"{name}: simulated {p.predicted['iteration_s'] * 1e3:.2f} ms per iteration, peak "
            f"{max(p.predicted['peak_bytes']) / 2**20:.1f} MiB"
            + (f", memory policies on {int((pol.group_of >= 0).sum())} nodes" if pol else ""))
