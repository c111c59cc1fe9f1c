"""GEMS weak scaling, simulated: MP-Basic, MAST and MASTER on one model-parallel group, and the
hybrids with data parallelism (GEMS-HY) from one group to 1,024 simulated V100s.

GEMS (Jain et al., SC 2020) trains a ResNet-1k on 512 x 512 images on LLNL Lassen (4 V100s per
node, InfiniBand EDR, MVAPICH2-GDR) and reports 97.32 % weak-scaling efficiency on 1,024 GPUs
(128 model replicas of 8 GPUs). This program rebuilds the shape of that experiment in outcore's
simulator:

* model: ``outcore:resnet_k:depth=1001,width=16`` (pre-activation bottleneck ResNet-1001) on one
  ``--image-size`` image per micro-batch, captured on the meta device and costed by the
  analytical model against the ``v100`` preset (no GPU, no allocation);
* group: ``--group`` GPUs (8), the model cut into 8 contiguous stages balanced on time, 1F1B;
  MP-Basic = one replica, MAST = two replicas in opposite directions, MASTER = four (shifted
  pairs); each replica trains one micro-batch per iteration (the paper's batch size 1 per
  replica), MP-pipelined = one replica with as many micro-batches as memory allows (outcore's
  pipeline, not a GEMS design; shown for reference);
* cluster: ``--gpus-per-node`` (4) V100s per node joined by NVLink 2 (the ``nvlink2`` preset),
  nodes joined by InfiniBand EDR (12.5 GB/s per direction, 1.5 us; ``--rails`` ports per node);
* GEMS-HY: the group is copied D = 1, 2, 4, ..., 128 times (fixed work per GPU: weak scaling);
  copies are not simulated one by one: each rank's gradients are all-reduced over the D copies
  by the collective cost model of ``outcore.hardware.collectives`` (two-level, ring or recursive
  halving-doubling across nodes, a node's all-reduces sharing its network port), either
  overlapped piece by piece (outcore) or fused after the whole backward (torchgems).

Efficiency = throughput(D) / (D x throughput(1)) for the same design and all-reduce mode.

    .venv/bin/python benchmarks/gems_scaling.py            # 512^2, up to 1024 GPUs (~2 min)
    .venv/bin/python benchmarks/gems_scaling.py --quick    # up to 64 GPUs, no cross-check

Writes ``benchmarks/results/gems_scaling.json`` and ``gems_scaling.md``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import outcore
from outcore.errors import InfeasibleError
from outcore.graph import Graph, load, save
from outcore.hardware.collectives import dp_allreduce
from outcore.hardware.presets import device_preset, link_preset
from outcore.hardware.spec import Cluster, LinkSpec, flat_cluster
from outcore.plan import Layout
from outcore.plan.plan import Plan
from outcore.sim.simulate import SimResult, simulate

RESULTS = Path(__file__).resolve().parent / "results"
PAPER_EFFICIENCY = 0.9732  # GEMS-HY on 1,024 V100s (Jain et al., SC 2020; abstract and talk)
GIB = 2**30


def model_graph(depth: int, width: int, image: int, cache: Path | None) -> tuple[Graph, float]:
    """The layer graph of ResNet-``depth`` on one ``image``^2 image, costed for a V100."""
    if cache is not None and cache.exists():
        return load(cache), 0.0
    import torch

    from outcore.cost.analytical import estimate
    from outcore.graph.capture import capture
    from outcore.zoo import resolve_model

    t = time.perf_counter()
    with torch.device("meta"):
        spec = resolve_model(f"outcore:resnet_k:depth={depth},width={width}",
                             input_shape=(1, 3, image, image))
        model = spec.build()
    g = estimate(capture(model, (torch.empty(1, 3, image, image, device="meta"),)), "v100")
    if cache is not None:
        save(g, cache)
    return g, time.perf_counter() - t


def lassen(gpus: int, gpus_per_node: int, memory_gib: int, rails: int) -> Cluster:
    """``gpus`` V100s, ``gpus_per_node`` per node, NVLink 2 inside, EDR x ``rails`` between."""
    edr = link_preset("ib-edr")
    dev = device_preset("v100-32gb" if memory_gib > 16 else "v100")
    nodes = -(-gpus // gpus_per_node)
    return Cluster(dev, nodes, gpus_per_node, link_preset("nvlink2"),
                   LinkSpec(edr.bandwidth * rails, edr.latency_s))


def plan_group(g: Graph, k: int, mode: str, replicas: int, microbatches: int,
               memory_gib: int) -> Plan:
    """A GEMS design on ``k`` GPUs: the model cut into exactly ``k`` contiguous stages (as
    torchgems' ``split_size``), balanced on time by outcore's pipeline partitioner under
    ``memory / replicas`` per GPU, then replicated (``outcore.plan.replicas``)."""
    from outcore.placers.context import make_context
    from outcore.placers.stages import assignment_from_bounds, stage_bounds
    from outcore.plan import make_plan

    intra = link_preset("nvlink2")
    budget = memory_gib * GIB / replicas
    cl = flat_cluster(k, memory_bytes=budget, bandwidth=intra.bandwidth,
                      latency_s=intra.latency_s)
    ctx = make_context(g, k, cluster=cl, microbatches=microbatches, memory_bytes=budget)
    bounds = stage_bounds(ctx, k, inflight="1f1b")
    if bounds is None:
        raise InfeasibleError(f"{k} contiguous stages do not fit {budget / GIB:.2f} GiB per GPU "
                              f"({memory_gib} GiB / {replicas} replicas)")
    p = make_plan(g, assignment_from_bounds(ctx, bounds), strategy="pipeline", devices=k,
                  memory_bytes=memory_gib * GIB, schedule="1f1b", microbatches=microbatches,
                  devices_used=len(bounds))
    if mode != "mp":
        p = p.replace(layout=Layout.replicate(mode, k, replicas, 1))
    return p


def outcore_plan(g: Graph, k: int, microbatches: int, memory_gib: int) -> Plan:
    """What ``outcore.plan`` picks for one replica (any number of stages up to ``k``)."""
    intra = link_preset("nvlink2")
    return outcore.plan(g, k, f"{memory_gib}GiB", strategy="pipeline", parallel="mp",
                        microbatches=microbatches, schedule="1f1b", device="v100",
                        bandwidth=intra.bandwidth, latency=intra.latency_s)


def with_dp_copies(p: Plan, dp: int) -> Plan:
    """``p`` with its data-parallel copies expanded into graph copies (simulated one by one)."""
    lay = p.layout
    stages = lay.stages if lay.replicated else p.devices
    layout = Layout.replicate(lay.mode, stages, lay.replicas, dp)
    return p.replace(devices=layout.ranks(stages), layout=layout)


def run(p: Plan, g: Graph, cl: Cluster, dp: int, **kw: Any) -> tuple[SimResult, float]:
    t = time.perf_counter()
    r = simulate(p, g, cluster=cl, dp=dp, **kw)
    return r, time.perf_counter() - t


def summary(r: SimResult, wall_s: float, gpus: int) -> dict[str, Any]:
    busy = float(r.busy_s.mean())
    return {"gpus": gpus, "iteration_s": r.iteration_s, "images_per_s": r.samples_per_s,
            "utilisation": busy / r.iteration_s if r.iteration_s else 0.0,
            "peak_gib": float(r.peak_bytes.max()) / GIB, "fits": r.fits,
            "sim_wall_s": wall_s}


DESIGNS = [  # name, mode, replicas, micro-batches per replica, memory per GPU (GiB)
    ("MP-Basic", "mp", 1, 1, 16),
    ("MAST", "mast", 2, 1, 16),
    ("MASTER", "master", 4, 1, 32),
]


def one_group(g: Graph, args: argparse.Namespace) -> tuple[list[dict], dict[str, Plan]]:
    rows, plans = [], {}
    for name, mode, reps, mbs, mem in DESIGNS + [("MASTER", "master", 4, 1, 16)]:
        label = f"{name} ({mem} GiB)"
        try:
            p = plan_group(g, args.group, mode, reps, mbs, mem)
        except InfeasibleError as e:
            rows.append({"design": label, "error": str(e)})
            continue
        r, wall = run(p, g, lassen(args.group, args.gpus_per_node, mem, args.rails), 1)
        rows.append({"design": label, "replicas": p.layout.replicas,
                     "microbatches": mbs, "stages": p.devices_used or p.devices,
                     "memory_gib": mem, **summary(r, wall, args.group)})
        if (name, mem) in [(d[0], d[4]) for d in DESIGNS]:
            plans[name] = p
    for mbs in (8, 4, 2):  # outcore's pipelining of one replica, for reference
        try:
            p = outcore_plan(g, args.group, mbs, 16)
        except InfeasibleError:
            continue
        r, wall = run(p, g, lassen(args.group, args.gpus_per_node, 16, args.rails), 1)
        if r.fits:
            rows.append({"design": "MP-pipelined (16 GiB)", "replicas": 1, "microbatches": mbs,
                         "stages": p.devices_used or p.devices, "memory_gib": 16,
                         **summary(r, wall, args.group)})
            break
    base = next(x for x in rows if x["design"].startswith("MP-Basic"))["images_per_s"]
    for x in rows:
        if "images_per_s" in x:
            x["speedup_vs_mp_basic"] = x["images_per_s"] / base
    return rows, plans


def weak_scaling(g: Graph, plans: dict[str, Plan], args: argparse.Namespace) -> list[dict]:
    rows = []
    sizes = [d for d in (1, 2, 4, 8, 16, 32, 64, 128) if d * args.group <= args.max_gpus]
    mem = {d[0]: d[4] for d in DESIGNS}
    for name, p in plans.items():
        for mode, kw in (("overlapped", {}), ("fused (torchgems)", {"dp_fused": True})):
            first = None
            for dp in sizes:
                cl = lassen(args.group * dp, args.gpus_per_node, mem[name], args.rails)
                r, wall = run(p, g, cl, dp, **kw)
                row = {"design": f"GEMS-HY {name}", "allreduce": mode, "dp": dp,
                       **summary(r, wall, args.group * dp)}
                first = first or row
                row["efficiency"] = row["images_per_s"] / (dp * first["images_per_s"])
                rows.append(row)
    return rows


def ablation(g: Graph, plans: dict[str, Plan], args: argparse.Namespace) -> list[dict]:
    """MAST x dp at the largest size: collective models, rails, overlap."""
    p = plans["MAST"]
    dp = max(d for d in (1, 2, 4, 8, 16, 32, 64, 128) if d * args.group <= args.max_gpus)
    one = run(p, g, lassen(args.group, args.gpus_per_node, 16, args.rails), 1)[0]
    rows = []
    for collective in ("auto", "hierarchical", "hierarchical-rhd", "ring"):
        for rails in (1, 2):
            for fused in (False, True):
                cl = lassen(args.group * dp, args.gpus_per_node, 16, rails)
                r, wall = run(p, g, cl, dp, collective=collective, dp_fused=fused)
                one_r = one if rails == args.rails else run(
                    p, g, lassen(args.group, args.gpus_per_node, 16, rails), 1)[0]
                exposed = r.iteration_s - one_r.iteration_s
                alone = max(dp_allreduce(cl, p.devices, dp, k, float(r.costs.param_bytes[k]),
                                         collective).total_s for k in range(p.devices))
                rows.append({"collective": collective, "rails": rails,
                             "allreduce": "fused" if fused else "overlapped", "dp": dp,
                             "gpus": args.group * dp, "iteration_s": r.iteration_s,
                             "exposed_allreduce_s": exposed, "gpu_allreduce_s": alone,
                             "efficiency": one_r.iteration_s / r.iteration_s,
                             "sim_wall_s": wall})
    return rows


def cross_check(g: Graph, plans: dict[str, Plan], args: argparse.Namespace) -> list[dict]:
    """The collective cost model against copies simulated one by one (small D)."""
    rows = []
    for name in ("MP-Basic", "MAST"):
        p = plans[name]
        for dp in (2, 4):
            cl = lassen(args.group * dp, args.gpus_per_node, 16, args.rails)
            model, wall_m = run(p, g, cl, dp, dp_fused=True)
            copies, wall_c = run(with_dp_copies(p, dp), g, cl, 1)
            rows.append({"design": f"GEMS-HY {name}", "dp": dp, "gpus": args.group * dp,
                         "model_iteration_s": model.iteration_s,
                         "copies_iteration_s": copies.iteration_s,
                         "model_wall_s": wall_m, "copies_wall_s": wall_c,
                         "copies_ranks": copies.timeline.num_ranks})
    return rows


def image_sensitivity(args: argparse.Namespace) -> list[dict]:
    """GEMS-HY MAST at smaller images: less compute per iteration, the same gradients."""
    rows = []
    dp = max(d for d in (1, 2, 4, 8, 16, 32, 64, 128) if d * args.group <= args.max_gpus)
    for size in args.sensitivity_sizes:
        cache = None
        if args.graph_cache is not None:
            cache = args.graph_cache.with_name(f"{args.graph_cache.stem}_{size}.json")
        g, _ = model_graph(args.depth, args.width, size, cache)
        p = plan_group(g, args.group, "mast", 2, 1, 16)
        one = run(p, g, lassen(args.group, args.gpus_per_node, 16, args.rails), 1)[0]
        for fused in (False, True):
            r = run(p, g, lassen(args.group * dp, args.gpus_per_node, 16, args.rails), dp,
                    dp_fused=fused)[0]
            rows.append({"image_size": size, "allreduce": "fused" if fused else "overlapped",
                         "stages": p.devices_used,
                         "gpus": args.group * dp, "iteration_1_s": one.iteration_s,
                         "iteration_s": r.iteration_s,
                         "efficiency": one.iteration_s / r.iteration_s})
    return rows


def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (numerical integration)."""
    import numpy as np
    if n <= 1:
        return 0.0
    x = np.linspace(-8.0, 8.0, 16001)
    pdf = np.exp(-x * x / 2) / np.sqrt(2 * np.pi)
    cdf = np.cumsum(pdf) * (x[1] - x[0])
    return float(np.trapezoid(x * n * pdf * cdf ** (n - 1), x))


def stragglers(groups: int) -> list[dict]:
    """Efficiency left when every group's iteration time varies independently (normal, with
    coefficient of variation cv) and a synchronous all-reduce waits for the slowest:
    ``1 / (1 + cv * E[max of groups])`` (an analytical aside, not the simulator)."""
    e = expected_max_normal(groups)
    return [{"cv": cv, "groups": groups, "expected_max_z": e, "efficiency": 1 / (1 + cv * e)}
            for cv in (0.0025, 0.005, 0.01)]


def fmt_table(cols: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def markdown(doc: dict[str, Any]) -> str:
    a = doc["assumptions"]
    lines = ["# GEMS weak scaling, simulated\n",
             f"Command: `{doc['command']}`\n",
             "Every figure is a simulation (outcore's discrete-event simulator with the "
             "analytical V100 cost model), not a measurement.\n",
             "## Assumptions\n"]
    lines += [f"- **{k}**: {v}" for k, v in a.items()]
    lines += ["\n## One group: MP-Basic, MAST, MASTER "
              f"({doc['group']} GPUs, {doc['gpus_per_node']} per node)\n"]
    rows = []
    for x in doc["one_group"]:
        if "error" in x:
            rows.append([x["design"], "-", "-", "-", "does not plan: " + x["error"][:90],
                         "-", "-", "-"])
            continue
        rows.append([x["design"], x["replicas"], x["microbatches"], x["stages"],
                     f"{x['images_per_s']:.2f}", f"{x['speedup_vs_mp_basic']:.2f}x",
                     f"{100 * x['utilisation']:.0f}%",
                     f"{x['peak_gib']:.1f} / {x['memory_gib']}" + ("" if x["fits"] else " NO")])
    lines.append(fmt_table(["design", "replicas", "micro-batches / replica", "stages",
                            "images/s", "vs MP-Basic", "GPU busy", "peak GiB / limit"], rows))
    lines += ["\n## Weak scaling (GEMS-HY = design x data parallelism)\n",
              f"Paper: {100 * PAPER_EFFICIENCY:.2f} % on 1,024 V100s (GEMS-HY, Lassen, "
              "MVAPICH2-GDR). Efficiency here is relative to one group of "
              f"{doc['group']} GPUs, same design and all-reduce mode.\n"]
    by = {}
    for x in doc["weak_scaling"]:
        by.setdefault((x["design"], x["allreduce"]), []).append(x)
    gpus = sorted({x["gpus"] for x in doc["weak_scaling"]})
    rows = []
    for (design, mode), xs in by.items():
        rows.append([design, mode] + [f"{x['images_per_s']:.1f} ({100 * x['efficiency']:.2f}%)"
                                      for x in xs])
    lines.append(fmt_table(["design", "all-reduce"] + [f"{n} GPUs" for n in gpus], rows))
    lines.append("\nCells: images/s (weak-scaling efficiency).\n")
    wall = [x["sim_wall_s"] for x in doc["weak_scaling"]]
    lines.append(f"Simulator wall time per configuration: {min(wall):.2f}-{max(wall):.2f} s "
                 "(independent of D: copies are a collective cost, not simulated).\n")
    if doc.get("ablation"):
        lines += ["## All-reduce model at the largest size (GEMS-HY MAST)\n"]
        lines.append("'one GPU's all-reduce' is the cost model alone: all of one GPU's "
                     "gradients over the D copies, without port sharing or overlap; 'exposed' "
                     "is what the iteration grows by against D = 1 on the same links.\n")
        rows = [[x["collective"], x["rails"], x["allreduce"], x["gpus"],
                 f"{1e3 * x['gpu_allreduce_s']:.2f}",
                 f"{1e3 * x['iteration_s']:.2f}", f"{1e3 * x['exposed_allreduce_s']:.2f}",
                 f"{100 * x['efficiency']:.2f}%"] for x in doc["ablation"]]
        lines.append(fmt_table(["collective", "EDR rails", "all-reduce", "GPUs",
                                "one GPU's all-reduce ms", "iteration ms",
                                "exposed all-reduce ms", "efficiency"], rows))
    if doc.get("cross_check"):
        lines += ["\n## Cross-check: collective model vs copies simulated one by one\n",
                  "The model: each GPU's gradients in one all-reduce over the D copies after "
                  "its backward (torchgems), after the replica all-reduce. The copies: one "
                  "flat ring per parameter bucket over every rank holding those parameters "
                  "(replicas x copies), launched after the last backward touching them, at "
                  "the slowest link it crosses, no port sharing.\n"]
        rows = [[x["design"], x["dp"], x["gpus"], f"{1e3 * x['model_iteration_s']:.2f}",
                 f"{1e3 * x['copies_iteration_s']:.2f}", f"{x['model_wall_s']:.2f}",
                 f"{x['copies_wall_s']:.2f}"] for x in doc["cross_check"]]
        lines.append(fmt_table(["design", "D", "GPUs", "model ms", "copies ms",
                                "model wall s", "copies wall s"], rows))
    if doc.get("image_sensitivity"):
        lines += ["\n## Smaller images (GEMS-HY MAST, 16 GiB, same ResNet-"
                  f"{doc['depth']})\n",
                  "Compute per image falls with the pixel count; the gradients do not.\n"]
        rows = [[f"{x['image_size']}^2", x["allreduce"], x["gpus"],
                 f"{1e3 * x['iteration_1_s']:.1f}", f"{1e3 * x['iteration_s']:.1f}",
                 f"{100 * x['efficiency']:.2f}%"] for x in doc["image_sensitivity"]]
        lines.append(fmt_table(["image", "all-reduce", "GPUs", "iteration ms (1 group)",
                                "iteration ms", "efficiency"], rows))
    if doc.get("stragglers"):
        st = doc["stragglers"]
        lines += ["\n## Aside: stragglers (analytical, not simulated)\n",
                  f"If each of the {st[0]['groups']} groups' iteration time varied "
                  "independently (normal, coefficient of variation cv), a synchronous "
                  "all-reduce would wait for the slowest: efficiency ~ 1 / (1 + cv x "
                  f"E[max of {st[0]['groups']} standard normals] = "
                  f"{st[0]['expected_max_z']:.2f}).\n"]
        rows = [[f"{100 * x['cv']:.2f}%", f"{100 * x['efficiency']:.2f}%"] for x in st]
        lines.append(fmt_table(["cv of a group's iteration", "efficiency"], rows))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image-size", type=int, default=512)
    ap.add_argument("--depth", type=int, default=1001)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--group", type=int, default=8, help="GPUs per model-parallel group")
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--rails", type=int, default=1, help="EDR ports per node")
    ap.add_argument("--max-gpus", type=int, default=1024)
    ap.add_argument("--graph-cache", type=Path, help="save/load the costed graph here "
                    "(smaller images: NAME_<size>.json beside it)")
    ap.add_argument("--sensitivity-sizes", type=lambda t: [int(x) for x in t.split(",") if x],
                    default=[256, 128], help="smaller image sizes to try MAST x dp on")
    ap.add_argument("--quick", action="store_true", help="up to 64 GPUs, no cross-check")
    ap.add_argument("--out", type=Path, default=RESULTS / "gems_scaling")
    args = ap.parse_args(argv)
    if args.quick:
        args.max_gpus = min(args.max_gpus, 64)
    g, capture_s = model_graph(args.depth, args.width, args.image_size, args.graph_cache)
    per_image = float(g.fwd_s.sum() + g.bwd_s.sum())
    print(f"graph: {g.num_nodes} nodes, {per_image:.3f} s forward+backward per image on one "
          f"V100 (estimated), {g.saved_bytes.sum() / GIB:.1f} GiB saved activations, "
          f"{g.param_bytes.sum() / 2**20:.1f} MiB parameters", file=sys.stderr)
    t0 = time.perf_counter()
    group_rows, plans = one_group(g, args)
    scaling = weak_scaling(g, plans, args)
    abl = ablation(g, plans, args)
    cross = [] if args.quick else cross_check(g, plans, args)
    sens = [] if args.quick else image_sensitivity(args)
    edr = link_preset("ib-edr")
    nvl = link_preset("nvlink2")
    doc = {
        "command": "python " + " ".join(shlex.quote(a) for a in
                                        ["benchmarks/gems_scaling.py", *(argv or sys.argv[1:])]),
        "group": args.group, "gpus_per_node": args.gpus_per_node,
        "assumptions": {
            "model": f"outcore:resnet_k:depth={args.depth},width={args.width} (pre-activation "
                     f"bottleneck ResNet-{args.depth}), {args.image_size}x{args.image_size} "
                     f"images, 1 image per micro-batch; {g.num_nodes} layer nodes; "
                     f"{g.param_bytes.sum() / 2**20:.1f} MiB parameters; "
                     f"{g.saved_bytes.sum() / GIB:.1f} GiB saved activations per image",
            "costs": f"analytical model, v100 preset (15.7 TFLOP/s fp32 x 0.7 efficiency, "
                     f"900 GB/s HBM2): {per_image:.3f} s forward+backward per image on one "
                     "GPU; fp32, Adam (4 x parameter bytes of state)",
            "memory": "16 GiB per GPU (V100-SXM2-16GB, as Lassen) for MP-Basic and MAST; "
                      "MASTER (4 replicas) needs 32 GiB (V100-SXM2-32GB) at this image size",
            "cluster": f"{args.gpus_per_node} GPUs per node; intra-node nvlink2 preset "
                       f"({nvl.bandwidth / 1e9:.0f} GB/s, {nvl.latency_s * 1e6:.0f} us per "
                       "direction; an AC922 GPU pair has 75 GB/s); inter-node InfiniBand EDR "
                       f"{args.rails} x {edr.bandwidth / 1e9:.1f} GB/s, "
                       f"{edr.latency_s * 1e6:.1f} us per port (Lassen has 2 rails)",
            "group": f"{args.group} GPUs = exactly {args.group} contiguous stages (torchgems' "
                     "split_size), balanced on time by outcore's pipeline partitioner under "
                     "memory / replicas per GPU; 1F1B schedule; copy d of the group on GPUs "
                     f"[{args.group}d, {args.group}d+{args.group}); MP-pipelined is what "
                     "outcore.plan picks for one replica (any stage count, more micro-batches)",
            "micro-batches": "1 per replica per iteration (the paper's batch size 1 per "
                             "replica); the MAST/MASTER replicas of a parameter are "
                             "all-reduced right after their last backward",
            "data parallel": "D copies of the group, modelled by the all-reduce cost of each "
                             "rank's gradients over the D copies; 'overlapped' = one "
                             "all-reduce per piece after its last backward (outcore), "
                             "'fused (torchgems)' = one all-reduce per GPU after its whole "
                             "backward, as torchgems' apply_allreduce_master_and_update; "
                             "default collective 'auto' (two-level, see docs/gems.md)",
            "not modelled": "data loading, stragglers and OS noise, GPU kernel launch "
                            "gaps beyond launch_s, MPI/CUDA-aware protocol overheads, "
                            "network congestion beyond one port per node (fat tree assumed "
                            "non-blocking), optimizer step beyond memory traffic",
        },
        "capture_s": capture_s, "benchmark_wall_s": None,
        "one_group": group_rows, "weak_scaling": scaling, "ablation": abl,
        "cross_check": cross, "image_sensitivity": sens,
        "stragglers": stragglers(args.max_gpus // args.group),
        "paper_efficiency": PAPER_EFFICIENCY, "depth": args.depth,
    }
    doc["benchmark_wall_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    md = markdown(doc)
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
