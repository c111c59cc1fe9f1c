"""Profile the 2-worker alternating chain: cProfile around ``trainer.step`` on both
ranks, own time grouped into gloo waits, gloo isend/irecv calls, outcore's Python, autograd and
the rest, per step.

    .venv/bin/python benchmarks/piece_profile.py 64 20 1     # layers, steps, profile on
"""
import cProfile
import pstats
import statistics
import sys
import time


def worker(ctx, cfg, graph_doc, plan_doc, steps, profile):
    import torch

    from outcore.runtime.worker import build_trainer
    trainer, data = build_trainer(cfg, graph_doc, plan_doc, torch.device("cpu"))
    step_s = []
    pr = cProfile.Profile()
    for step in range(steps):
        inputs, targets = data.batch(step)
        torch.distributed.barrier()
        if profile and step >= 5:
            pr.enable()
        t0 = time.perf_counter()
        trainer.step(inputs, targets, trace=False, track_memory=False)
        step_s.append(time.perf_counter() - t0)
        if profile and step >= 5:
            pr.disable()
    st = pstats.Stats(pr)
    groups = {}
    for (fname, line, func), (cc, nc, tt, ct, callers) in st.stats.items():
        if "outcore/" in fname:
            g = "outcore python"
        elif func in ("send", "recv", "wait", "allreduce") or "c10d" in func:
            g = "c10d " + func
        elif "distributed_c10d" in fname:
            g = "torch.distributed python"
        elif func.startswith("run_backward"):
            g = "autograd engine"
        elif "autograd" in fname:
            g = "autograd python"
        else:
            g = "other"
        groups[g] = groups.get(g, 0.0) + tt
    n = steps - 5
    return statistics.median(step_s[5:]), {k: v / n for k, v in groups.items()}


if __name__ == "__main__":
    import outcore
    from outcore.config import TrainConfig
    from outcore.graph.io import to_dict as gd
    from outcore.plan.plan import to_dict as pd
    from outcore.runtime.launch import run_local
    layers, steps, prof = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    model = f"outcore:mlp:layers={layers},width=16"
    cfg = TrainConfig.make(model=model, batch_size=8, microbatches=1, steps=steps, optimizer="sgd")
    g = outcore.model_graph(model, batch_size=8, costs="estimate:cpu")
    p = outcore.plan(g, 2, strategy="round-robin", optimizer="sgd", device="cpu")
    res = run_local(worker, 2, (cfg, gd(g), pd(p), steps, prof), timeout_s=120, threads=1)
    import os
    print("load", os.getloadavg())
    for r, (med, groups) in enumerate(res):
        print("rank", r, f"median step {med*1e3:.1f} ms; per step (profiled), ms:",
              ", ".join(f"{k} {v*1e3:.1f}"
                        for k, v in sorted(groups.items(), key=lambda kv: -kv[1])))
