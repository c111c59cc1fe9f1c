"""Wall time of the whole ``auto`` search (``outcore.plan``) on a generated graph, after the
graph is built, with a memory cap: K = 4, 16 GB/s, the cap a multiple of the fair share
(one device's footprint / 4; 1.25 leaves room, 1.0 needs memory policies).

    PYTHONPATH=. .venv/bin/python benchmarks/search_speed.py transformer 50000 1.25
    PYTHONPATH=. .venv/bin/python benchmarks/search_speed.py transformer 50000 1.0 --profile
    PYTHONPATH=. .venv/bin/python benchmarks/search_speed.py transformer 50000 1.25 --layouts

``--layouts`` opens the layout as ``outcore plan GRAPH --layout auto`` does (data parallelism,
GEMS mode, micro-batches, tensor-parallel degree and sharding: ``tp`` and ``depth`` left to the
search).

The process keeps freed memory in its heap, as ``outcore plan`` does
(``outcore.api.keep_freed_memory``); ``--library-heap`` leaves glibc's default, as
``outcore.plan`` called from a user's program has it.

The first run in a fresh checkout compiles the numba kernels (about a minute): run twice.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

import numpy as np

import outcore
from outcore.graph import jit
from outcore.graph.generators import make
from outcore.placers.context import make_context


def main() -> int:
    jit.compile_always()  # the compiled kernels' speed is measured
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family", help="unet, rnn, resnet, nas, transformer, chain")
    ap.add_argument("nodes", type=int)
    ap.add_argument("cap", type=float, help="memory cap as a multiple of the fair share")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--layouts", action="store_true",
                    help="the search also chooses dp, GEMS mode, micro-batches, the "
                         "tensor-parallel degree and sharding (as `outcore plan --layout auto`)")
    ap.add_argument("--profile", action="store_true", help="print the 30 costliest calls")
    ap.add_argument("--library-heap", action="store_true",
                    help="leave the allocator's default (outcore plan keeps freed memory)")
    args = ap.parse_args()
    if not args.library_heap:
        outcore.api.keep_freed_memory()  # as `outcore plan` runs the search
    g = make(args.family, args.nodes)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    req = outcore.plan_request(args.devices, args.cap * one / args.devices,
                               bandwidth="16GB/s",
                               search_layout=args.layouts,
                               **({"tp": None, "depth": None} if args.layouts else {}))
    g.succ_ptr, g.pred_ptr  # adjacency built as a graph reader would
    prof = cProfile.Profile() if args.profile else None
    t = time.perf_counter()
    if prof:
        prof.enable()
    p = outcore.plan(g, req)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t
    print(f"{args.family} {g.num_nodes} nodes, cap {args.cap} x fair share, K = "
          f"{args.devices}: planned in {wall:.2f} s; {p.strategy}, "
          f"{p.predicted['iteration_s'] * 1e3:.2f} ms per iteration")
    for line in p.notes:
        print("  ", line[:150])
    if prof:
        # SORT=tottime TOP=40 ... --profile: other orders and lengths
        pstats.Stats(prof).sort_stats(os.environ.get("SORT", "cumulative")).print_stats(
            int(os.environ.get("TOP", "30")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
