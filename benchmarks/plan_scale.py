"""Planner scale: wall time and peak memory of ParDNN on 10k, 100k and 1M-node graphs.

Each case runs in its own subprocess, which loads the graph from a cached ``.npz`` (made once per
family and size by ``outcore.graph.generators``), builds its adjacency, then plans with
``partition(g, K)`` (strategy ``pardnn``, flat 16 GB/s / 25 us links, no memory limit unless
``--memory``). Reported per case: planning wall time, the process's resident memory before
planning (Python + numpy + numba + the graph) and its peak (``ru_maxrss``), the emulated makespan
against the lower bound, and the devices used. A first subprocess with an empty numba cache
measures the one-off compile time, which later runs do not pay (numba caches on disk).

    .venv/bin/python benchmarks/plan_scale.py            # full run (~10 min on 2 cores)
    .venv/bin/python benchmarks/plan_scale.py --quick    # 10k and 100k, two families, K = 4

Writes ``benchmarks/results/plan_scale.json`` and ``plan_scale.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
FAMILIES = ["rnn", "resnet", "transformer", "nas", "unet"]
MILLION_FAMILIES = ["transformer", "rnn"]

CASE = r"""
import json, resource, sys, time
import numpy as np
from outcore.graph.ir import build
from outcore.placers import partition

def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

path, k, mem = sys.argv[1], int(sys.argv[2]), sys.argv[3]
z = np.load(path)
g = build("bench", fwd_s=z["fwd_s"], bwd_s=z["bwd_s"], src=z["src"], dst=z["dst"],
          edge_bytes=z["edge_bytes"], param_bytes=z["param_bytes"], out_bytes=z["out_bytes"],
          saved_bytes=z["saved_bytes"], check=False)
del z
g.succ_ptr, g.pred_ptr
before = rss_mb()
limit = None
if mem != "none":
    from outcore.placers.context import make_context
    from outcore.placers.stages import least_memory
    limit = float(mem) * least_memory(make_context(g, k), k)
t = time.perf_counter()
r = partition(g, k, memory_bytes=limit)
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall, "rss_before_mb": before, "rss_peak_mb": rss_mb(),
                  "makespan_s": r.makespan_s, "lower_bound_s": r.lower_bound_s,
                  "devices_used": r.devices_used, "nodes": g.num_nodes, "edges": g.num_edges,
                  "fits": limit is None or bool((r.peak_bytes <= limit).all())}))
"""


def graph_file(family: str, nodes: int, cache: Path) -> Path:
    path = cache / f"{family}_{nodes}.npz"
    if not path.exists():
        from outcore.graph.generators import make
        g = make(family, nodes, seed=0)
        import numpy as np
        np.savez(path, fwd_s=g.fwd_s, bwd_s=g.bwd_s, src=g.src, dst=g.dst,
                 edge_bytes=g.edge_bytes, param_bytes=g.param_bytes, out_bytes=g.out_bytes,
                 saved_bytes=g.saved_bytes)
    return path


def run_case(path: Path, k: int, memory: str, env: dict | None = None) -> dict:
    # the compiled kernels' speed is measured: every kernel compiles on first use
    env = dict(env or os.environ, OUTCORE_JIT="always")
    out = subprocess.run([sys.executable, "-c", CASE, str(path), str(k), memory],
                         capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small subset (about a minute)")
    ap.add_argument("--memory", default="none",
                    help="memory limit as a multiple of the least that fits K contiguous "
                         "stages (e.g. 1.2), or 'none'")
    ap.add_argument("--cache", default=None, help="directory for generated graphs")
    args = ap.parse_args(argv)
    cache = Path(args.cache or Path(tempfile.gettempdir()) / "outcore_plan_scale")
    cache.mkdir(parents=True, exist_ok=True)
    if args.quick:
        cases = [(f, n, 4) for f in ("rnn", "transformer") for n in (10_000, 100_000)]
    else:
        cases = [(f, n, k) for n in (10_000, 100_000) for f in FAMILIES for k in (2, 4, 8)]
        cases += [(f, 1_000_000, k) for f in MILLION_FAMILIES for k in (2, 4, 8)]
    rows = []
    # one-off compile time: a run with an empty numba cache
    first = graph_file(cases[0][0], cases[0][1], cache)
    env = dict(os.environ, NUMBA_CACHE_DIR=tempfile.mkdtemp(prefix="numba_cold_"))
    t = time.perf_counter()
    cold = run_case(first, cases[0][2], args.memory, env)
    cold_total = time.perf_counter() - t
    print(f"cold start (compiling every kernel): planning {cold.get('wall_s', float('nan')):.1f} s,"
          f" process {cold_total:.1f} s", flush=True)
    run_case(first, cases[0][2], args.memory)  # warm the normal cache
    for family, nodes, k in cases:
        path = graph_file(family, nodes, cache)
        res = run_case(path, k, args.memory)
        res.update(family=family, target_nodes=nodes, k=k)
        rows.append(res)
        if "error" in res:
            print(f"{family:12s} {nodes:>9,d} K={k}: ERROR {res['error']}", flush=True)
            continue
        print(f"{family:12s} {res['nodes']:>9,d} K={k}: {res['wall_s']:7.2f} s, "
              f"RSS {res['rss_before_mb']:.0f} -> {res['rss_peak_mb']:.0f} MB, makespan "
              f"{res['makespan_s']:.4g} s (bound {res['lower_bound_s']:.4g}), "
              f"{res['devices_used']} devices", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"memory": args.memory, "quick": args.quick, "cold_start_wall_s": cold.get("wall_s"),
            "cold_start_process_s": cold_total, "cpus": os.cpu_count()}
    suffix = "_quick" if args.quick else ""
    (RESULTS / f"plan_scale{suffix}.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                                 indent=1))
    lines = ["| family | nodes | edges | K | plan wall (s) | RSS before (MB) | RSS peak (MB) | "
             "makespan / bound | devices used |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['family']} | {r['target_nodes']:,} | | {r['k']} | error | | | | |")
            continue
        lines.append(f"| {r['family']} | {r['nodes']:,} | {r['edges']:,} | {r['k']} | "
                     f"{r['wall_s']:.2f} | {r['rss_before_mb']:.0f} | {r['rss_peak_mb']:.0f} | "
                     f"{r['makespan_s'] / r['lower_bound_s']:.3f} | {r['devices_used']} |")
    head = (f"Cold start (empty numba cache, compiles every kernel once): "
            f"{meta['cold_start_wall_s']:.1f} s of planning on the first case.\n"
            f"Memory limit: {args.memory}. Machine: {os.cpu_count()} cores, shared.\n\n")
    (RESULTS / f"plan_scale{suffix}.md").write_text(head + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
