"""The layout search with and without its bound across layouts
(``outcore.search.loop.BOUND_ACROSS_LAYOUTS``): each generator on 4 devices, A100s at 300 GB/s or 16
GB/s links, no cap or 1.25 x the fair share, layouts and micro-batches open. Prints both plans'
times and planning times, and any layout the bounded search pruned that, planned to the end, would
have won (none may). The bounded plan may differ and be faster: under the bound a GEMS layout
simulates fewer single copies, so the fastest of them, which is replicated too, can be another (and
replicate better). It may not be slower by more than the layouts' tie
(``outcore.search.ranking.TIE``).

    PYTHONPATH=. .venv/bin/python benchmarks/layout_bound_check.py
    PYTHONPATH=. .venv/bin/python benchmarks/layout_bound_check.py --nodes 10000 --families nas
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

import outcore
from outcore.errors import InfeasibleError
from outcore.graph.generators import make
from outcore.placers.context import make_context
from outcore.search import loop as layouts

LINKS = {"300GB/s": {"device": "a100", "bandwidth": "300GB/s", "latency": "5us"},
         "16GB/s": {"bandwidth": "16GB/s"}}
PRUNED = ("pruned: every placement", "pruned: its replicas")


def planned(g, req, bounded: bool):
    """``(plan or None, seconds)`` with the bound across layouts on or off."""
    layouts.BOUND_ACROSS_LAYOUTS = bounded
    t = time.perf_counter()
    try:
        return outcore.plan(g, req), time.perf_counter() - t
    except InfeasibleError:
        return None, time.perf_counter() - t
    finally:
        layouts.BOUND_ACROSS_LAYOUTS = True


def would_have_won(bounded, full) -> list[str]:
    """Layouts the bounded search pruned whose plan, planned to the end, beats its choice."""
    times = {r["layout"]: r.get("iteration_s") for r in full.extra["candidates"]}
    best = bounded.predicted["iteration_s"]
    return [r["layout"] for r in bounded.extra["candidates"]
            if r["outcome"].startswith(PRUNED) and times.get(r["layout"]) is not None
            and times[r["layout"]] < best * (1 - layouts.TIE)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+",
                    default=["rnn", "nas", "transformer", "unet", "resnet"])
    ap.add_argument("--nodes", type=int, default=2000)
    args = ap.parse_args()
    wrong = 0
    for family, link, cap in itertools.product(args.families, LINKS, (None, 1.25)):
        g = make(family, args.nodes)
        mem = None
        if cap:
            zeros = np.zeros(g.num_nodes, dtype=np.int64)
            mem = cap * float(make_context(g, 1).memory(zeros).max()) / 4
        req = outcore.plan_request(4, mem, microbatches="auto", search_layout=True,
                                   **LINKS[link])
        bounded, tb = planned(g, req, True)
        full, tf = planned(g, req, False)
        if bounded is None or full is None:
            print(f"{family} {link} cap {cap}: no plan (bounded {bounded is not None}, "
                  f"full {full is not None})")
            wrong += (bounded is None) != (full is None)
            continue
        tb_s, tf_s = bounded.predicted["iteration_s"], full.predicted["iteration_s"]
        verdict = "same plan" if tb_s == tf_s else "faster" if tb_s < tf_s else \
            "slower, within the tie" if tb_s <= tf_s * (1 + layouts.TIE) else "SLOWER"
        lost = would_have_won(bounded, full)
        wrong += (verdict == "SLOWER") + len(lost)
        print(f"{family} {link} cap {cap}: bounded {tb_s * 1e3:.2f} ms"
              f" in {tb:.1f} s, full {tf_s * 1e3:.2f} ms in {tf:.1f} s; {verdict}"
              + (f"; pruned but faster: {lost}" if lost else ""), flush=True)
    print("no case chose a slower plan bounded, and no pruned layout would have won"
          if not wrong else f"{wrong} case(s) lost to the bound")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
