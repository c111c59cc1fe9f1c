"""Sub-graph parallelism (SUPER) against data parallelism, ParDNN and pipelining.

Every time is one training iteration of the same global batch, from the planners' node-level
emulator (``outcore.placers.emulate``, what the planners optimise) and, as a cross-check, the
schedule simulator (``outcore.sim.simulate``: the 1F1B schedule the runtime would execute),
plus the alpha-beta ring all-reduce (``outcore.sim.ring_allreduce_s``) where there are replicas;
compute + all-reduce are summed, not overlapped (Horovod-style overlap would shorten DP and D&SP
alike).

* **DP** (K devices): each device runs the whole graph on 1/K of the batch (costs and activation
  bytes scaled by 1/K) then all-reduces every gradient: ``work(B) / K + ring(params, K)``.
* **subgraph / pardnn** (K devices): the graph at the whole batch placed by the planner; no
  replica, so no all-reduce. **pipeline**: contiguous stages with M = 2K micro-batches of B/M.
* **D&SP(S)** (SUPER section IV): K/S replicas of an S-device sub-graph-parallel plan, each on
  S/K of the batch: ``subgraph(B * S / K, S) + max over devices d of ring(params on d, K/S)``; each
  device all-reduces only its share of the parameters, and the planner ranks its candidates by
  that sum (``subgraph.plan(..., dp=...)``). **D&P(S)**: the same with ParDNN inside the group,
  its candidates re-ranked the same way (is it the branches, or any model parallelism, that
  helps?).

Scenario A, one machine: K = 4 and 8 A100s over NVLink 3 (300 GB/s, 5 us), fixed global batch.
Scenario B, weak scaling on machines of 4 A100s (NVLink 3 inside, InfiniBand HDR 25 GB/s
between, as LLNL Lassen's nodes of 4 GPUs): a fixed batch per device, K = 4 .. 1024; a ring that
spans machines runs at the InfiniBand rate (every device a full-rate ring member: a flat model
that charges DP and D&SP alike per byte).

Costs: the zoo models are traced with torch.fx (no layer is run) and costed by the analytical
A100 model (``outcore.cost.analytical.estimate``) at a reference batch, then scaled linearly with
the batch (kernel launch overheads do not shrink in reality: small per-device batches favour DP
and D&SP here); the synthetic graphs (``outcore.graph.generators``) carry their own costs.

    .venv/bin/python benchmarks/subgraph_vs_dp.py           # ~1 min
    .venv/bin/python benchmarks/subgraph_vs_dp.py --quick   # fewer models and device counts

Writes ``benchmarks/results/subgraph_vs_dp.json`` and ``subgraph_vs_dp.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from outcore.graph.generators import make_nas, make_transformer
from outcore.graph.ir import Graph
from outcore.hardware.presets import device_preset, link_preset
from outcore.hardware.spec import Cluster
from outcore.placers import pardnn, partition, subgraph
from outcore.placers.context import make_context
from outcore.placers.result import compact
from outcore.placers.subgraph.branches import find_branches
from outcore.sim import ring_allreduce_s

RESULTS = Path(__file__).resolve().parent / "results"
ZOO_BATCH = 32   # global batch of the zoo models in scenario A (their reference batch)
PER_DEVICE = 4   # samples per device in scenario B (zoo models; synthetic: their batch / 8)
NODE = 4         # devices per machine in scenario B (Lassen: 4 V100 per node)


# ------------------------------------------------------------------ models
def zoo(spec: str, batch: int) -> Graph:
    """Trace a zoo model (torch.fx; no layer runs) and cost it with the A100 analytical model."""
    from outcore.cost.analytical import estimate
    from outcore.graph.capture import capture
    from outcore.zoo import resolve_model

    s = resolve_model(spec, batch_size=batch)
    return estimate(capture(s.build(), s.example_inputs), "a100")


def models(quick: bool) -> list[tuple[str, Graph, int]]:
    """(label, graph at its reference global batch, that batch)."""
    heads = (4, 16) if quick else (4, 8, 16)
    out = [(f"zoo transformer, {h} heads",
            zoo(f"outcore:transformer:layers=4,heads={h},d_model=512,seq=128,vocab=4096",
                ZOO_BATCH), ZOO_BATCH) for h in heads]
    out.append(("zoo amoebanet (64 ch)", zoo("outcore:amoebanet:channels=64", ZOO_BATCH),
                ZOO_BATCH))
    if not quick:
        out.append(("synthetic transformer (2k nodes)", make_transformer(2000, seed=0), 4))
        out.append(("synthetic nas (2k nodes)", make_nas(2000, seed=0), 64))
    return out


def scaled(g: Graph, factor: float) -> Graph:
    """``g`` with the batch scaled by ``factor``: times and activation bytes scale, params not."""
    def by(x: np.ndarray) -> np.ndarray:
        return np.rint(x * factor).astype(np.int64)

    return g.replace(fwd_s=g.fwd_s * factor, bwd_s=g.bwd_s * factor, out_bytes=by(g.out_bytes),
                     saved_bytes=by(g.saved_bytes), edge_bytes=by(g.edge_bytes),
                     batch_size=None if g.batch_size is None else g.batch_size * factor)


# ------------------------------------------------------------------ clusters and strategies
def cluster(devices: int, per_node: int) -> Cluster:
    nodes = -(-devices // per_node)
    return Cluster(device_preset("a100"), nodes=nodes, devices_per_node=min(per_node, devices),
                   intra=link_preset("nvlink3"), inter=link_preset("ib-hdr"))


def ring_link(replicas: int, group: int, per_node: int):
    """The link a ring of ``replicas`` (one per group of ``group`` devices) runs at."""
    return link_preset("nvlink3") if replicas * group <= per_node else link_preset("ib-hdr")


def work_s(g: Graph) -> float:
    return float(g.fwd_s.sum() + g.bwd_s.sum())


def dp_s(g: Graph, k: int, per_node: int) -> float:
    """DP: the whole graph on 1/K of the batch, then a ring all-reduce of every gradient."""
    return work_s(g) / k + ring_allreduce_s(float(g.param_bytes.sum()), k,
                                            ring_link(k, 1, per_node))


def simulated_s(g: Graph, assignment: np.ndarray, cl: Cluster, microbatches: int = 1) -> float:
    """The schedule simulator's iteration (the 1F1B schedule the runtime would execute).

    Pieces (connected same-device, same-hop node sets) run whole and send their outputs when
    they end (``outcore.schedule.build``); sends and receives contend for each device's port.
    """
    from outcore.plan.plan import make_plan
    from outcore.sim.simulate import simulate

    a, _ = compact(assignment)
    k = int(a.max()) + 1
    plan = make_plan(g, a, strategy="bench", devices=k, memory_bytes=None,
                     microbatches=microbatches, schedule="1f1b")
    return simulate(plan, g, cluster=cl).iteration_s


def hybrid(g: Graph, k: int, s: int, strategy: str, per_node: int, sim: bool = False) -> dict:
    """D&SP / D&P: K/S replicas of an S-device ``strategy`` plan, each on S/K of the batch.

    Both planners' candidates are ranked by makespan + the slowest device's all-reduce (the
    sub-graph planner's ``dp`` option; ParDNN's candidate list re-ranked the same way).
    """
    r = k // s
    part = scaled(g, s / k)
    dp = subgraph.DataParallel(r, ring_link(r, s, per_node))
    cl = cluster(s, per_node)
    ctx = make_context(part, s, cluster=cl)
    if strategy == "subgraph":
        best, notes, _ = subgraph.plan(ctx, dp=dp)
    else:
        _, notes, cands = pardnn.plan(ctx)
        best = min((c for c in cands if c.fits),
                   key=lambda c: c.makespan_s + subgraph.allreduce_s(part, c.assignment, dp))
    ar = subgraph.allreduce_s(part, best.assignment, dp)
    used = int(np.unique(best.assignment).size)
    out = {"iteration_s": best.makespan_s + ar, "compute_s": best.makespan_s,
           "allreduce_s": ar, "devices_used": used * r, "chose": best.label}
    if sim:
        out["sim_iteration_s"] = simulated_s(part, best.assignment, cl) + ar
    return out


def single(g: Graph, k: int, strategy: str, microbatches: int = 1) -> dict:
    part = scaled(g, 1.0 / microbatches)
    cl = cluster(k, k)
    p = partition(part, k, strategy=strategy, cluster=cl, microbatches=microbatches)
    return {"iteration_s": p.makespan_s, "devices_used": p.devices_used, "chose": p.notes[-1],
            "sim_iteration_s": simulated_s(part, p.assignment, cl, microbatches)}


# ------------------------------------------------------------------ scenarios
def scenario_a(label: str, g: Graph, ks: list[int]) -> list[dict]:
    rows = []
    for k in ks:
        row = {"model": label, "k": k, "one_device_s": work_s(g),
               "dp": {"iteration_s": dp_s(g, k, k)},
               "subgraph": single(g, k, "subgraph"), "pardnn": single(g, k, "pardnn"),
               "pipeline": single(g, k, "pipeline", microbatches=2 * k)}
        for s in (2, 4):
            if s < k:
                row[f"d&sp{s}"] = hybrid(g, k, s, "subgraph", k, sim=True)
        rows.append(row)
    return rows


def scenario_b(label: str, g: Graph, batch: int, ks: list[int]) -> list[dict]:
    per_device = PER_DEVICE if label.startswith("zoo") else max(1, batch // 8)
    rows = []
    for k in ks:
        gk = scaled(g, per_device * k / batch)  # global batch = per_device x K
        row = {"model": label, "k": k, "global_batch": per_device * k,
               "dp": {"iteration_s": dp_s(gk, k, NODE)}}
        for s in (2, 4):
            if s <= min(k, NODE):
                row[f"d&sp{s}"] = hybrid(gk, k, s, "subgraph", NODE, sim=True)
                row[f"d&p{s}"] = hybrid(gk, k, s, "pardnn", NODE, sim=True)
        rows.append(row)
    return rows


# ------------------------------------------------------------------ tables
def fmt_ms(x: float) -> str:
    return f"{x * 1e3:.2f}" if x < 10 else f"{x * 1e3:.0f}"


def table_a(rows: list[dict]) -> str:
    cols = ["subgraph", "pardnn", "pipeline", "d&sp2", "d&sp4"]
    head = ("| model | K | 1 device | DP | subgraph | pardnn | pipeline (M=2K) | D&SP S=2 | "
            "D&SP S=4 | best vs DP (sim) |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        cells = [f"{fmt_ms(r[c]['iteration_s'])} / {fmt_ms(r[c]['sim_iteration_s'])}"
                 if c in r else "-" for c in cols]
        best = min((r[c]["sim_iteration_s"], c) for c in cols if c in r)
        lines.append(f"| {r['model']} | {r['k']} | {fmt_ms(r['one_device_s'])} | "
                     f"{fmt_ms(r['dp']['iteration_s'])} | " + " | ".join(cells)
                     + f" | {r['dp']['iteration_s'] / best[0]:.2f}x ({best[1]}) |")
    return "\n".join(lines)


def table_b(rows: list[dict]) -> str:
    head = ("| model | K | global batch | DP | DP all-reduce share | D&SP S=2 | D&SP S=4 | "
            "D&P S=2 (ParDNN) | D&P S=4 (ParDNN) | D&SP / DP speed-up |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        dp = r["dp"]["iteration_s"]
        cols = [c for c in ("d&sp2", "d&sp4") if c in r]
        cells = [f"{fmt_ms(r[c]['iteration_s'])} / {fmt_ms(r[c]['sim_iteration_s'])}"
                 if c in r else "-" for c in ("d&sp2", "d&sp4", "d&p2", "d&p4")]
        share = 1.0 - r["dp_compute_s"] / dp
        em = dp / min(r[c]["iteration_s"] for c in cols)
        sim = dp / min(r[c]["sim_iteration_s"] for c in cols)
        lines.append(f"| {r['model']} | {r['k']} | {r['global_batch']} | {fmt_ms(dp)} | "
                     f"{share:.0%} | " + " | ".join(cells) + f" | {em:.2f}x / {sim:.2f}x |")
    return "\n".join(lines)


def regions_line(label: str, g: Graph) -> str:
    br = find_branches(g)
    widths = sorted({r.num_branches for r in br.regions})
    share = sum(float(r.work_s.sum()) for r in br.regions) / max(work_s(g), 1e-30)
    return (f"| {label} | {g.num_nodes} | {len(br.regions)} | {', '.join(map(str, widths))} | "
            f"{share:.0%} | {g.param_bytes.sum() / 2**20:.0f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    ks_a = [4] if args.quick else [4, 8]
    ks_b = [4, 64, 1024] if args.quick else [4, 16, 64, 256, 1024]
    ms = models(args.quick)
    rows_a, rows_b, info = [], [], []
    for label, g, batch in ms:
        info.append(regions_line(label, g))
        rows_a += scenario_a(label, g, ks_a)
        for row in scenario_b(label, g, batch, ks_b):
            per_device = PER_DEVICE if label.startswith("zoo") else max(1, batch // 8)
            row["dp_compute_s"] = work_s(g) * per_device / batch
            rows_b.append(row)
        print(f"{label}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
    md = "\n\n".join([
        "# Sub-graph parallelism (SUPER) vs data parallelism, by emulation and simulation",
        "Command: `.venv/bin/python benchmarks/subgraph_vs_dp.py" + (" --quick`" if args.quick
                                                                     else "`")
        + f"; wall time {time.perf_counter() - t0:.0f} s. Iteration times in ms (lower is "
        "better); method and caveats in the script's docstring and `docs/subgraph.md`.",
        "## Branches found",
        "| model | nodes | regions | branches per region | work in branches | params (MiB) |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(info),
        "## A. One machine, K A100s over NVLink 3, fixed global batch",
        "Cells: emulated / simulated ms. *Emulated*: the planners' node-level emulator (what "
        "they optimise; earliest micro-batch first, GPipe-like). *Simulated*: the schedule "
        "simulator running the 1F1B schedule the runtime executes (a node whose output another "
        "device consumes ends its piece; ports contend). DP and "
        "the all-reduce of D&SP are the formula of the docstring in both.",
        table_a(rows_a),
        f"## B. Weak scaling, {PER_DEVICE} samples per device (synthetic: batch / 8), "
        f"machines of {NODE} A100s, InfiniBand HDR between them",
        "Cells: emulated / simulated ms (the group's plan; the all-reduce by the formula).",
        table_b(rows_b)])
    print(md)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "subgraph_vs_dp.md").write_text(md + "\n")
    (RESULTS / "subgraph_vs_dp.json").write_text(json.dumps(
        {"scenario_a": rows_a, "scenario_b": rows_b}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
