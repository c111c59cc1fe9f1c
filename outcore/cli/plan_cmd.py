"""``outcore plan``: partition a graph (or a model) over devices under a memory limit."""

from __future__ import annotations

import argparse

from outcore.cli.common import (MODEL_HELP, add_leaf_arg, add_mesh_args, check_output_suffix,
                                console, is_graph_file, nonneg_int, note, positive_int,
                                degree_arg, slot_label, table)
from outcore.units import format_bytes, format_seconds, parse_shape

DESCRIPTION = """Partition a graph over K devices so that every device's training memory fits
--memory and the iteration is as fast as possible, then predict it with the simulator. Prints
per device: nodes, compute time, peak memory against the limit, bytes sent; the predicted
iteration time and a lower bound (the larger of the critical path and total work / K). Writes
outcore-plan/2 JSON, and with --schedule-out the schedule every rank runs; a MODEL's captured
graph (or one collapsed with --depth) is written beside the plan (PLAN.graph.json) for `outcore
simulate --graph`, which takes a GRAPH.json as it was planned (at the plan's micro-batch when
the search split its batch).
Units: plain numbers are bytes, bytes/s and seconds; or 80GiB, 512MB, 16GB/s, 100Gb/s, 25us,
1.5ms."""


def strategies_help() -> str:
    import outcore
    return "; ".join(f"{k}: {v}" for k, v in outcore.strategies().items())


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="partition a graph over devices under a memory limit",
                       description=DESCRIPTION)
    p.add_argument("source", metavar="GRAPH.json|MODEL",
                   help="an outcore-graph/1 file, or a model (" + MODEL_HELP + ")")
    p.add_argument("--devices", "-k", type=positive_int, required=True, help="number of devices")
    p.add_argument("--memory", metavar="SIZE", help="memory per device (e.g. 80GiB); default: "
                   "unlimited")
    p.add_argument("--bandwidth", default="16GB/s", help="link bandwidth (default 16GB/s)")
    p.add_argument("--latency", default="25us", help="link latency (default 25us)")
    p.add_argument("--strategy", default="auto",
                   help="planner: auto (every planner below, the fastest plan by simulation "
                        "wins); " + strategies_help())
    p.add_argument("--parallel", choices=["mp", "mast", "master"], default="mp",
                   help="mp: one replica split over the devices; mast: GEMS MAST, a second "
                        "replica in reverse order on the same devices; master: GEMS MASTER, as "
                        "many replica pairs as memory allows (default mp)")
    p.add_argument("--replicas", type=positive_int,
                   help="master: number of replicas (default: the fastest that fits)")
    p.add_argument("--dp", type=positive_int, default=1,
                   help="data-parallel copies of the model-parallel group (must divide "
                        "--devices; default 1)")
    add_mesh_args(p)
    p.add_argument("--microbatches", type=microbatch_count, default=1,
                   help="micro-batches per iteration and copy (default 1), or auto: the search "
                        "splits the graph's batch (fewest micro-batches that fit before "
                        "checkpointing)")
    p.add_argument("--layout", choices=["given", "auto"], default="given",
                   help="auto: the search also chooses --dp and the GEMS mode and replicas "
                        "(the graph then holds the global batch); default given")
    p.add_argument("--explain", action="store_true",
                   help="print the best candidates of every layout (time, peak memory, why "
                        "each lost) and draw time against memory beside the plan")
    p.add_argument("--memory-policy", choices=["auto", "none", "checkpoint", "offload"],
                   default="auto",
                   help="when a placement does not fit: auto chooses per piece the cheapest of "
                        "activation checkpointing and CPU offloading that makes it fit, before "
                        "asking for more devices; none, checkpoint or offload restrict it")
    p.add_argument("--device", metavar="PRESET",
                   help="device preset the plan is for (memory model, host link; e.g. a100, "
                        "cpu); default: a generic accelerator")
    p.add_argument("--schedule", choices=["auto", "gpipe", "1f1b"], default="auto",
                   help="pipeline schedule of the micro-batches: 1f1b (one forward, one "
                        "backward: fewest activations held), gpipe (every forward, then every "
                        "backward), or auto (default: the search simulates both on its best "
                        "placement and keeps gpipe only when it is faster)")
    p.add_argument("--optimizer", default="adam",
                   help="optimizer the memory model assumes: adam (4x params), sgd (2x), "
                        "sgd-momentum (3x)")
    p.add_argument("--input-shape", metavar="SHAPE", help="for a MODEL: example input shape")
    p.add_argument("--batch-size", type=int, help="for a MODEL: batch size")
    p.add_argument("--depth", type=nonneg_int, help="plan on blocks of this module depth")
    add_leaf_arg(p)
    p.add_argument("--profile", action="store_true",
                   help="for a MODEL: profile layer times here (default: estimate them)")
    p.add_argument("--estimate", metavar="DEVICE", default=None,
                   help="for a MODEL: device preset whose times to estimate (default cpu)")
    p.add_argument("-o", "--output", default="plan.json", help="plan file (default plan.json)")
    p.add_argument("--picture", metavar="FILE.png|svg",
                   help="also draw the graph coloured by device")
    p.add_argument("--gantt", metavar="FILE.png", help="also draw the simulated timeline")
    p.add_argument("--schedule-out", metavar="FILE.json",
                   help="also write the schedule every rank runs (outcore-schedule/1: one line "
                        "of actions per rank; read back by simulate/train --schedule-file)")
    p.set_defaults(func=run)


def load_or_capture(source: str, args: argparse.Namespace):
    """A graph from a JSON file, or captured and costed from a model name."""
    import outcore

    if is_graph_file(source):
        return outcore.load_graph(source), False
    shape = parse_shape(args.input_shape) if args.input_shape else None
    costs = "profile" if getattr(args, "profile", False) else \
        f"estimate:{args.estimate or 'cpu'}"
    return outcore.model_graph(source, input_shape=shape, batch_size=args.batch_size,
                               costs=costs, leaves=tuple(getattr(args, "leaf", ()))), True


def run(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    import outcore

    outcore.api.keep_freed_memory()  # the search remakes graph-sized arrays; the process ends
    out = check_output_suffix(args.output, (".json",))
    schedule_out = check_output_suffix(args.schedule_out, (".json",)) \
        if args.schedule_out else None
    g, captured = load_or_capture(args.source, args)
    if args.depth is not None:
        g = outcore.collapse(g, args.depth)
    with Progress(transient=True, console=console, disable=not console.is_terminal) as bar:
        # the layout search's layouts, and a refusal's checks of what would fit
        task = bar.add_task("planning", total=1)
        p = _planned(g, args, lambda phase, d, n: bar.update(
            task, description=phase, completed=d, total=max(n, 1)))
    whole, g = g, outcore.api.microbatch_graph(g, p)
    outcore.save_plan(p, out)
    note(f"wrote {out}")
    # a graph captured or collapsed here exists nowhere else: written at the plan's micro-batch
    if captured or args.depth is not None:
        gpath = out.with_name(out.stem + ".graph.json")
        outcore.save_graph(g, gpath)
        note(f"wrote {gpath} (the graph the plan is for: outcore simulate {out} --graph {gpath})")
    elif g is not whole:  # simulate rescales the input as this did (outcore.api.lower)
        note(f"the plan is for micro-batches of {g.batch_size} samples: outcore simulate {out} "
             f"--graph {args.source} simulates them")
    if schedule_out:
        outcore.save_schedule(outcore.lower(p, g), schedule_out)
        note(f"wrote {schedule_out}")
    print_plan(g, p)
    if args.explain:
        print_explain(p)
        pic = outcore.api.draw_candidates(p, out.with_name(out.stem + ".candidates.png"))
        note(f"wrote {pic}")
    if args.picture:
        check_output_suffix(args.picture, (".png", ".svg"))
        outcore.draw_graph(g, args.picture, assignment=p.assignment,
                           title=f"{g.name}: {p.strategy}")
        note(f"wrote {args.picture}")
    if args.gantt:
        check_output_suffix(args.gantt, (".png", ".svg"))
        outcore.draw_timeline(outcore.simulate(p, g).timeline, args.gantt)
        note(f"wrote {args.gantt}")
    return 0


def _planned(g, args: argparse.Namespace, progress):
    """``outcore.plan`` with the command's options (``progress`` follows the layouts)."""
    import outcore
    return outcore.plan(g, args.devices, args.memory, progress=progress,
                        strategy=args.strategy, parallel=args.parallel,
                        replicas=args.replicas, dp=args.dp,
                        tp=degree_arg(args.tp, args.layout == "auto"),
                        depth=degree_arg(args.shard, args.layout == "auto"), sp=args.sp,
                        sp_join=args.sp_join, sp_grid=args.sp_grid,
                        bandwidth=args.bandwidth, latency=args.latency,
                        microbatches=args.microbatches, schedule=args.schedule,
                        optimizer=args.optimizer, memory_policy=args.memory_policy,
                        device=args.device, search_layout=args.layout == "auto")


def print_plan(g, p) -> None:
    import outcore
    pred = p.predicted
    K = p.devices // p.layout.tp  # device slots (tp ranks each)
    nodes, compute, copies = outcore.device_loads(p, g)
    peaks = pred.get("peak_bytes", [0] * K)
    sent = pred.get("comm_bytes", [0] * K)
    limit = p.memory_bytes
    rows = []
    for d in range(K):
        use = f"{format_bytes(peaks[d])}" + (f" / {format_bytes(limit)}" if limit else "")
        rows.append([slot_label(d, p.layout.tp), int(nodes[d]),
                     format_seconds(float(compute[d])), use, format_bytes(sent[d])])
    how = ", ".join([p.strategy] + ([p.layout.describe()] if p.layout.describe() else []))
    console.print(table(f"plan: {how} on {p.devices} devices ({g.name})",
                        ["device", "nodes", "compute", "peak memory", "sent"], rows))
    lb = pred.get("lower_bound_s")
    it = pred.get("iteration_s")
    console.print(f"predicted iteration {format_seconds(it)}"
                  + (f"   lower bound {format_seconds(lb)}" if lb else "")
                  + (f"   ({lb / it:.0%} of optimal)" if lb and it else "")
                  + f"   schedule {p.schedule}, {p.microbatches} micro-batch"
                  + ("es" if p.microbatches > 1 else "")
                  + (f" x {copies} copies" if copies > 1 else "")
                  + f"   {pred.get('samples_per_s', 0):.1f} samples/s")
    if p.spatial is not None:
        dp = p.layout.dp   # SP + DP: the extra tile ranks of every copy follow all slots
        console.print(f"spatial: {p.spatial.grid} tiles on ranks {p.spatial.stage} and "
                      f"{p.stages * dp}..{p.devices - 1}" + (f" ({dp} copies)" if dp > 1 else "")
                      + f", join after {p.spatial.join} "
                      f"({len(p.spatial.tiled)} nodes on tiles): {p.spatial.reason}")
    for line in policy_lines(p):
        console.print(line)
    for line in p.notes:
        console.print(f"  note: {line}")


def policy_lines(p) -> list[str]:
    """One line per device that uses memory policies (what the plan chose)."""
    pol = p.policies
    if pol is None:
        return []
    per: dict[int, dict[str, int]] = {}
    for grp in pol.to_dict(p.node_ids, p.assignment)["groups"]:
        d = per.setdefault(grp["device"], {})
        d[grp["policy"]] = d.get(grp["policy"], 0) + grp["nodes"]
    return [f"memory policies on device {d}: " + ", ".join(f"{k} on {v} nodes"
                                                         for k, v in sorted(kinds.items()))
            for d, kinds in sorted(per.items())]


def microbatch_count(text: str) -> int | str:
    """``auto`` or a positive integer."""
    return "auto" if text == "auto" else positive_int(text)


def print_explain(p, top: int = 12) -> None:
    """The search's best candidates as a table (``--explain``)."""
    from outcore import api
    rows = []
    for r in api.explain(p)[:top]:
        t = format_seconds(r["iteration_s"]) if r["iteration_s"] is not None else "-"
        m = format_bytes(r["peak_bytes"]) if r["peak_bytes"] is not None else "-"
        rows.append([r["layout"], r["memory_policy"] or "-", r["strategy"] or "-", t, m,
                     r["why"]])
    console.print(table("candidates (best first)", ["layout", "memory policy", "placement",
                                                     "iteration", "peak memory", "outcome"],
                        rows))
