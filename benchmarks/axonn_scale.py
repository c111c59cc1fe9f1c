"""Simulated: GPT-style models at AxoNN's scale on an A100 cluster, with outcore's dp x pp x tp.

Seed (Singh et al., "Democratizing AI: Open-source Scalable LLM Training on GPU-based
Supercomputers", SC 2024, AxoNN; seed 004): a 40B-parameter GPT on 4,096 A100s of Perlmutter at
49% of peak bf16 flop/s (620.1 PFlop/s), global batch 16.8M tokens; weak scaling 5B-40B on
512-4,096 GPUs. Here each model's layer graph is generated without torch
(:mod:`outcore.graph.gpt`), costed for the A100 preset (:func:`outcore.cost.analytical.estimate`),
and for every dp x pp x tp layout (tp 1, 2, 4, 8 inside a node; pp a divisor of the layer
count or a power of two up to 32; dp the rest; micro-batches of 1-8 sequences, at most 128 per
copy) planned with ``outcore.plan(..., tp=T, strategy="pipeline")`` on ``pp x tp`` devices and
simulated with ``outcore.simulate(..., dp=D)``. Layouts are tried in order of a compute lower
bound (one tensor-parallel rank's micro-batch time, collectives included, / pp x (M + pp - 1))
after a memory bound (16 bytes of state per parameter / (pp x tp) within 85% of the device);
the search stops when the bound exceeds the best simulated time, or after ``--max-sims``.

    .venv/bin/python benchmarks/axonn_scale.py [--memory 40GiB] [--max-sims 12] [--only 5B]

Writes ``benchmarks/results/axonn_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).with_name("results")
GIB = 2 ** 30
SEQS = 8192            # 8,192 sequences x 2,048 tokens = 16.8M tokens (the seed's batch)
PEAK_BF16 = 312e12     # A100 dense bf16 tensor-core peak, the seed's denominator
PER_NODE = 8           # DGX/HGX A100: 8 GPUs on NVSwitch, one HDR NIC per GPU

# (name, layers, hidden, heads, GPUs): AxoNN's GPT shapes for its weak-scaling runs
# (12 L d^2 = 4.8B, 10.1B, 19.7B, 38.7B), as we read the paper; vocabulary 51,200, sequence 2,048.
MODELS = [("5B", 24, 4096, 32, 512), ("10B", 32, 5120, 40, 1024),
          ("20B", 32, 7168, 56, 2048), ("40B", 38, 9216, 72, 4096)]
SEED = {"40B": {"gpus": 4096, "pct_peak": 49.0, "pflops": 620.1, "batch_tokens": 16.8e6}}


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    mb_seqs: int       # sequences per micro-batch
    microbatches: int  # per iteration and data-parallel copy
    bound_s: float     # compute lower bound of the iteration


def pp_options(layers: int) -> list[int]:
    """Pipeline depths: divisors of the layer count and powers of two, up to 32 (the
    pipeline planner balances uneven stages itself)."""
    return sorted({p for p in range(1, min(layers, 32) + 1) if layers % p == 0}
                  | {p for p in (2, 4, 8, 16, 32) if p <= layers})


def layouts(shape, gpus: int, shard_s, memory_bytes: float) -> list[Layout]:
    """Every dp x pp x tp x micro-batch layout that passes the memory bound, by time bound.

    ``shard_s(tp, b)``: forward + backward seconds of one micro-batch of ``b`` sequences on one
    rank of a ``tp`` group, tensor-parallel collectives included. The bound,
    ``shard_s / pp x (M + pp - 1)``, leaves out pipeline messages, stage imbalance and the
    data-parallel all-reduce, so no simulated layout can beat it.
    """
    out = []
    for tp in (1, 2, 4, 8):
        if shape.heads % tp:
            continue
        for pp in pp_options(shape.layers):
            if gpus % (tp * pp) or 16.0 * shape.params / (tp * pp) > 0.85 * memory_bytes:
                continue
            dp = gpus // (tp * pp)
            if SEQS % dp:
                continue
            for b in (1, 2, 4, 8):
                m = SEQS // dp // b
                if m * b * dp != SEQS or m < pp or m > 128:
                    continue
                bound = shard_s(tp, b) / pp * (m + pp - 1)
                out.append(Layout(tp, pp, dp, b, m, bound))
    return sorted(out, key=lambda x: (x.bound_s, x.tp, x.pp, x.mb_seqs))


def run_layout(shape, lay: Layout, cluster, memory_bytes: float) -> dict:
    import outcore
    from outcore.cost.analytical import estimate
    from outcore.errors import OutcoreError
    from outcore.graph.gpt import make_gpt
    from outcore.plan.request import PlanRequest

    g = estimate(make_gpt(shape, batch=lay.mb_seqs), "a100")
    row = {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "mb_seqs": lay.mb_seqs,
           "microbatches": lay.microbatches, "bound_s": lay.bound_s}
    t0 = time.perf_counter()
    try:
        req = PlanRequest.make(lay.pp * lay.tp, memory_bytes, cluster=cluster, tp=lay.tp,
                               strategy="pipeline", microbatches=lay.microbatches)
        plan = outcore.plan(g, req)
        sim = outcore.simulate(plan, g, dp=lay.dp, cluster=cluster)
    except OutcoreError as e:
        row.update(ok=False, why=str(e).splitlines()[0][:200])
        return row
    pol = sorted({p for p in (sim.costs.policies or ()) if p != "none"})
    row.update(ok=bool(sim.peak_bytes.max() <= memory_bytes), iteration_s=sim.iteration_s,
               peak_gib=float(sim.peak_bytes.max() / GIB), busy_s=float(sim.busy_s.max()),
               policies=pol or ["none"], stages_used=int(plan.devices_used or lay.pp),
               planner_makespan_s=plan.predicted.get("planner_makespan_s"),
               wall_s=time.perf_counter() - t0)
    return row


def scale(name, layers, hidden, heads, gpus, memory_bytes, max_sims, log) -> dict:
    import outcore
    from outcore.cost.analytical import estimate
    from outcore.cost.tensor import tensor_graph
    from outcore.graph.gpt import GPTShape, make_gpt

    shape = GPTShape(layers=layers, hidden=hidden, heads=heads)
    cluster = replace(outcore.cluster_of(gpus, per_node=PER_NODE, device="a100",
                                         intra="nvlink3", inter="ib-hdr",
                                         memory_bytes=memory_bytes), nics_per_node=PER_NODE)
    cache: dict[tuple[int, int], float] = {}

    def shard_s(tp: int, b: int) -> float:
        if (tp, b) not in cache:
            g = tensor_graph(estimate(make_gpt(shape, batch=b), "a100"), tp, cluster.intra)[0]
            cache[tp, b] = float(g.fwd_s.sum() + g.bwd_s.sum())
        return cache[tp, b]

    cands = layouts(shape, gpus, shard_s, memory_bytes)
    tried, best = [], None
    for lay in cands:
        if len(tried) >= max_sims or (best and lay.bound_s >= best["iteration_s"]):
            break
        row = run_layout(shape, lay, cluster, memory_bytes)
        tried.append(row)
        log(f"  {name} tp{lay.tp} pp{lay.pp} dp{lay.dp} b{lay.mb_seqs} M{lay.microbatches}: "
            + (f"{row['iteration_s']:.2f} s, peak {row['peak_gib']:.1f} GiB"
               f"{'' if row['ok'] else ' (does not fit)'}" if "iteration_s" in row
               else row.get("why", "")))
        if row.get("ok") and (best is None or row["iteration_s"] < best["iteration_s"]):
            best = row
    tokens = SEQS * shape.seq
    flops = shape.model_flops(tokens)
    res = {"model": name, "params": shape.params, "layers": layers, "hidden": hidden,
           "heads": heads, "gpus": gpus, "candidates": len(cands), "simulated": len(tried),
           "model_flops": flops, "tried": tried, "best": best}
    if best:
        res["pct_peak"] = 100.0 * flops / (best["iteration_s"] * gpus * PEAK_BF16)
        res["pflops"] = flops / best["iteration_s"] / 1e15
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memory", default="40GiB", help="per-GPU memory (40GiB or 80GiB)")
    ap.add_argument("--max-sims", type=int, default=12, help="layouts simulated per model")
    ap.add_argument("--only", default="", help="comma-separated model names (5B,10B,...)")
    args = ap.parse_args()
    from outcore.units import parse_bytes

    logging.basicConfig(level=logging.WARNING)
    memory_bytes = float(parse_bytes(args.memory))
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    t0 = time.perf_counter()
    rows = [scale(*m, memory_bytes, args.max_sims, print) for m in MODELS
            if not only or m[0] in only]
    print(f"\n{'model':>5} {'GPUs':>5} {'dp x pp x tp':>13} {'mb':>3} {'M':>4} {'iter s':>7} "
          f"{'peak GiB':>8} {'%peak':>6} {'PFlop/s':>8} {'seed':>12}")
    for r in rows:
        b, seed = r["best"], SEED.get(r["model"])
        seed_s = f"{seed['pct_peak']:.0f}% {seed['pflops']:.0f}" if seed else "-"
        if b is None:
            print(f"{r['model']:>5} {r['gpus']:>5}  nothing fits in {args.memory}")
            continue
        print(f"{r['model']:>5} {r['gpus']:>5} {b['dp']:>4}x{b['pp']:>2}x{b['tp']:>2}    "
              f"{b['mb_seqs']:>3} {b['microbatches']:>4} {b['iteration_s']:>7.2f} "
              f"{b['peak_gib']:>8.1f} {r['pct_peak']:>6.1f} {r['pflops']:>8.1f} {seed_s:>12}")
    out = {"memory": args.memory, "global_batch_seqs": SEQS, "seq": 2048,
           "peak_flops_per_gpu": PEAK_BF16, "per_node": PER_NODE, "seed": SEED,
           "assumptions": ASSUMPTIONS, "wall_s": time.perf_counter() - t0, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "axonn_scale.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path} ({out['wall_s']:.0f} s)")


ASSUMPTIONS = [
    "global batch 8,192 sequences x 2,048 tokens = 16.8M tokens (the seed's), vocabulary 51,200",
    ("bf16 activations; 16 bytes of weight+gradient+Adam state per parameter (param_bytes fp32 "
    "x Adam's 4); data-parallel gradients all-reduced in fp32"),
    ("A100 preset: 312 TFLOP/s bf16 peak at the preset's 70% matmul efficiency, 1,555 GB/s; "
    "8 GPUs per node on NVLink3 (300 GB/s per direction), one InfiniBand HDR NIC (25 GB/s) "
    "per GPU between nodes (DGX A100)"),
    ("1F1B pipeline; outcore's memory policy 'auto' (recomputes only when a stage does not fit); "
    "tensor-parallel collectives synchronous (not overlapped); each piece's data-parallel "
    "all-reduce (two-level: NVLink, then InfiniBand) starts when its last backward ends"),
    ("model FLOPs = 72 T L d^2 (1 + s/6d + V/12Ld) (Narayanan et al. 2021, no recomputation): "
    "6 x params x tokens plus attention; %-of-peak against 312 TFLOP/s per GPU"),
]


if __name__ == "__main__":
    main()
