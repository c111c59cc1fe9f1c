"""Memory policies on this machine: time and peak memory per training step, measured beside
the planner's prediction, in the shape of the seed's CPU-offloading table (baseline, naive
offload, pinned, non-blocking, pinned + non-blocking, checkpointing) for ResNet50- and
VGG19-sized models.

Single process, one thread, synthetic data, Adam. Peak memory is the CPU tensor tracker's
(outcore/hardware/memtrack.py); times are medians of the timed steps. This machine has no
accelerator: the host *is* the device, so offloading moves nothing (the hooks keep each tensor
where it is) and pinned / non-blocking transfers cannot exist — those rows say so rather than
pretend. Checkpointing is what saves memory here.

    .venv/bin/python benchmarks/memory_policies.py [--steps 3] [--models resnet50,vgg19]
    .venv/bin/python benchmarks/memory_policies.py --models resnet11,resnet29,amoebanet,\
        wide_resnet,transformer --out benchmarks/results/memory_policies_zoo

The zoo models (batch 16) run one piece, the same nodes in about sqrt(n) pieces without a
policy, and those pieces checkpointed: the memory model's fidelity for a rank cut into pieces.

Writes ``benchmarks/results/memory_policies.{json,md}``.
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

MODELS = {"resnet50": ("torchvision:resnet50", (8, 3, 224, 224)),
          "vgg19": ("torchvision:vgg19", (4, 3, 224, 224)),
          # zoo models at batch 16 (seconds each): plain pieces and checkpointing beside one
          # piece, for the memory model's fidelity
          "resnet11": ("outcore:resnet_k:depth=11,width=8", None),
          "resnet29": ("outcore:resnet_k:depth=29,width=8", None),
          "amoebanet": ("outcore:amoebanet", None),
          "wide_resnet": ("outcore:wide_resnet", None),
          "transformer": ("outcore:transformer", None)}
# the variants of a zoo model: one piece, the same work in sqrt(n) pieces without a policy,
# and those pieces checkpointed
ZOO_VARIANTS = (("baseline", "none"), ("pieces", "pieces"), ("checkpointing", "checkpoint"))
SEED_VARIANTS = (("baseline", "none"), ("naive offload", "offload-activations"),
                 ("pinned", None), ("non-blocking", None), ("pinned + non-blocking", None),
                 ("checkpointing", "checkpoint"))


def policies_for(g, kind: str):
    from outcore.plan.policies import MemoryPolicies, segmented
    if kind == "none":
        return None
    if kind in ("checkpoint", "pieces"):
        return segmented(g.saved_bytes, kind if kind == "checkpoint" else "none",
                         max(1, int(round(np.sqrt(g.num_nodes)))))
    return MemoryPolicies(np.zeros(g.num_nodes, dtype=np.int64), (kind,))


def measure(spec, g, kind: str, steps: int):
    import torch

    from outcore.hardware.cluster import make_cluster
    from outcore.plan.plan import make_plan
    from outcore.runtime.data import SyntheticData
    from outcore.runtime.trainer import Trainer
    from outcore.sim import simulate

    cluster = make_cluster(1, device="cpu")
    plan = make_plan(g, np.zeros(g.num_nodes, dtype=np.int64), strategy="single", devices=1,
                     memory_bytes=None, cluster=cluster, policies=policies_for(g, kind))
    pred = simulate(plan, g, cluster=cluster)
    torch.manual_seed(0)
    model = spec.build()
    trainer = Trainer(model, g, plan, microbatches=1, micro_inputs=spec.example_inputs,
                      track_memory=True)
    out_meta = trainer.executor.metas[next(n.name for n in trainer.gm.graph.nodes
                                           if n.op == "output")]
    data = SyntheticData(spec.example_inputs, spec.int_high, out_meta, spec.batch_size, 0)
    times, peaks = [], []
    for step in range(steps + 1):
        x, y = data.batch(step)
        t0 = time.perf_counter()
        rep = trainer.step(x, y, track_memory=step >= 1)
        if step >= 1:  # step 0 creates the optimizer state
            times.append(time.perf_counter() - t0)
            peaks.append(rep.peak_bytes)
    return {"step_s": statistics.median(times), "peak_bytes": max(peaks),
            "predicted_step_s": pred.iteration_s, "predicted_peak_bytes": float(pred.peak_bytes[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--models", default="resnet50,vgg19")
    ap.add_argument("--out", default="benchmarks/results/memory_policies")
    args = ap.parse_args()

    import torch

    import outcore
    from outcore.zoo import resolve_model

    torch.set_num_threads(1)
    rows = []
    for name in args.models.split(","):
        model_name, shape = MODELS[name]
        spec = resolve_model(model_name, input_shape=shape,
                             **({} if shape else {"batch_size": 16}))
        torch.manual_seed(0)
        model = spec.build()
        g = outcore.capture(model, spec.example_inputs, name=name)
        g = outcore.profile(g, model, spec.example_inputs, warmup=1, repeat=3)
        del model
        for label, kind in ZOO_VARIANTS if shape is None else SEED_VARIANTS:
            if kind is None:
                rows.append({"model": name, "variant": label, "note":
                             "needs an accelerator (pinned host memory, copy streams): n/a"})
                continue
            r = measure(spec, g, kind, args.steps)
            r.update(model=name, variant=label, policy=kind)
            rows.append(r)
            print(f"{name} {label}: {r['step_s']:.2f} s (predicted {r['predicted_step_s']:.2f}),"
                  f" peak {r['peak_bytes'] / 2**20:.1f} MiB (predicted "
                  f"{r['predicted_peak_bytes'] / 2**20:.1f})", flush=True)
    lines = ["| model | variant | step time | predicted | peak memory | predicted | "
             "memory error | vs baseline (time, memory) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    base = {}
    for r in rows:
        if "note" in r:
            lines.append(f"| {r['model']} | {r['variant']} | — | — | — | — | — | {r['note']} |")
            continue
        if r["variant"] == "baseline":
            base[r["model"]] = r
        b = base[r["model"]]
        lines.append(f"| {r['model']} | {r['variant']} | {r['step_s']:.2f} s | "
                     f"{r['predicted_step_s']:.2f} s | {r['peak_bytes'] / 2**20:.1f} MiB | "
                     f"{r['predicted_peak_bytes'] / 2**20:.1f} MiB | "
                     f"{r['predicted_peak_bytes'] / r['peak_bytes'] - 1:+.1%} | "
                     f"{r['step_s'] / b['step_s']:.2f}x, "
                     f"{r['peak_bytes'] / b['peak_bytes']:.2f}x |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(rows, indent=1))
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
