"""GEMS replicas (MAST, MASTER) planned by the search on the graph generators: the simulated
iteration of each plan, with the placement the replicas were built from, and whether the
fastest single copy was the one replicated (the search also replicates the placement whose
replicas' compute on the busiest device is least, and keeps the faster: docs/planning.md).

4 devices; 16 GB/s and 25 us, or A100s at 300 GB/s and 5 us; no memory cap; the graph is one
micro-batch per replica. Compare two trees by running each (``PYTHONPATH=/tmp/prev:.`` for the
other) and reading both tables.

    PYTHONPATH=. .venv/bin/python benchmarks/replica_plans.py
    PYTHONPATH=. .venv/bin/python benchmarks/replica_plans.py --nodes 10000 --families nas rnn

Writes ``benchmarks/results/replica_plans.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import outcore
from outcore.graph.generators import make

LINKS = {"300GB/s": {"device": "a100", "bandwidth": "300GB/s", "latency": "5us"},
         "16GB/s": {"bandwidth": "16GB/s"}}
RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--families", nargs="+",
                    default=["transformer", "nas", "rnn", "unet", "resnet"])
    args = ap.parse_args()
    rows = []
    for family in args.families:
        g = make(family, args.nodes)
        for mode in ("mast", "master"):
            for link, cluster in LINKS.items():
                req = outcore.plan_request(4, None, parallel=mode, **cluster)
                t = time.perf_counter()
                p = outcore.plan(g, req)
                planned = time.perf_counter() - t
                alt = [n for n in p.notes if n.startswith("replicas:")]
                row = {"family": family, "nodes": g.num_nodes, "mode": mode, "link": link,
                       "replicas": p.layout.replicas, "strategy": p.strategy,
                       "iteration_s": p.predicted["iteration_s"], "planned_s": planned,
                       "note": alt[0] if alt else ""}
                rows.append(row)
                print(f"{family:11s} {mode:6s} {link:7s}: {row['replicas']} replicas of "
                      f"{p.strategy:10s} {row['iteration_s'] * 1e3:9.3f} ms (planned in "
                      f"{planned:.1f} s) {row['note'][:90]}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "replica_plans.json").write_text(json.dumps(rows, indent=1))
    lines = ["| family | nodes | mode | link | replicas of | simulated |",
             "| --- | ---: | --- | --- | --- | ---: |"]
    lines += [f"| {r['family']} | {r['nodes']:,} | {r['mode']} | {r['link']} | "
              f"{r['replicas']} x {r['strategy']} | {r['iteration_s'] * 1e3:.3f} ms |"
              for r in rows]
    (RESULTS / "replica_plans.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / 'replica_plans.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
