"""The simulator's event loop: the compiled one (``outcore.sim.compiled``, numba) against the
plain-Python reference (``outcore.sim.engine._Engine``) on the same lowered schedules, and
whether their timelines agree (events in order, memory curves, iteration time).

Each family's graph is planned by ``outcore.plan`` (K = 4, 16 GB/s, no memory cap, the layout
fixed) with 1 and 4 micro-batches, and placed fine-grained too (blocks of 50 nodes in
topological order dealt to the 4 devices in turn: thousands of pieces, as the search's
finer candidates have); each plan is lowered
once, then each loop runs it ``--repeats`` times (the median is printed). The compiled loop's
time includes packing the schedule and reading its events back as columns; reading them one
by one as ``Event`` tuples (a Gantt chart, a trace) costs extra, shown as ``+ events``.

    PYTHONPATH=. .venv/bin/python benchmarks/engine_speed.py                 # 50k nodes
    PYTHONPATH=. .venv/bin/python benchmarks/engine_speed.py --nodes 10000 --families rnn

The first run in a fresh checkout compiles the loop (about 10 s): run twice.
Writes ``benchmarks/results/engine_speed.{json,md}``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from pathlib import Path

import numpy as np

import outcore
from outcore.graph import jit
from outcore.graph.algorithms import topological_order
from outcore.graph.generators import make
from outcore.plan import make_plan
from outcore.schedule.lower import lower
from outcore.sim.compiled import simulate_compiled
from outcore.sim.simulate import sim_options

engine = importlib.import_module("outcore.sim.engine")
RESULTS = Path(__file__).resolve().parent / "results"


def _inputs(g, p):
    """The schedule, costs, cluster and options ``simulate`` hands the event loop."""
    low = lower(g, p, checked=False)
    return low.schedule, low.costs, low.cluster, sim_options(p, g, low)


def _median_s(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def one(family: str, nodes: int, microbatches: int, repeats: int, dealt: bool) -> dict:
    g = make(family, nodes)
    req = outcore.plan_request(4, None, bandwidth="16GB/s", microbatches=microbatches)
    if dealt:
        a = np.empty(g.num_nodes, np.int64)
        a[topological_order(g)] = (np.arange(g.num_nodes) // 50) % 4
        p = make_plan(g, a, strategy="dealt", devices=4, memory_bytes=None,
                      microbatches=microbatches, cluster=req.cluster)
    else:
        p = outcore.plan(g, req)
    args = _inputs(g, p)
    ref_s, ref = _median_s(lambda: engine._Engine(*args).run(), repeats)
    new_s, new = _median_s(lambda: simulate_compiled(*args), repeats)
    t = time.perf_counter()
    same = (ref.iteration_s == new.iteration_s and ref.events == new.events and
            all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                for a, b in zip(ref.memory, new.memory)))
    events_s = time.perf_counter() - t  # (reading the compiled events, and comparing)
    return {"family": family, "placement": p.strategy, "nodes": g.num_nodes,
            "microbatches": p.microbatches,
            "actions": sum(map(len, args[0].actions)), "reference_s": ref_s,
            "compiled_s": new_s, "events_and_compare_s": events_s, "same": same}


def main() -> int:
    jit.compile_always()  # the compiled kernels' speed is measured
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--families", nargs="+", default=["rnn", "nas", "transformer"])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for family in args.families:
        for mb, dealt in [(mb, d) for d in (False, True) for mb in args.microbatches]:
            r = one(family, args.nodes, mb, args.repeats, dealt)
            rows.append(r)
            print(f"{family:11s} {r['placement']:10s} {r['nodes']:>7,d} nodes, "
                  f"{r['microbatches']} micro-batch(es), "
                  f"{r['actions']:>7,d} actions: reference {r['reference_s']:.3f} s, compiled "
                  f"{r['compiled_s']:.3f} s ({r['reference_s'] / r['compiled_s']:.1f}x; + events "
                  f"and comparing {r['events_and_compare_s']:.3f} s); identical: {r['same']}",
                  flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "engine_speed.json").write_text(json.dumps(rows, indent=1))
    lines = ["| family | placement | nodes | micro-batches | actions | reference | compiled | "
             "ratio | identical |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['family']} | {r['placement']} | {r['nodes']:,} | {r['microbatches']} | "
              f"{r['actions']:,} | "
              f"{r['reference_s']:.3f} s | {r['compiled_s']:.3f} s | "
              f"{r['reference_s'] / r['compiled_s']:.1f}x | {r['same']} |" for r in rows]
    (RESULTS / "engine_speed.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / 'engine_speed.md'}")
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
