"""The search (``outcore.plan``, strategy auto) against the lower bound on graphs with DAG
parallelism at NVLink-class links (the aim: within 1.2x of the lower bound).

For each family and size: 4 A100s (``a100`` preset: its runtime cost per piece overlaps the
device's work) joined by 300 GB/s, 5 us links (NVLink 3), no memory cap, one micro-batch; the
ratio is the simulated iteration of ``auto``'s plan over the planner's lower bound, max(critical
path of forward + backward, total work / devices). The bound counts no communication, so where
moving an activation costs more than the work it would parallelize (the ``nas`` cells: a 16 MB
activation takes 56 us at 300 GB/s, the op it feeds ~35 us) no plan comes near it.

    PYTHONPATH=. .venv/bin/python benchmarks/search_vs_bound.py                  # 10k nodes
    PYTHONPATH=. .venv/bin/python benchmarks/search_vs_bound.py --nodes 3000 10000 50000
    PYTHONPATH=. .venv/bin/python benchmarks/search_vs_bound.py --layouts

With ``--layouts`` the search also chooses the layout (data parallelism, GEMS replicas,
micro-batches of the generator's batch), and the bound is the lowest over every layout it
enumerates (each layout's: its total work, with a node's launch cost paid once per run of the
model, over the devices, or one micro-batch's critical path): no layout can beat it.

Writes ``benchmarks/results/search_vs_bound.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import outcore
from outcore.graph.generators import make

FAMILIES = ("rnn", "nas", "transformer")
RESULTS = Path(__file__).resolve().parent / "results"


def one(family: str, nodes: int, devices: int, layouts: bool = False) -> dict:
    g = make(family, nodes)
    open_layout = {"microbatches": "auto", "search_layout": True} if layouts else {}
    req = outcore.plan_request(devices, None, device="a100", bandwidth="300GB/s", latency="5us",
                               **open_layout)
    t = time.perf_counter()
    p = outcore.plan(g, req)
    planned = time.perf_counter() - t
    it, lb = p.predicted["iteration_s"], p.predicted["lower_bound_s"]
    strategy = p.strategy
    if layouts:
        mesh = p.layout.describe() or "dp 1"
        strategy = f"{p.strategy}; {mesh}; {p.microbatches} x {p.graph['batch_size']} samples"
    return {"family": family, "nodes": g.num_nodes, "devices": devices, "strategy": strategy,
            "iteration_s": it, "lower_bound_s": lb, "ratio": it / lb, "planned_s": planned}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[10_000])
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES))
    ap.add_argument("--layouts", action="store_true",
                    help="the search also chooses the layout; the bound is every layout's lowest")
    args = ap.parse_args()
    rows = []
    for nodes in args.nodes:
        for family in args.families:
            row = one(family, nodes, args.devices, args.layouts)
            rows.append(row)
            print(f"{family:11s} {row['nodes']:>7,d} nodes: {row['strategy']:10s} "
                  f"{row['iteration_s'] * 1e3:9.2f} ms, bound {row['lower_bound_s'] * 1e3:9.2f} "
                  f"ms, ratio {row['ratio']:.2f} (planned in {row['planned_s']:.1f} s)",
                  flush=True)
    RESULTS.mkdir(exist_ok=True)
    stem = "search_vs_bound" + ("_layouts" if args.layouts else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(rows, indent=1))
    lines = ["| family | nodes | plan | simulated | lower bound | ratio |",
             "| --- | ---: | --- | ---: | ---: | ---: |"]
    lines += [f"| {r['family']} | {r['nodes']:,} | {r['strategy']} | "
              f"{r['iteration_s'] * 1e3:.1f} ms | {r['lower_bound_s'] * 1e3:.1f} ms | "
              f"{r['ratio']:.2f} |" for r in rows]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / stem}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
