"""How many simulations the planner's choice of memory policies takes, and how fast the plan
it returns is (``outcore.search.memory_policy.choose_simulated``): the generators' graphs
split into contiguous stages with no memory limit, then fitted under a limit of ``cap`` x the
fair share (one device's footprint / devices), 16 GB/s links.

    PYTHONPATH=. .venv/bin/python benchmarks/policy_search.py
    PYTHONPATH=. .venv/bin/python benchmarks/policy_search.py --families rnn --nodes 1000

Compare two trees as an A/B (``PYTHONPATH=/tmp/old:.`` for the other). Cases where no policy
fits print ``refused``. Writes ``benchmarks/results/policy_search.json``.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import statistics
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def one(family: str, nodes: int, devices: int, microbatches: int, cap: float) -> dict:
    import outcore
    from outcore.errors import InfeasibleError
    from outcore.graph.generators import make
    from outcore.placers import placements
    from outcore.placers.context import make_context
    from outcore.plan import make_plan
    from outcore.search.memory_policy import choose_simulated

    g = make(family, nodes)
    one_device = float(make_context(g, 1).memory(np.zeros(g.num_nodes, np.int64)).max())
    req = outcore.plan_request(devices, cap * one_device / devices, bandwidth="16GB/s",
                               microbatches=microbatches)
    split = placements(g, devices, strategy="contiguous", cluster=req.cluster.slots(1),
                       optimizer=req.optimizer, microbatches=microbatches)[0]
    plan = make_plan(g, split.assignment, strategy="contiguous", devices=devices,
                     memory_bytes=req.memory_bytes, microbatches=microbatches,
                     cluster=req.cluster)
    sim_module = importlib.import_module("outcore.sim.simulate")
    real, count = sim_module.simulate, [0]

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    sim_module.simulate = counted
    t = time.perf_counter()
    try:
        _, sim = choose_simulated(g, plan, cluster=req.cluster, checked=False)
        out = {"iteration_s": sim.iteration_s, "fits": bool(sim.fits)}
    except InfeasibleError:
        out = {"iteration_s": None, "fits": False}
    finally:
        sim_module.simulate = real
    return {"family": family, "nodes": nodes, "devices": devices,
            "microbatches": microbatches, "cap": cap, "simulations": count[0],
            "seconds": time.perf_counter() - t, **out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=["rnn", "transformer"])
    ap.add_argument("--nodes", nargs="+", type=int, default=[300, 600, 1000])
    ap.add_argument("--devices", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--microbatches", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--caps", nargs="+", type=float, default=[1.0, 1.25])
    args = ap.parse_args()
    rows = []
    for family, n, k, m, cap in itertools.product(args.families, args.nodes, args.devices,
                                                  args.microbatches, args.caps):
        r = one(family, n, k, m, cap)
        rows.append(r)
        what = f"{r['iteration_s'] * 1e3:9.2f} ms" if r["fits"] else "  refused"
        print(f"{family:11s} {n:5d} nodes, {k} devices, {m} micro-batches, cap {cap}: "
              f"{r['simulations']:3d} simulations ({r['seconds']:5.1f} s), {what}", flush=True)
    fitted = [r for r in rows if r["fits"]]
    if fitted:
        print(f"fitted {len(fitted)} of {len(rows)}: {sum(r['simulations'] for r in fitted)} "
              f"simulations, median {statistics.median(r['simulations'] for r in fitted)}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "policy_search.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
