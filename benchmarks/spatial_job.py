"""A real huge-image job: a conv net on 2048 x 2048 images whose plain training step does not fit
a per-device memory limit, trained with spatial parallelism on 4 ranks (``outcore train --sp
4``: the planner picks the join from its memory model), beside what a user would do on one
device of that size: activation checkpointing, by outcore's ``--memory-policy checkpoint`` (per
piece) and by plain PyTorch's ``checkpoint_sequential``, if they fit.

Every run goes through ``outcore.train`` (the CLI's road): capture, analytical costs, plan,
local gloo workers (one thread each), measured peak tensor memory per rank (the CPU tracker:
every tensor an operator makes, parameters included) beside the plan's prediction. This machine
has 2 cores shared with other jobs: 4 ranks oversubscribe it, so time per image shows the cost
of the tiled run here, not a speed-up.

    .venv/bin/python benchmarks/spatial_job.py [--size 2048] [--limit 300MiB] [--steps 3]

Writes ``benchmarks/results/spatial_job.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL_SOURCE = '''
import torch
from torch import nn


def net():
    """3x3 convolutions with batch norm on a 3-channel image, two max pools, a stride-2
    convolution, global average pool, classifier (4-16 channels)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
'''


def run(model: str, size: int, devices: int, limit: str, steps: int, **options) -> dict:
    import outcore
    from outcore.errors import OutcoreError
    from outcore.units import format_bytes
    try:
        r = outcore.train(model, devices, memory=limit, input_shape=f"1x3x{size}x{size}",
                          batch_size=1, microbatches=1, steps=steps, optimizer="sgd", lr=0.01,
                          costs="estimate:cpu", timeline=False, timeout=600.0, layout="given",
                          run_dir=tempfile.mkdtemp(prefix="spatial-job-"), **options)
    except OutcoreError as e:
        return {"devices": devices, "fits": False, "error": str(e).splitlines()[0]}
    pred = r.predicted.get("peak_bytes") or []
    return {"devices": r.plan.devices, "fits": True, "s_per_image": r.median_step_s,
            "losses": r.losses, "peak_bytes": r.peak_bytes, "predicted_peak_bytes": pred,
            "predicted_step_s": r.predicted.get("iteration_s"),
            "join": r.plan.spatial.join if r.plan.spatial else None,
            "why": r.plan.spatial.reason if r.plan.spatial else None,
            "peaks": ", ".join(format_bytes(p) for p in r.peak_bytes),
            "predicted_peaks": ", ".join(format_bytes(p) for p in pred),
            "policies": r.plan.policies is not None}


def torch_checkpointing(size: int, steps: int, segments: int) -> dict:
    """What a user does on one device instead: plain PyTorch with
    ``torch.utils.checkpoint.checkpoint_sequential`` (only segment boundaries kept, each segment
    recomputed in the backward); peak measured with the same CPU tensor tracker."""
    import time

    import torch
    from torch.utils.checkpoint import checkpoint_sequential

    from outcore.hardware.memtrack import MemoryTracker
    from outcore.units import format_bytes
    torch.set_num_threads(1)
    scope: dict = {}
    exec(MODEL_SOURCE, scope)
    net = scope["net"]()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    times, peak = [], 0
    for _ in range(steps):
        x = torch.randn(1, 3, size, size, generator=gen)
        y = torch.randint(0, 10, (1,), generator=gen)
        t0 = time.perf_counter()
        with MemoryTracker(torch.device("cpu"), list(net.parameters())) as mt:
            loss = torch.nn.functional.cross_entropy(
                checkpoint_sequential(net, segments, x, use_reentrant=False), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        peak = max(peak, mt.peak_bytes)
    steady = times[1:] or times
    return {"devices": 1, "fits": True, "s_per_image": sorted(steady)[len(steady) // 2],
            "peak_bytes": [peak], "peaks": format_bytes(peak), "predicted_peaks": "-",
            "segments": segments}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--limit", default="300MiB")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--runs", default="plain,sp,checkpoint,torch-checkpoint",
                    help="which runs (results of the others are kept from the last json)")
    ap.add_argument("--segments", type=int, default=4)
    args = ap.parse_args()
    runs = set(args.runs.split(","))
    from outcore.units import parse_bytes
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    model_file = Path(tempfile.mkdtemp(prefix="spatial-job-model-")) / "net.py"
    model_file.write_text(MODEL_SOURCE)
    model = f"{model_file}:net"
    limit_bytes = float(parse_bytes(args.limit))
    old = out_dir / "spatial_job.json"
    rows = json.loads(old.read_text())["runs"] if old.exists() else {}
    if "plain" in runs:
        rows["plain, 1 device"] = run(model, args.size, 1, None, 2, memory_policy="none")
    if "sp" in runs:
        rows["sp 4, 4 ranks"] = run(model, args.size, 4, args.limit, args.steps, sp=4,
                                    memory_policy="none")
    if "checkpoint" in runs:
        rows["1 device, outcore checkpoint policy"] = run(
            model, args.size, 1, args.limit, args.steps, memory_policy="checkpoint")
    if "torch-checkpoint" in runs:
        rows[f"1 device, torch checkpoint_sequential ({args.segments} segments)"] = \
            torch_checkpointing(args.size, args.steps, args.segments)
    doc = {"size": args.size, "limit": args.limit, "limit_bytes": limit_bytes, "runs": rows}
    (out_dir / "spatial_job.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Huge-image job: {args.size}x{args.size}, limit {args.limit} per device", "",
             "| run | ranks | s / image | peak per rank (measured) | predicted | within limit |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, r in rows.items():
        if not r["fits"]:
            lines.append(f"| {name} | {r['devices']} | - | does not fit: {r['error']} | | |")
            continue
        ok = all(p <= limit_bytes for p in r["peak_bytes"])
        lines.append(f"| {name} | {r['devices']} | {r['s_per_image']:.2f} | {r['peaks']} | "
                     f"{r['predicted_peaks']} | {'yes' if ok else 'no'} |")
    sp = rows.get("sp 4, 4 ranks", {})
    if sp.get("fits"):
        lines += ["", f"sp join after `{sp['join']}`: {sp['why']}"]
    (out_dir / "spatial_job.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
