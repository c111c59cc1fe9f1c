"""outcore's runtime against torch.distributed.pipelining on the same pipeline, in one run.

Same model (torchvision resnet18, random init, same seed), same two-stage split (stage 1 starts
at ``layer3``), same 1F1B schedule and micro-batches, same data, loss and optimizer (SGD), two
local gloo workers with one thread each. The two runtimes alternate in rounds (A B A B ...) so
that machine noise hits both; each round times ``--steps`` steps after ``--warmup``; we report
the median over rounds of each round's median samples/s and the median of the rounds' ratios
(within-round ratios: machine noise shifts both runtimes of a round alike). Also reports, for
outcore, the measured step time and peak memory per rank against the simulator's prediction
for the same plan.

    .venv/bin/python benchmarks/runtime_vs_torch.py \
        [--rounds 3 --steps 8 --batch 64 --mbs 8 --size 32]

Writes ``benchmarks/results/runtime_vs_torch.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SPLIT = "layer3"


def make_model(seed: int):
    import torch
    import torchvision
    torch.manual_seed(seed)
    return torchvision.models.resnet18(num_classes=10)


def batches(args, n: int):
    import torch
    g = torch.Generator().manual_seed(1234)
    return [(torch.randn(args.batch, 3, args.size, args.size, generator=g),
             torch.randint(0, 10, (args.batch,), generator=g)) for _ in range(n)]


def outcore_worker(ctx, args, graph_doc, plan_doc, track=False):
    import torch
    import torch.distributed as dist

    from outcore.graph.io import from_dict
    from outcore.plan.plan import align, from_dict as plan_from_dict
    from outcore.runtime.data import split
    from outcore.runtime.trainer import Trainer

    g = from_dict(graph_doc)
    plan = align(plan_from_dict(plan_doc), g)
    model = make_model(0)
    data = batches(args, args.warmup + args.steps)
    micro = split((data[0][0],), args.mbs)[0]
    trainer = Trainer(model, g, plan, microbatches=args.mbs, micro_inputs=micro,
                      schedule="1f1b", optimizer=lambda ps: torch.optim.SGD(ps, lr=0.01),
                      track_memory=track)
    times, peaks = [], []
    for k, (x, y) in enumerate(data):
        dist.barrier()
        t0 = time.perf_counter()
        rep = trainer.step((x,), y)
        dist.barrier()
        if k >= args.warmup:
            times.append(time.perf_counter() - t0)
            peaks.append(rep.peak_bytes)
    return {"step_s": times, "peak_bytes": max(peaks) if peaks else 0, "busy_s": rep.busy_s}


def torch_worker(ctx, args):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import Schedule1F1B, SplitPoint, pipeline

    model = make_model(0)
    data = batches(args, args.warmup + args.steps)
    x_mb = data[0][0].chunk(args.mbs)[0]
    pipe = pipeline(model, mb_args=(x_mb,), split_spec={SPLIT: SplitPoint.BEGINNING})
    stage = pipe.build_stage(ctx.rank, torch.device("cpu"))
    sched = Schedule1F1B(stage, n_microbatches=args.mbs,
                         loss_fn=lambda out, tgt: F.cross_entropy(out, tgt))
    opt = torch.optim.SGD(stage.submod.parameters(), lr=0.01)
    times = []
    for k, (x, y) in enumerate(data):
        dist.barrier()
        t0 = time.perf_counter()
        if ctx.rank == 0:
            sched.step(x)
        else:
            sched.step(target=y, losses=[])
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        if k >= args.warmup:
            times.append(time.perf_counter() - t0)
    return {"step_s": times}


def outcore_plan(args):
    import torch

    import outcore
    from outcore.graph.io import to_dict
    from outcore.hardware.cluster import from_dict as cluster_from_dict
    from outcore.plan.plan import make_plan, to_dict as plan_to_dict
    from outcore.runtime.data import split

    model = make_model(0)
    x = torch.randn(args.batch, 3, args.size, args.size)
    micro = split((x,), args.mbs)[0]
    g = outcore.capture(model, micro, name="resnet18")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    g = outcore.profile(g, model, micro, warmup=2, repeat=5)
    torch.set_num_threads(before)
    stage1 = {"layer3", "layer4", "avgpool", "flatten", "fc", "output"}
    a = np.array([1 if (g.module_of(i).split(".")[0] in stage1 or g.name_of(i) in stage1)
                  else 0 for i in range(g.num_nodes)])
    plan = make_plan(g, a, strategy="manual", devices=2, memory_bytes=None,
                     microbatches=args.mbs, schedule="1f1b", optimizer="sgd",
                     cluster=cluster_from_dict({"bandwidth": args.bandwidth,
                                                "latency_s": args.latency,
                                                "mem_bandwidth": 10e9},
                                               devices=2, memory_bytes=None))
    pred = outcore.simulate(plan, g)
    return g, plan, pred, to_dict(g), plan_to_dict(plan)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--mbs", type=int, default=8)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--bandwidth", type=float, default=1.5e9, help="loopback gloo, bytes/s")
    ap.add_argument("--latency", type=float, default=1e-4, help="loopback gloo, seconds")
    ap.add_argument("--out", default="benchmarks/results/runtime_vs_torch")
    args = ap.parse_args()

    from outcore.runtime.launch import run_local

    g, plan, pred, graph_doc, plan_doc = outcore_plan(args)
    ours, theirs, busy = [], [], []
    round_sps = []  # per round: (outcore, torch) samples/s, each the median of that round's steps
    for r in range(args.rounds):
        res = run_local(outcore_worker, 2, (args, graph_doc, plan_doc), timeout_s=120)
        ours += res[0]["step_s"]
        ours_r = args.batch / statistics.median(res[0]["step_s"])
        busy = [x["busy_s"] for x in res]
        res = run_local(torch_worker, 2, (args,), timeout_s=120)
        theirs += res[0]["step_s"]
        theirs_r = args.batch / statistics.median(res[0]["step_s"])
        round_sps.append((ours_r, theirs_r))
        print(f"round {r}: outcore {ours_r:.1f} samples/s, torch.distributed.pipelining "
              f"{theirs_r:.1f} samples/s ({ours_r / theirs_r:.2f}x)", flush=True)
    # peak memory in a separate run: the tracker's dispatch hook would slow the timed steps
    res = run_local(outcore_worker, 2, (args, graph_doc, plan_doc, True), timeout_s=120)
    peaks = [x["peak_bytes"] for x in res]
    # the median over rounds (each round's own median), and the median of the rounds' ratios
    ours_sps = statistics.median(o for o, _ in round_sps)
    theirs_sps = statistics.median(t for _, t in round_sps)
    ratio = statistics.median(o / t for o, t in round_sps)
    result = {
        "model": "torchvision resnet18", "input": f"{args.batch}x3x{args.size}x{args.size}",
        "microbatches": args.mbs, "schedule": "1f1b", "split": f"stage 1 from {SPLIT}",
        "outcore_samples_per_s": ours_sps, "torch_samples_per_s": theirs_sps,
        "ratio": ratio, "round_samples_per_s": round_sps, "outcore_step_s": statistics.median(ours),
        "torch_step_s": statistics.median(theirs),
        "predicted_step_s": pred.iteration_s, "step_error": statistics.median(ours) /
        pred.iteration_s - 1, "busy_s": busy, "predicted_busy_s": pred.busy_s.tolist(),
        "peak_bytes": peaks, "predicted_peak_bytes": pred.peak_bytes.tolist(),
        "peak_error": [m / p - 1 if p else None for m, p in zip(peaks, pred.peak_bytes)],
        "rounds": args.rounds, "steps": args.steps,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(result, indent=1))
    mib = 2**20
    lines = [
        "| runtime | samples/s (median over rounds) | step time (median, all steps) |",
        "| --- | ---: | ---: |",
        f"| outcore | {ours_sps:.1f} | {statistics.median(ours) * 1e3:.1f} ms |",
        f"| torch.distributed.pipelining | {theirs_sps:.1f} | "
        f"{statistics.median(theirs) * 1e3:.1f} ms |",
        f"| **ratio** (median of the rounds' ratios) | **{ratio:.2f}x** | |", "",
        "| outcore vs its prediction | measured | predicted | error |",
        "| --- | ---: | ---: | ---: |",
        f"| step time | {statistics.median(ours) * 1e3:.1f} ms | {pred.iteration_s * 1e3:.1f} ms"
        f" | {result['step_error']:+.1%} |",
    ]
    for r in range(2):
        err = result["peak_error"][r]
        lines.append(f"| rank {r} peak memory | {peaks[r] / mib:.1f} MiB | "
                     f"{pred.peak_bytes[r] / mib:.1f} MiB | "
                     + (f"{err:+.1%}" if err is not None else "-") + " |")
        lines.append(f"| rank {r} busy | {busy[r] * 1e3:.1f} ms | {pred.busy_s[r] * 1e3:.1f} ms "
                     f"| {busy[r] / pred.busy_s[r] - 1:+.1%} |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
