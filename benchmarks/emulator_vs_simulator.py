"""The node-level emulator against the schedule simulator on every placement the search makes
(the search ranks placements by the emulator and simulates only the best few, so the
emulator must rank them as the simulator does).

For each generated graph (family x nodes), link (16 GB/s, 25 us: the default; 300 GB/s, 5 us
on A100s: NVLink 3) and micro-batch count: every contiguous split and every other planner's
placement on 4 devices (no memory cap), emulated plainly and with port contention
(:func:`outcore.placers.emulate.run`), then simulated (``outcore.simulate``'s engine, the
1F1B schedule). Prints each placement's ratio emulated / simulated and, per case, whether the
contended emulation puts first the placement the simulator finds fastest; the summary gives the
distribution of the ratios, which is what the search's pruning margin
(:data:`outcore.search.prune.PRUNE_RATIO`) must cover.

    PYTHONPATH=. .venv/bin/python benchmarks/emulator_vs_simulator.py
    PYTHONPATH=. .venv/bin/python benchmarks/emulator_vs_simulator.py --nodes 3000 --mbs 1

Writes ``benchmarks/results/emulator_vs_simulator.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np

import outcore
from outcore.errors import InfeasibleError
from outcore.graph.generators import make
from outcore.placers import partition, placements as offered
from outcore.placers.context import make_context
from outcore.placers.emulate import run
from outcore.plan import make_plan
from outcore.sim.simulate import simulate

RESULTS = Path(__file__).resolve().parent / "results"
LINKS = {"16GB/s": {"bandwidth": "16GB/s"},
         "300GB/s": {"device": "a100", "bandwidth": "300GB/s", "latency": "5us"}}


def placements(g, req):
    """``(name, assignment)`` of every contiguous split and every planner's placement."""
    kw = {"cluster": req.cluster, "optimizer": req.optimizer, "microbatches": req.microbatches}
    out = [("contiguous: " + (r.notes[-1].removeprefix("chose ") if r.notes else ""), r.assignment)
           for r in offered(g, 4, strategy="contiguous", **kw)]
    out += [("subgraph", r.assignment) for r in offered(g, 4, strategy="subgraph", **kw)]
    for name in ("pardnn", "pipeline"):
        try:
            out.append((name, partition(g, 4, strategy=name, **kw).assignment))
        except InfeasibleError:
            pass
    seen, unique = set(), []
    for name, a in out:
        if a.tobytes() not in seen:
            seen.add(a.tobytes())
            unique.append((name, a))
    return unique


def case(family: str, nodes: int, link: str, mbs: int) -> list[dict]:
    g = make(family, nodes)
    req = outcore.plan_request(4, None, microbatches=mbs, **LINKS[link])
    ctx = make_context(g, 4, cluster=req.cluster, optimizer=req.optimizer, microbatches=mbs)
    rows = []
    for name, a in placements(g, req):
        p = make_plan(g, a, strategy="x", devices=4, memory_bytes=None, microbatches=mbs,
                      cluster=req.cluster)  # (shared parameters placed as a plan places them)
        plain = run(ctx, p.assignment, critical_path=False).makespan_s
        contended = run(ctx, p.assignment, critical_path=False, contend=True).makespan_s
        sim = simulate(p, g, checked=False).iteration_s
        rows.append({"family": family, "nodes": g.num_nodes, "link": link, "mbs": mbs,
                     "placement": name[:60], "plain_s": plain, "contended_s": contended,
                     "simulated_s": sim})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=["rnn", "nas", "transformer", "unet",
                                                      "resnet"])
    ap.add_argument("--nodes", type=int, nargs="+", default=[3000, 10000])
    ap.add_argument("--links", nargs="+", default=list(LINKS), choices=list(LINKS))
    ap.add_argument("--mbs", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--out", default="emulator_vs_simulator")
    args = ap.parse_args()
    rows, firsts = [], []
    t0 = time.perf_counter()
    for family, nodes, link, mbs in itertools.product(args.families, args.nodes, args.links,
                                                      args.mbs):
        got = case(family, nodes, link, mbs)
        rows += got
        best_sim = min(got, key=lambda r: r["simulated_s"])
        best_est = min(got, key=lambda r: r["contended_s"])
        firsts.append(best_est["simulated_s"] / best_sim["simulated_s"])
        print(f"{family} {nodes} {link} x{mbs}: {len(got)} placements; the contended "
              f"emulation's first is {firsts[-1]:.3f}x the simulator's best "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        for r in got:
            print(f"   {r['placement']:60s} plain {r['plain_s'] / r['simulated_s']:.2f} "
                  f"contended {r['contended_s'] / r['simulated_s']:.2f} (simulated "
                  f"{r['simulated_s'] * 1e3:.1f} ms)")
    for key in ("plain_s", "contended_s"):
        q = np.array([r[key] / r["simulated_s"] for r in rows])
        print(f"{key[:-2]} / simulated over {q.size} placements: min {q.min():.2f}, median "
              f"{np.median(q):.2f}, max {q.max():.2f}")
    f = np.array(firsts)
    print(f"the contended emulation's first placement is the simulator's best in "
          f"{int((f <= 1.0).sum())} of {f.size} cases (worst {f.max():.3f}x the best)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {RESULTS / args.out}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
