"""Which layouts the layout search plans, in which order, and which of their plans wins: the
meshes grouped with their micro-batch counts, the reasons a layout is skipped, the record
``--explain`` shows for each, and the tie rule (no torch)."""

from __future__ import annotations

from typing import Any

from outcore.plan.plan import Plan
from outcore.plan.request import PlanRequest
from outcore.search.layouts import LayoutChoice
from outcore.search.verdict import placement_row
from outcore.units import format_bytes

__all__ = ["EXTRA_MICROBATCH_STEPS", "TIE", "better", "fill", "fits_unsharded", "layout_key",
           "mesh_groups", "record", "why_lost", "why_skipped"]


# larger micro-batch counts tried after the first that fits, per (dp, mode) (pipelines fill)
EXTRA_MICROBATCH_STEPS = 2


# plans within this fraction of the fastest count as ties: the fewest micro-batches, then the
# least data parallelism, wins (the simulator's per-micro-batch overheads are optimistic)
TIE = 0.01


def why_skipped(c: LayoutChoice, req: PlanRequest, policy: str, best: list[Any],
                 extra_left: int | None, slower: bool) -> str | None:
    """Why :func:`_search_group` does not plan ``c`` (its outcome), or None."""
    floor = c.floor(policy)
    if req.memory_bytes and floor > req.memory_bytes:
        return f"pruned: memory floor {format_bytes(floor)} per device over the limit"
    if best and c.time_bound_s > best[1].predicted["iteration_s"]:
        return "pruned: its time bound exceeds the best plan's time"
    if extra_left is not None and (extra_left <= 0 or slower):
        return ("not tried: more micro-batches were slower" if slower else
                "not tried: fewer micro-batches fit already")
    return None


def fits_unsharded(c: LayoutChoice, records: list[dict[str, Any]]) -> bool:
    """Whether ``c``'s mesh without sharding had a plan that fits."""
    return any(r["outcome"] == "fits" and r["depth"] == 1 and
               (r["dp"], r["parallel"], r["replicas"], r["tp"], r["sp"]) ==
               (c.dp, c.parallel, c.replicas, c.tp, c.sp) for r in records)


def mesh_groups(choices: list[LayoutChoice]) -> list[list[LayoutChoice]]:
    """Choices grouped by mesh (dp, mode, replicas), micro-batch counts ascending; plain
    meshes before tensor-parallel ones (:func:`candidate_layouts`), and among them the
    fewest model-parallel devices per copy first: they plan fastest (one device: no
    placement at all), and the plan they find bounds the others' searches
    (:func:`_search_group`)."""
    groups: dict[tuple, list[LayoutChoice]] = {}
    for c in choices:
        groups.setdefault((c.dp, c.parallel, c.replicas, c.tp, c.sp, c.depth), []).append(c)
    ordered = sorted(groups.values(),  # (stable: sharded meshes stay after their plain ones)
                     key=lambda v: (v[0].tp > 1, -v[0].dp * v[0].tp * v[0].sp))
    return [sorted(v, key=lambda c: c.microbatches) for v in ordered]


def record(c: LayoutChoice, policy: str) -> dict[str, Any]:
    return {"layout": c.label, "dp": c.dp, "parallel": c.parallel, "replicas": c.replicas,
            "tp": c.tp, "sp": c.sp, "depth": c.depth, "microbatches": c.microbatches,
            "samples": c.samples,
            "memory_policy": policy, "time_bound_s": c.time_bound_s,
            "memory_floor_bytes": c.floor(policy)}


def fill(rec: dict[str, Any], p: Plan) -> None:
    row = placement_row(p)
    rec.update(strategy=row["strategy"], iteration_s=row["iteration_s"],
               peak_bytes=row["peak_bytes"], placements=p.extra.get("placements", []))


def layout_key(p: Plan, c: LayoutChoice) -> tuple[float, int, int, int, int]:
    return (float(p.predicted["iteration_s"]), c.microbatches, c.dp, c.depth, c.tp)


def better(a: tuple[float, int, int, int, int], b: tuple[float, int, int, int, int]) -> bool:
    """``a`` beats ``b``: clearly faster, or a tie (within :data:`TIE`) with fewer
    micro-batches, then less data parallelism, then less sharding, then less tensor
    parallelism."""
    if a[0] < b[0] * (1 - TIE):
        return True
    if b[0] < a[0] * (1 - TIE):
        return False
    return a[1:] < b[1:]


def why_lost(rec: dict[str, Any], best: Plan) -> str:
    t, bt = rec["iteration_s"], float(best.predicted["iteration_s"])
    if t > bt * (1 + TIE):
        return f"slower ({t / bt:.2f}x)"
    return "tie: more micro-batches, data parallelism, sharding or tensor parallelism"
