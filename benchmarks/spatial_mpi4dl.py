"""MPI4DL's setting, simulated: a ResNet-class model (torchvision ResNet-50) on 1024^2 to 8192^2
images, spatial parallelism + layer parallelism (SP + LP) over 4 to 16 GPUs of the V100 preset
(``v100-sxm2-32gb``, NVLink inside a node of 4, InfiniBand between): the largest image that
fits, and images/s (Jain et al., MPI4DL: SP + LP on V100s, images up to 8192^2).

The graph is captured once at 256^2 and scaled to each image size: every image tensor's
height and width (recorded shapes) by ``size / 256``, its bytes and its node's analytical time
by the area ratio (convolutions, batch norm and pooling are linear in the pixel count; the
classifier after the global pool is unchanged). For each GPU count and size, the planner is
asked for LP alone (a pipeline on all GPUs) and for SP + LP with 2 to 16 tiles (the join from
the memory model, the rest a pipeline on ``gpus - sp + 1`` stages); 4 micro-batches of 1 image.
Nothing here runs a GPU: these are the simulator's predictions.

    .venv/bin/python benchmarks/spatial_mpi4dl.py [--sizes 1024,2048,4096,8192] [--gpus 4,8,16]

Writes ``benchmarks/results/spatial_mpi4dl.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASE = 256
DEVICE = "v100-sxm2-32gb"


def base_graph():
    import torch
    import torchvision

    import outcore
    model = torchvision.models.resnet50(num_classes=10)
    g = outcore.capture(model, (torch.randn(1, 3, BASE, BASE),), name="resnet50")
    return outcore.estimate(g, device=DEVICE)


def _scaled_shape(shape, f: int):
    if isinstance(shape, list) and len(shape) == 4 and all(isinstance(v, int) for v in shape) \
            and shape[2] > 1:
        return [shape[0], shape[1], shape[2] * f, shape[3] * f]
    return shape


def scale(g, size: int):
    """``g`` (captured at BASE^2) at ``size``^2 (see the module docstring)."""
    f = size // BASE
    image = np.array([s != _scaled_shape(s, f) for s in
                      (g.attr(i, "shape") for i in range(g.num_nodes))])
    area = np.where(image, float(f * f), 1.0)
    attrs = []
    for i in range(g.num_nodes):
        a = dict(g.attrs[i] or {}) if g.attrs is not None else {}
        if "shape" in a:
            a["shape"] = _scaled_shape(a["shape"], f)
        if "in_shapes" in a and a["in_shapes"]:
            a["in_shapes"] = [_scaled_shape(s, f) for s in a["in_shapes"]]
        attrs.append(a)
    # a node's time scales with its input image when its output is not one (global pool)
    work = np.maximum(area, [max([area[int(p)] for p in g.predecessors(i)] or [1.0])
                             for i in range(g.num_nodes)])
    return g.replace(fwd_s=g.fwd_s * work, bwd_s=g.bwd_s * work,
                     out_bytes=g.out_bytes * area,
                     saved_bytes=g.saved_bytes * np.maximum(area, work),
                     edge_bytes=g.edge_bytes * area[g.src], attrs=attrs)


def best(g, gpus: int, cluster) -> dict:
    """The fastest fitting plan among LP alone and SP + LP with 2, 4, 8, 16 tiles."""
    from outcore.errors import OutcoreError
    from outcore.plan.request import PlanRequest
    from outcore.search import search
    found = []
    for sp in (1, 2, 4, 8, 16):
        if sp > gpus:
            continue
        try:
            req = PlanRequest.make(gpus, cluster.device.memory_bytes, cluster=cluster,
                                   strategy="pipeline", microbatches=4, sp=sp,
                                   memory_policy="none")
            p = search(g, req, check_suggestions=False)
        except OutcoreError as e:
            found.append({"sp": sp, "fits": False, "why": str(e).splitlines()[0][:160]})
            continue
        pred = p.predicted
        fits = max(pred["peak_bytes"]) <= cluster.device.memory_bytes * (1 + 1e-9)
        found.append({"sp": sp, "fits": fits, "images_per_s": pred["samples_per_s"],
                      "peak_gib": max(pred["peak_bytes"]) / 2**30, "stages": p.stages,
                      "join": p.spatial.join if p.spatial else None})
    ok = [c for c in found if c["fits"]]
    return {"best": max(ok, key=lambda c: c["images_per_s"]) if ok else None, "tried": found}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,2048,4096,8192")
    ap.add_argument("--gpus", default="4,8,16")
    args = ap.parse_args()
    import outcore
    sizes = [int(s) for s in args.sizes.split(",")]
    gpus_list = [int(k) for k in args.gpus.split(",")]
    g0 = base_graph()
    rows, t0 = [], time.perf_counter()
    for gpus in gpus_list:
        cluster = outcore.cluster_of(gpus, per_node=4, device=DEVICE)
        for size in sizes:
            r = best(scale(g0, size), gpus, cluster)
            rows.append({"gpus": gpus, "size": size, **r})
            b = r["best"]
            print(f"{gpus} GPUs {size}^2: " + (f"sp {b['sp']} x {b['stages']} stages, "
                                                f"{b['images_per_s']:.2f} img/s, peak "
                                                f"{b['peak_gib']:.1f} GiB" if b else
                                                "nothing fits"), flush=True)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "spatial_mpi4dl.json").write_text(json.dumps(rows, indent=1))
    lines = [f"# MPI4DL setting, simulated: ResNet-50, {DEVICE}, 4 micro-batches of 1 image",
             "", "| GPUs | image | best | images/s | peak GiB | LP alone | sp 2 | sp 4 | sp 8 "
             "| sp 16 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        b = r["best"]
        cells = {c["sp"]: (f"{c['images_per_s']:.2f}" if c["fits"] else "no fit")
                 for c in r["tried"]}
        lines.append(f"| {r['gpus']} | {r['size']}^2 | "
                     + (f"sp {b['sp']} + {b['stages']} stages | {b['images_per_s']:.2f} | "
                        f"{b['peak_gib']:.1f}" if b else "nothing fits | - | -")
                     + " | " + " | ".join(cells.get(s, "-") for s in (1, 2, 4, 8, 16)) + " |")
    largest = {}
    for r in rows:
        if r["best"]:
            largest[r["gpus"]] = max(largest.get(r["gpus"], 0), r["size"])
    lines += ["", "Largest image that fits: " + ", ".join(
        f"{k} GPUs {v}^2" for k, v in sorted(largest.items())) + f" (searched in "
        f"{time.perf_counter() - t0:.0f} s)"]
    (out / "spatial_mpi4dl.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
