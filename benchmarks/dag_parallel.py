"""DAG parallelism with a fine placement: multi-branch cells on 1, 2 (and 4) workers.

The model (``branches`` below, also usable as ``benchmarks/dag_parallel.py:branches``) is a stack
of ``cells`` cells; each cell runs ``branches`` independent chains of ``depth`` Linear + Tanh
layers on the same input and sums them (SUPER's multi-branch cells, ParDNN's independent paths).
The placement puts branch ``b`` of every cell on worker ``b % K`` and the stem, the sums and the
head on worker 0, so the branches of a cell run concurrently and every cell costs one message
out and one back per remote branch (per direction). Each layer is profiled here (``costs=
profile``, one thread), the plan is simulated on this job's local cluster
(``outcore.runtime.local_cluster``: same-host link latency, per-piece and per-message costs
probed) and trained on K local workers; the script prints, per K, the median step, the
measured speedup over 1 worker and the simulator's.

    PYTHONPATH=. .venv/bin/python benchmarks/dag_parallel.py --workers 1 2 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).with_name("results")


def branches(width: int = 256, cells: int = 2, branches: int = 4, depth: int = 3,
             batch: int = 64, classes: int = 10):
    """The multi-branch model and an example input (``batch`` x ``width``)."""
    import torch
    from torch import nn

    class Cell(nn.Module):
        def __init__(self):
            super().__init__()
            self.branches = nn.ModuleList(
                nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width),
                                                                  nn.Tanh())])
                for _ in range(branches))

        def forward(self, x):
            out = self.branches[0](x)
            for b in self.branches[1:]:
                out = out + b(x)
            return out

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Linear(width, width)
            self.cells = nn.Sequential(*[Cell() for _ in range(cells)])
            self.head = nn.Linear(width, classes)

        def forward(self, x):
            return self.head(self.cells(self.stem(x)))

    torch.manual_seed(0)
    return Net(), torch.randn(batch, width)


def placement(g, workers: int):
    """Branch ``b`` of every cell on worker ``b % workers``; everything else on worker 0."""
    import re

    import numpy as np
    out = np.zeros(g.num_nodes, dtype=np.int64)
    for i in range(g.num_nodes):
        m = re.search(r"branches[._](\d+)[._]", g.name_of(i))
        if m:
            out[i] = int(m.group(1)) % workers
    return out


def worker(ctx, cfg, graph_doc, plan_doc, steps):
    import torch

    from outcore.runtime.worker import build_trainer
    trainer, data = build_trainer(cfg, graph_doc, plan_doc, torch.device("cpu"))
    step_s = []
    for step in range(steps):
        inputs, targets = data.batch(step)
        if ctx.world_size > 1:
            torch.distributed.barrier()
        t0 = time.perf_counter()
        trainer.step(inputs, targets, track_memory=False)
        step_s.append(time.perf_counter() - t0)
    return {"rank": ctx.rank, "step_s": step_s[steps // 4:]}


def measure(model: str, workers: int, steps: int, batch: int, microbatches: int) -> dict:
    import outcore
    from outcore.config import TrainConfig
    from outcore.graph.io import to_dict as graph_doc
    from outcore.plan.plan import make_plan, to_dict as plan_doc
    from outcore.runtime.launch import run_local
    from outcore.runtime.local_cluster import local_cluster

    cfg = TrainConfig.make(model=model, batch_size=batch, microbatches=microbatches, steps=steps,
                           optimizer="sgd", schedule="gpipe", track_memory=False)
    g = outcore.model_graph(model, batch_size=batch, costs="profile", threads=1,
                            split=microbatches)
    a = placement(g, workers)
    cluster = local_cluster(workers, True)
    p = make_plan(g, a, strategy="manual", devices=workers, memory_bytes=None,
                  microbatches=microbatches, schedule="gpipe", cluster=cluster)
    sim = outcore.simulate(p, g, cluster=cluster)
    res = run_local(worker, workers, (cfg, graph_doc(g), plan_doc(p), steps), timeout_s=300,
                    threads=1)
    return {"workers": workers, "median_step_s": statistics.median(res[0]["step_s"]),
            "predicted_step_s": sim.iteration_s, "pieces": sim.to_dict()["pieces"],
            "transfers": sim.to_dict()["transfers"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--model", default=f"{__file__}:branches")
    ap.add_argument("--out", default=None, help="results JSON (default: results/)")
    args = ap.parse_args()
    rows = [measure(args.model, k, args.steps, args.batch, args.microbatches)
            for k in sorted(set(args.workers) | {1})]
    base, pred_base = rows[0]["median_step_s"], rows[0]["predicted_step_s"]
    print(f"multi-branch cells, batch {args.batch}, {args.microbatches} micro-batch(es), "
          f"load {os.getloadavg()[0]:.1f}")
    print("workers | pieces | transfers | median step | speedup | predicted step | predicted "
          "speedup")
    for r in rows:
        print(f"{r['workers']:7d} | {r['pieces']:6d} | {r['transfers']:9d} | "
              f"{r['median_step_s'] * 1e3:8.2f} ms | {base / r['median_step_s']:6.2f}x | "
              f"{r['predicted_step_s'] * 1e3:11.2f} ms | "
              f"{pred_base / r['predicted_step_s']:6.2f}x")
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / "dag_parallel.json"
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
