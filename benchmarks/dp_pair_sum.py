"""Data parallelism on two local CPU workers: gradient sums over the same-host link against
gloo's all-reduce, for the collective alone and for training steps.

1. **The collective**: two processes sum a tensor of each size 25 times (5 discarded), after a
   barrier each time: gloo's ``all_reduce`` against :class:`outcore.core.comm.PairSum` over
   a :class:`outcore.core.samehost.SameHostLinks` pair (what the runtime does for a bucket
   of two workers). Median, fastest and slowest, milliseconds.
2. **Training**: ``outcore.train(model, 2, dp=2)`` with profiled costs, ``OUTCORE_P2P=auto``
   (sums over the link) and ``gloo`` alternating for ``--rounds`` rounds; the median measured
   step beside the simulator's prediction for each.

    PYTHONPATH=. .venv/bin/python benchmarks/dp_pair_sum.py
    PYTHONPATH=. .venv/bin/python benchmarks/dp_pair_sum.py --models hf:bert --rounds 3

Writes ``benchmarks/results/dp_pair_sum.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SIZES_KIB = (16, 64, 256, 1024, 4096, 16384)
MODELS = ("outcore:mlp", "outcore:transformer:layers=2,d_model=32,heads=2,seq=16,vocab=64",
          "hf:bert")


def _collective(ctx, sizes: list[int], reps: int) -> dict:
    import torch
    import torch.distributed as dist

    from outcore.core.comm import PairSum
    from outcore.core.samehost import connect_same_host

    peer = 1 - ctx.rank
    links = connect_same_host([peer], timeout_s=60.0)

    out = {}
    for kib in sizes:
        t = torch.ones(kib * 256)
        times: dict[str, list[float]] = {"gloo": [], "link": []}
        for k in range(reps + 5):
            for how in ("gloo", "link"):
                part = t.clone()  # both sum in place; the copy is not timed
                dist.barrier()
                t0 = time.perf_counter()
                if how == "gloo":
                    dist.all_reduce(part)
                else:
                    PairSum.start(links, peer, part, 1, "benchmark").wait()
                if k >= 5:
                    times[how].append(time.perf_counter() - t0)
        out[kib] = {h: (statistics.median(v), min(v), max(v)) for h, v in times.items()}
    links.close()
    return out


def collective(reps: int) -> dict:
    from outcore.runtime.launch import run_local
    results = run_local(_collective, 2, (list(SIZES_KIB), reps), timeout_s=600)
    return results[0]


def training(models: list[str], rounds: int, steps: int) -> list[dict]:
    import outcore
    rows = []
    for model in models:
        for rnd in range(rounds):
            for transport in ("auto", "gloo"):
                os.environ["OUTCORE_P2P"] = transport
                with tempfile.TemporaryDirectory() as run:
                    r = outcore.train(model, 2, dp=2, microbatches=1, batch_size=8, steps=steps,
                                      costs="profile", run_dir=run, timeout=600)
                rows.append({"model": model, "round": rnd, "transport": transport,
                             "measured_s": r.median_step_s,
                             "predicted_s": r.predicted["iteration_s"]})
                print(f"{model} round {rnd} {transport:4s}: measured "
                      f"{r.median_step_s * 1e3:.2f} ms, predicted "
                      f"{r.predicted['iteration_s'] * 1e3:.2f} ms", flush=True)
    os.environ.pop("OUTCORE_P2P", None)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    coll = collective(args.reps)
    for kib, row in coll.items():
        print(f"{kib:6d} KiB: " + "   ".join(
            f"{h} median {m * 1e3:6.3f} ms (min {lo * 1e3:.3f}, max {hi * 1e3:.3f})"
            for h, (m, lo, hi) in row.items()), flush=True)
    rows = training(args.models, args.rounds, args.steps) if args.models else []
    for model in args.models:
        for transport in ("auto", "gloo"):
            got = [r for r in rows if r["model"] == model and r["transport"] == transport]
            m = statistics.median(r["measured_s"] for r in got)
            p = statistics.median(r["predicted_s"] for r in got)
            print(f"{model}: {transport:4s} median of rounds: measured {m * 1e3:.2f} ms, "
                  f"predicted {p * 1e3:.2f} ms ({p / m - 1:+.0%})")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "dp_pair_sum.json").write_text(json.dumps(
        {"collective": {str(k): v for k, v in coll.items()}, "training": rows}, indent=1))
    print(f"wrote {RESULTS / 'dp_pair_sum.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
