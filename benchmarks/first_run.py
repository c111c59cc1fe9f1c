"""A newcomer's first ``outcore train`` on a machine whose numba cache is empty, and the run after.

Each way starts from its own empty numba cache (``NUMBA_CACHE_DIR``) and runs the same command
(the embedded default job unless other ``outcore train`` arguments follow ``--``):

- ``always``: every kernel compiled on first use (``OUTCORE_JIT=always``, numba's own way);
- ``auto``: the default, kernels run as Python until compiling pays; then, once the background
  compile it started has finished, ``auto, next run`` on the same cache;
- ``never``: plain Python throughout (``OUTCORE_JIT=never``).

Wall seconds of the whole command (set-up, capture, profile, plan, workers, steps).

    PYTHONPATH=. .venv/bin/python benchmarks/first_run.py [--repeats 1] [-- TRAIN ARGS]

Writes ``benchmarks/results/first_run.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from outcore.graph import jit_warm

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]


def train_s(cache: Path, mode: str, args: list[str], run_dir: Path) -> float:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), OUTCORE_JIT=mode, TMPDIR=str(cache.parent),
               PYTHONPATH=str(ROOT))
    env.pop("OUTCORE_JIT_WARM", None)
    env.pop("OUTCORE_NO_JIT", None)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "outcore.cli.main", "train", *args, "--run-dir",
                    str(run_dir)], env=env, check=True, timeout=1800, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def wait_for_warm_up(cache: Path, timeout_s: float = 900.0) -> float:
    """Seconds until no background compile for ``cache`` runs any more."""
    t = time.perf_counter()
    while time.perf_counter() - t < timeout_s:
        if not jit_warm.running(str(cache)):
            return time.perf_counter() - t
        time.sleep(0.5)
    raise TimeoutError(f"the background compile for {cache} ran past {timeout_s:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("train_args", nargs="*", help="after --: outcore train arguments")
    args = ap.parse_args()
    runs: dict[str, list[float]] = {"always": [], "auto": [], "auto, next run": [], "never": [],
                                    "background compile": []}
    for _ in range(args.repeats):
        for mode in ("always", "auto", "never"):
            with tempfile.TemporaryDirectory(prefix="outcore_first_run_") as tmp:
                cache = Path(tmp) / "numba"
                runs[mode].append(train_s(cache, mode, args.train_args, Path(tmp) / "run1"))
                print(f"{mode}: {runs[mode][-1]:.1f} s", flush=True)
                if mode == "auto":
                    runs["background compile"].append(wait_for_warm_up(cache))
                    runs["auto, next run"].append(
                        train_s(cache, mode, args.train_args, Path(tmp) / "run2"))
                    print(f"auto, next run: {runs['auto, next run'][-1]:.1f} s (after "
                          f"{runs['background compile'][-1]:.1f} s more of background compile)",
                          flush=True)
    med = {k: statistics.median(v) for k, v in runs.items() if v}
    command = "outcore train " + " ".join(args.train_args or ["(the embedded default job)"])
    lines = [f"{command}, empty numba cache, medians of {args.repeats}:", "",
             "| way | wall s | vs always |", "| --- | ---: | ---: |"]
    lines += [f"| {k} | {v:.1f} | " + ("-" if k == "background compile" else
                                        f"{v / med['always']:.2f}x") + " |"
              for k, v in med.items()]
    print("\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "first_run.json").write_text(json.dumps({"command": command, "runs": runs,
                                                        "median_s": med}, indent=1))
    (RESULTS / "first_run.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
