"""Plan quality: emulated makespan of every strategy against the lower bound, with and without a
memory limit, per graph family and device count.

For each family (``outcore.graph.generators``), size and K: ``pardnn`` and ``pipeline`` through
``partition()``, and the baselines (round-robin, equal chunks, METIS, HEFT) as placed, all scored
by the same emulator (``outcore.placers.emulate``, one micro-batch unless ``--microbatches``).
Cells show makespan / lower bound (1.00 = optimal; the bound is max(critical path, work / K), so
no plan reaches it when communication matters). With a memory limit (``--memory 1.2``: 1.2 x the
least memory in which K contiguous stages fit) a ``*`` marks a placement that does not fit;
ParDNN and pipeline never return one. The 1-device time is shown for reference.

    .venv/bin/python benchmarks/plan_quality.py             # 2k and 20k nodes, K = 2, 4, 8
    .venv/bin/python benchmarks/plan_quality.py --quick     # 2k nodes, K = 4

Writes ``benchmarks/results/plan_quality.json`` and ``plan_quality.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from outcore.errors import InfeasibleError
from outcore.graph.generators import FAMILIES, make
from outcore.placers import baselines, partition
from outcore.placers.context import make_context
from outcore.placers.result import evaluate
from outcore.placers.stages import least_memory

RESULTS = Path(__file__).resolve().parent / "results"
BASELINES = {"round-robin": baselines.round_robin, "chunks": baselines.equal_chunks,
             "metis": lambda ctx: baselines.metis(ctx)[0], "heft": baselines.heft}
COLUMNS = ["pardnn", "pipeline", *BASELINES]


def one_case(family: str, nodes: int, k: int, memory: float | None, mbs: int) -> dict:
    g = make(family, nodes, seed=0)
    ctx = make_context(g, k, microbatches=mbs)
    limit = None if memory is None else memory * least_memory(ctx, k)
    ctx = make_context(g, k, microbatches=mbs, memory_bytes=limit)
    bound = ctx.lower_bound_s()
    one = evaluate(ctx.with_devices(1), np.zeros(g.num_nodes, np.int64), "one")
    row = {"family": family, "nodes": g.num_nodes, "k": k, "limit_bytes": limit,
           "lower_bound_s": bound, "one_device_s": one.makespan_s, "one_device_fits": one.fits}
    for name in ("pardnn", "pipeline"):
        t = time.perf_counter()
        try:
            r = partition(g, k, memory_bytes=limit, strategy=name, microbatches=mbs)
            row[name] = {"makespan_s": r.makespan_s, "fits": True, "devices": r.devices_used,
                         "peak_over_limit": (float(r.peak_bytes.max()) / limit) if limit else None,
                         "wall_s": time.perf_counter() - t}
        except InfeasibleError as e:
            row[name] = {"makespan_s": None, "fits": False, "error": str(e)}
    for name, fn in BASELINES.items():
        t = time.perf_counter()
        c = evaluate(ctx, fn(ctx), name)
        row[name] = {"makespan_s": c.makespan_s, "fits": c.fits,
                     "devices": int(np.unique(c.assignment).size),
                     "peak_over_limit": (float(c.peak_bytes.max()) / limit) if limit else None,
                     "wall_s": time.perf_counter() - t}
    return row


def cell(row: dict, name: str) -> str:
    r = row[name]
    if r.get("makespan_s") is None:
        return "infeasible"
    text = f"{r['makespan_s'] / row['lower_bound_s']:.2f}"
    if not r["fits"]:
        text += "*"
    if name in ("pardnn", "pipeline") and r.get("devices") != row["k"]:
        text += f" ({r['devices']}d)"
    return text


def table(rows: list[dict]) -> str:
    head = ("| family | nodes | K | 1 device | " + " | ".join(COLUMNS)
            + " | pardnn wall (s) |\n|---|---:|---:|---:|" + "---:|" * (len(COLUMNS) + 1))
    lines = [head]
    for row in rows:
        one = f"{row['one_device_s'] / row['lower_bound_s']:.2f}" + (
            "" if row["one_device_fits"] else "*")
        wall = row["pardnn"].get("wall_s")
        wall_text = f"{wall:.2f}" if wall is not None else "-"
        lines.append(f"| {row['family']} | {row['nodes']:,} | {row['k']} | {one} | "
                     + " | ".join(cell(row, c) for c in COLUMNS) + f" | {wall_text} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--microbatches", type=int, default=1)
    args = ap.parse_args(argv)
    sizes = [2_000] if args.quick else [2_000, 20_000]
    ks = [4] if args.quick else [2, 4, 8]
    out: dict[str, list[dict]] = {}
    for label, memory in (("unlimited", None), ("limit 1.2x", 1.2)):
        rows = []
        for nodes in sizes:
            for family in FAMILIES:
                for k in ks:
                    row = one_case(family, nodes, k, memory, args.microbatches)
                    rows.append(row)
                    print(f"[{label}] {family:11s} {row['nodes']:>7,d} K={k}: "
                          + ", ".join(f"{c} {cell(row, c)}" for c in COLUMNS), flush=True)
        out[label] = rows
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = ("_quick" if args.quick else "") + (
        f"_m{args.microbatches}" if args.microbatches != 1 else "")
    (RESULTS / f"plan_quality{suffix}.json").write_text(json.dumps(out, indent=1))
    md = [f"Makespan / lower bound (emulated, {args.microbatches} micro-batch(es)); "
          "`*` = does not fit the limit; `(nd)` = the plan uses n devices.\n"]
    for label, rows in out.items():
        md += [f"\n### Memory: {label}\n", table(rows)]
    (RESULTS / f"plan_quality{suffix}.md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
