"""``outcore simulate`` at scale: data parallel, pipeline x dp, MAST x dp and MASTER x dp for a
ResNet-k and the zoo transformer on 8 to 1,024 simulated V100s.

For each model and each configuration the group (K GPUs: one replica split into exactly K
contiguous stages balanced on time, replicated GEMS-style when asked) is planned once; each
cluster size N then runs D = N / K data-parallel copies of it. Copies are not simulated one by
one: every rank's gradients are all-reduced over the D copies with the collective cost model of
``outcore.hardware.collectives`` (two-level, the faster of ring and recursive halving-doubling
across nodes, a node's all-reduces sharing its network port), in DDP-style 25 MiB buckets that
overlap the backward. So the simulator's cost does not grow with D, which the table's wall
times show.

Columns: iteration time, throughput, *efficiency* = throughput x (one GPU's forward+backward
time per sample) / N, i.e. the fraction of the GPUs' time spent on useful compute (1.0 = every
GPU busy all the time; pipeline bubbles, replica idling and exposed communication lower it),
*scaling* = throughput / (N / N0 x throughput at the smallest N0 of the same configuration),
peak memory per GPU against the 16 GiB of a V100, and the simulator's wall time.

    .venv/bin/python benchmarks/simulate_scale.py            # both models, 8..1024 GPUs
    .venv/bin/python benchmarks/simulate_scale.py --quick    # 8 and 64 GPUs

Writes ``benchmarks/results/simulate_scale.json`` and ``simulate_scale.md``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from gems_scaling import (  # benchmarks/ on sys.path
    GIB,
    fmt_table,
    lassen,
    plan_group,
    with_dp_copies,
)

from outcore.errors import InfeasibleError
from outcore.graph import Graph, collapse, load, save
from outcore.sim.simulate import simulate

RESULTS = Path(__file__).resolve().parent / "results"
BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb

MODELS = {  # zoo name, input shape, module depth to plan at (None: layers), summary
    "resnet": ("outcore:resnet_k:depth=1001,width=16", (1, 3, 256, 256), None,
               "ResNet-1001 (width 16), one 256x256 image per micro-batch"),
    "resnet512": ("outcore:resnet_k:depth=1001,width=16", (1, 3, 512, 512), None,
                  "ResNet-1001 (width 16), one 512x512 image per micro-batch (GEMS' case)"),
    "transformer": ("outcore:transformer:layers=24,d_model=1024,heads=16,seq=1024,vocab=32000",
                    (1, 1024), 3, "transformer LM, 24 layers, d_model 1024, 16 heads, 1,024 "
                    "tokens per micro-batch, vocabulary 32,000; planned on depth-3 blocks"),
}

CONFIGS = [  # label, K (GPUs per group), mode, replicas, micro-batches per replica
    ("DP", 1, "mp", 1, 1),
    ("PP4 x dp", 4, "mp", 1, 8),
    ("PP8 x dp", 8, "mp", 1, 16),
    ("MAST4 x dp", 4, "mast", 2, 1),
    ("MAST8 x dp", 8, "mast", 2, 1),
    ("MASTER8 x dp", 8, "master", 4, 1),
]


def model_graph(spec: str, shape: tuple[int, ...], cache: Path | None) -> Graph:
    """Capture ``spec`` on the meta device (no allocation) and cost it for a V100."""
    if cache is not None and cache.exists():
        return load(cache)
    import torch

    from outcore.cost.analytical import estimate
    from outcore.graph.capture import capture
    from outcore.zoo import resolve_model

    with torch.device("meta"):
        model = resolve_model(spec, input_shape=shape).build()
    x = (torch.zeros(shape, dtype=torch.long) if len(shape) == 2
         else torch.empty(shape, device="meta"))
    g = estimate(capture(model, (x,)), "v100")
    if cache is not None:
        save(g, cache)
    return g


def blocks(g: Graph, depth: int | None) -> Graph:
    """``collapse(g, depth)`` with each block's parameter names kept (``params``), so that
    parameters held by several ranks (GEMS replicas) still get their all-reduce buckets."""
    if depth is None:
        return g
    c = collapse(g, depth)
    index = {int(i): k for k, i in enumerate(g.ids.tolist())}
    attrs = []
    for a in c.attrs:
        members = [index[m] for m in a.get("members", [])]
        params = sorted({q for m in members for q in (g.attr(m, "params", []) or [])})
        shared = sorted({q for m in members for q in (g.attr(m, "shared_params", []) or [])}
                        - set(params))
        attrs.append({**a, "params": params, **({"shared_params": shared} if shared else {})})
    return c.replace(attrs=attrs)


def sweep(name: str, g: Graph, sizes: list[int], args: argparse.Namespace) -> list[dict]:
    one_gpu_s = float(g.fwd_s.sum() + g.bwd_s.sum())  # per sample
    rows = []
    for label, k, mode, reps, mbs in CONFIGS:
        t = time.perf_counter()
        try:
            p = plan_group(g, k, mode, reps, mbs, 16)
            plan_s = time.perf_counter() - t
        except InfeasibleError as e:
            rows.append({"model": name, "config": label, "k": k, "error": str(e)})
            continue
        first = None
        for n in sizes:
            if n % k:
                continue
            dp = n // k
            cl = lassen(n, args.gpus_per_node, 16, args.rails)
            t = time.perf_counter()
            r = simulate(p, g, cluster=cl, dp=dp, dp_bucket_bytes=BUCKET_BYTES)
            wall = time.perf_counter() - t
            row = {"model": name, "config": label, "k": k, "replicas": reps,
                   "microbatches": mbs, "gpus": n, "dp": dp,
                   "global_batch": mbs * reps * dp, "iteration_s": r.iteration_s,
                   "samples_per_s": r.samples_per_s,
                   "efficiency": r.samples_per_s * one_gpu_s / n,
                   "peak_gib": float(r.peak_bytes.max()) / GIB, "fits": r.fits,
                   "sim_wall_s": wall, "plan_wall_s": plan_s,
                   "sim_events": len(r.timeline.events)}
            first = first or row
            row["scaling"] = row["samples_per_s"] / (n / first["gpus"] *
                                                     first["samples_per_s"])
            rows.append(row)
    return rows


def copies_cost(g: Graph, args: argparse.Namespace, sizes: tuple[int, ...]) -> list[dict]:
    """Simulator cost: MAST8 x dp with the copies modelled by the collective cost, against
    the same copies expanded into the graph and simulated rank by rank."""
    p = plan_group(g, 8, "mast", 2, 1, 16)
    rows = []
    for n in sizes:
        cl = lassen(n, args.gpus_per_node, 16, args.rails)
        t = time.perf_counter()
        model = simulate(p, g, cluster=cl, dp=n // 8, dp_bucket_bytes=BUCKET_BYTES)
        t_model = time.perf_counter() - t
        t = time.perf_counter()
        copies = simulate(with_dp_copies(p, n // 8), g, cluster=cl)
        t_copies = time.perf_counter() - t
        rows.append({"gpus": n, "model_iteration_s": model.iteration_s,
                     "copies_iteration_s": copies.iteration_s, "model_wall_s": t_model,
                     "copies_wall_s": t_copies, "copies_graph_nodes": g.num_nodes * n // 4})
    return rows


def markdown(doc: dict[str, Any]) -> str:
    lines = ["# `outcore simulate` at scale: DP, pipeline, MAST, MASTER x data parallelism\n",
             f"Command: `{doc['command']}`\n",
             "Simulated, not measured: outcore's discrete-event simulator, analytical V100 "
             "costs.\n", "## Assumptions\n"]
    lines += [f"- **{k}**: {v}" for k, v in doc["assumptions"].items()]
    for name, info in doc["models"].items():
        rows_all = [x for x in doc["rows"] if x["model"] == name]
        lines += [f"\n## {name}: {info['summary']}\n",
                  f"{info['layer_nodes']} layer nodes (planned on {info['nodes']}), "
                  f"{info['params_mib']:.0f} MiB parameters, "
                  f"{info['saved_gib']:.2f} GiB saved activations and "
                  f"{1e3 * info['one_gpu_s']:.1f} ms forward+backward per sample on one "
                  "V100.\n"]
        rows = []
        for x in rows_all:
            if "error" in x:
                rows.append([x["config"], "-", "-", "-", "-", "-", "-",
                             "does not fit: " + x["error"][:70], "-"])
                continue
            rows.append([x["config"], x["gpus"], x["global_batch"],
                         f"{1e3 * x['iteration_s']:.1f}", f"{x['samples_per_s']:.1f}",
                         f"{100 * x['efficiency']:.1f}%", f"{100 * x['scaling']:.1f}%",
                         f"{x['peak_gib']:.1f}" + ("" if x["fits"] else " NO"),
                         f"{x['sim_wall_s']:.2f}"])
        lines.append(fmt_table(["config", "GPUs", "global batch", "iteration ms",
                                "samples/s", "efficiency", "scaling", "peak GiB / 16",
                                "sim wall s"], rows))
        best = {}
        for x in rows_all:
            if "error" not in x and x["fits"]:
                if x["gpus"] not in best or x["samples_per_s"] > best[x["gpus"]]["samples_per_s"]:
                    best[x["gpus"]] = x
        lines.append("\nFastest fitting configuration per size: " + ", ".join(
            f"{n} GPUs: {b['config']} ({b['samples_per_s']:.1f}/s)"
            for n, b in sorted(best.items())) + ".\n")
    if doc.get("copies_cost"):
        lines += ["## Simulator cost: collective model vs copies simulated one by one\n",
                  f"{doc['copies_model']} MAST8 x dp. The copies' all-reduces are "
                  "per-bucket flat rings (no port sharing, no overlap buckets), so the "
                  "iteration times differ slightly; the point is the wall time.\n"]
        rows = [[x["gpus"], x["copies_graph_nodes"], f"{1e3 * x['model_iteration_s']:.1f}",
                 f"{1e3 * x['copies_iteration_s']:.1f}", f"{x['model_wall_s']:.2f}",
                 f"{x['copies_wall_s']:.2f}"] for x in doc["copies_cost"]]
        lines.append(fmt_table(["GPUs", "expanded graph nodes", "model ms", "copies ms",
                                "model wall s", "copies wall s"], rows) + "\n")
    w = [x["sim_wall_s"] for x in doc["rows"] if "sim_wall_s" in x]
    lines.append(f"Simulator wall time: {min(w):.2f}-{max(w):.2f} s per configuration, "
                 f"{sum(w):.1f} s for all {len(w)}; whole benchmark {doc['wall_s']:.0f} s "
                 "(including capture).\n")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet,resnet512,transformer")
    ap.add_argument("--sizes", default="8,16,64,256,1024")
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--rails", type=int, default=1, help="EDR ports per node")
    ap.add_argument("--cache-dir", type=Path, help="save/load the costed graphs here")
    ap.add_argument("--quick", action="store_true", help="8 and 64 GPUs")
    ap.add_argument("--out", type=Path, default=RESULTS / "simulate_scale")
    args = ap.parse_args(argv)
    sizes = [8, 64] if args.quick else [int(s) for s in args.sizes.split(",")]
    t0 = time.perf_counter()
    rows, models, copies = [], {}, []
    for name in args.models.split(","):
        spec, shape, depth, summary = MODELS[name]
        cache = args.cache_dir / f"scale_{name}.json" if args.cache_dir else None
        fine = model_graph(spec, shape, cache)
        g = blocks(fine, depth)
        models[name] = {"spec": spec, "input_shape": list(shape), "summary": summary,
                        "layer_nodes": fine.num_nodes, "depth": depth,
                        "nodes": g.num_nodes, "params_mib": float(g.param_bytes.sum()) / 2**20,
                        "saved_gib": float(g.saved_bytes.sum()) / GIB,
                        "one_gpu_s": float(g.fwd_s.sum() + g.bwd_s.sum())}
        print(f"{name}: {g.num_nodes} nodes", file=sys.stderr)
        rows += sweep(name, g, sizes, args)
        if name == "resnet" and not args.quick:
            copies = copies_cost(g, args, (16, 32, 64))
    doc = {
        "command": "python " + " ".join(shlex.quote(a) for a in
                                        ["benchmarks/simulate_scale.py", *(argv or sys.argv[1:])]),
        "assumptions": {
            "device": "v100 preset (16 GiB; 15.7 TFLOP/s fp32 x 0.7, 900 GB/s), fp32 "
                      "training with Adam (weights + gradients + 2 moments)",
            "cluster": f"{args.gpus_per_node} GPUs per node, nvlink2 preset inside (150 GB/s, "
                       f"5 us), InfiniBand EDR between ({args.rails} x 12.5 GB/s, 1.5 us per "
                       "node); copy d of a K-GPU group on GPUs [dK, dK+K)",
            "groups": "exactly K contiguous stages balanced on time (outcore's pipeline "
                      "partitioner) under 16 GiB / replicas; 1F1B; PPk: 2K micro-batches per "
                      "iteration; MAST/MASTER: one micro-batch per replica (GEMS' batch 1)",
            "data parallel": "D = N / K copies, modelled by each rank's all-reduce over the D "
                             "copies (collective 'auto'), 25 MiB buckets overlapping the "
                             "backward; MAST/MASTER replica all-reduces share the rank's "
                             "collective stream",
            "weak scaling": "work per GPU fixed: the global batch grows with N",
            "not modelled": "stragglers, data loading, kernel launch gaps beyond launch_s, "
                            "network congestion beyond one port per node",
        },
        "models": models, "rows": rows, "copies_cost": copies,
        "copies_model": MODELS["resnet"][3], "wall_s": None,
    }
    doc["wall_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    md = markdown(doc)
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
