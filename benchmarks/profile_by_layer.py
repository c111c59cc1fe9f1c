"""Profiling layer by layer against the whole-model profile: host memory, time, and the costs
each gives (``outcore.cost.profile_layers``).

Each way runs in a fresh process (its peak resident memory is its own): ``model_graph(MODEL,
costs="profile")`` builds the model with its weights and times every layer inside whole
training steps (and Adam's step); ``costs="profile-by-layer"`` builds it without weights and
times one layer at a time, identical layers once. Printed: wall time, peak RSS, layers timed
and reused, the sum of the layers' forward + backward times, and the whole profile's timed
training step for reference.

    PYTHONPATH=. .venv/bin/python benchmarks/profile_by_layer.py
    PYTHONPATH=. .venv/bin/python benchmarks/profile_by_layer.py --model outcore:transformer

Writes ``benchmarks/results/profile_by_layer.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = ("hf:llama:hidden_size=512,intermediate_size=1376,num_hidden_layers=16,"
         "num_attention_heads=8,num_key_value_heads=8,vocab_size=8000,seq=128")
MiB = 2**20


def _one(model: str, costs: str, out) -> None:
    import torch
    torch.set_num_threads(1)
    import outcore
    t0 = time.perf_counter()
    g = outcore.model_graph(model, batch_size=1, costs=costs, repeat=3, warmup=1)
    wall = time.perf_counter() - t0
    prof = g.meta["profile"]
    out.put({"costs": costs, "wall_s": wall,
             "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
             "param_bytes": float(g.total_param_bytes), "nodes": g.num_nodes,
             "timed": prof.get("timed", g.num_nodes), "reused": prof.get("reused", 0),
             "sum_s": float(g.fwd_s.sum() + g.bwd_s.sum()), "step_s": prof.get("step_s")})


def run(model: str, costs: str) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_one, args=(model, costs, q))
    p.start()
    try:
        return q.get(timeout=1800)
    finally:
        p.join(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=MODEL)
    args = ap.parse_args()
    rows = [run(args.model, c) for c in ("profile", "profile-by-layer")]
    lines = ["| costs | wall | peak RSS | layers timed / reused | sum of layers | timed step |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        step = f"{r['step_s'] * 1e3:.1f} ms" if r["step_s"] else "-"
        lines.append(f"| {r['costs']} | {r['wall_s']:.1f} s | {r['peak_rss_bytes'] / MiB:.0f} MiB"
                     f" | {r['timed']} / {r['reused']} | {r['sum_s'] * 1e3:.1f} ms | {step} |")
    print(f"{args.model}: {rows[0]['nodes']} nodes, parameters "
          f"{rows[0]['param_bytes'] / MiB:.0f} MiB")
    print("\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "profile_by_layer.json").write_text(json.dumps({"model": args.model,
                                                               "rows": rows}, indent=1))
    (RESULTS / "profile_by_layer.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
