"""Seconds from ``run_local`` to every worker having joined the process group and returned, 2
and 4 workers, three ways in turn: forked from a fork server started for the launch and stopped
after it (the default: one import of torch per launch), forked from a server kept between
launches (``launch.KEEP_FORK_SERVER``, as the test suite runs), and spawned
(``OUTCORE_START=spawn``: one import per worker).

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

from outcore.runtime import launch
from outcore.runtime.launch import run_local

RESULTS = Path(__file__).resolve().parent / "results"


def joined(ctx) -> int:
    """Worker: joining the group (``run_local`` did), importing what a training worker runs
    (``outcore train``'s workers run ``outcore.runtime.worker.train_worker``), answering."""
    import outcore.runtime.worker  # noqa: F401
    return ctx.rank


def launch_s(way: str, workers: int) -> float:
    os.environ["OUTCORE_START"] = "spawn" if way == "spawn" else "forkserver"
    launch.KEEP_FORK_SERVER = way == "kept"
    t = time.perf_counter()
    run_local(joined, workers, timeout_s=120)
    took = time.perf_counter() - t
    launch.KEEP_FORK_SERVER = False
    launch.stop_fork_server()
    if way == "kept":  # the server started by the first launch; this is the next
        launch.KEEP_FORK_SERVER = True
        run_local(joined, workers, timeout_s=120)
        t = time.perf_counter()
        run_local(joined, workers, timeout_s=120)
        took = time.perf_counter() - t
        launch.KEEP_FORK_SERVER = False
        launch.stop_fork_server()
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    args = ap.parse_args()
    rows = []
    for k in args.workers:
        times: dict[str, list[float]] = {"forkserver": [], "kept": [], "spawn": []}
        for _ in range(args.repeats):
            for way in times:
                times[way].append(launch_s(way, k))
        row = {"workers": k, **{m: statistics.median(v) for m, v in times.items()},
               "runs": times}
        rows.append(row)
        print(f"{k} workers: fork server per launch {row['forkserver']:.2f} s, kept "
              f"{row['kept']:.2f} s, spawn {row['spawn']:.2f} s (medians of {args.repeats})",
              flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "worker_start.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
