"""The search (``outcore.plan``, strategy auto) against the trivial split, judged by outcore's
own simulator: a generated graph on 4 devices, memory capped at 1.25 x the fair share
(one device's footprint / 4) unless ``--no-memory``; the trivial split is a topological order cut
into 4 parts of equal memory (4 x parameters + saved activations).

    .venv/bin/python benchmarks/search_vs_trivial.py unet 16GB/s 10000
    .venv/bin/python benchmarks/search_vs_trivial.py rnn 150GB/s 10000 --no-memory
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import outcore
from outcore.errors import InfeasibleError
from outcore.graph.algorithms import topological_order
from outcore.graph.generators import make
from outcore.placers.context import make_context
from outcore.plan import make_plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family", help="unet, rnn, resnet, nas, transformer, chain")
    ap.add_argument("bandwidth", help="e.g. 16GB/s")
    ap.add_argument("nodes", type=int, nargs="?", default=10_000)
    ap.add_argument("--no-memory", action="store_true", help="no memory cap")
    args = ap.parse_args()
    g = make(args.family, args.nodes)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    mem = None if args.no_memory else 1.25 * one / 4
    order = topological_order(g)
    w = (g.param_bytes * 4 + g.saved_bytes + 0.0)[order]
    parts = np.minimum((np.cumsum(w) / w.sum() * 4).astype(int), 3)
    a = np.empty(g.num_nodes, dtype=np.int64)
    a[order] = parts
    req = outcore.plan_request(4, mem, bandwidth=args.bandwidth)
    trivial = outcore.simulate(make_plan(g, a, strategy="trivial", devices=4, memory_bytes=mem,
                                         cluster=req.cluster), g)
    print(f"{args.family} {args.bandwidth} {g.num_nodes} nodes: trivial "
          f"{trivial.iteration_s:.4f} s, fits {trivial.fits}")
    t = time.perf_counter()
    try:
        p = outcore.plan(g, req)
    except InfeasibleError as e:
        print(f"auto: no plan ({e}) after {time.perf_counter() - t:.1f} s")
        return 1
    it = p.predicted["iteration_s"]
    print(f"auto: {p.strategy} {it:.4f} s ({it / trivial.iteration_s:.2f}x trivial), planned "
          f"in {time.perf_counter() - t:.1f} s")
    for line in p.notes:
        print("  ", line[:160])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
