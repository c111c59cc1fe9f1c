"""Seconds from ``run_local`` to every worker having joined the process group and returned,
with workers forked from the fork server (the default) against spawned ones
(``OUTCORE_START=spawn``), alternating, 2 and 4 workers; the first fork-server launch of the
process (which starts the server and imports torch there) is reported on its own.

    PYTHONPATH=. .venv/bin/python benchmarks/worker_start.py --repeats 5

Writes ``benchmarks/results/worker_start.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from outcore.runtime.launch import run_local

RESULTS = Path(__file__).resolve().parent / "results"


def joined(ctx) -> int:
    """Worker: nothing but joining the group (``run_local`` did) and answering."""
    return ctx.rank


def launch_s(method: str, workers: int) -> float:
    os.environ["OUTCORE_START"] = method
    t = time.perf_counter()
    run_local(joined, workers, timeout_s=120)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    args = ap.parse_args()
    first = launch_s("forkserver", 2)
    print(f"first fork-server launch (starts the server): {first:.2f} s", flush=True)
    rows = []
    for k in args.workers:
        times: dict[str, list[float]] = {"forkserver": [], "spawn": []}
        for _ in range(args.repeats):
            for method in times:
                times[method].append(launch_s(method, k))
        row = {"workers": k, **{m: statistics.median(v) for m, v in times.items()},
               "runs": times}
        rows.append(row)
        print(f"{k} workers: fork server {row['forkserver']:.2f} s, spawn {row['spawn']:.2f} s "
              f"(medians of {args.repeats}; {row['spawn'] / row['forkserver']:.0f}x)",
              flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "worker_start.json").write_text(json.dumps({"first_s": first, "rows": rows},
                                                          indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
