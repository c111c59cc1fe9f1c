"""``outcore simulate``: predict one training iteration of a plan."""

from __future__ import annotations

import argparse
import json
import sys

from outcore.cli.common import check_output_suffix, console, note, positive_int, slot_label, table
from outcore.units import format_bytes, format_seconds

DESCRIPTION = """Simulate one training iteration of a plan event by event: each device runs
its actions (forward/backward of a piece for a micro-batch, sends, receives, all-reduces) on one
compute stream; messages cost latency + bytes / bandwidth with per-link contention. Prints the
iteration time and, per device, busy time, bubbles, bytes sent and peak memory; --json prints
the same as JSON. --trace writes a Chrome trace (open in Perfetto), --gantt a PNG timeline with
memory over time. Exits 1 when a device's simulated peak passes the plan's memory limit (after
printing everything), so scripts can gate on it; 2 on an error."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="predict one training iteration of a plan",
                       description=DESCRIPTION)
    p.add_argument("plan", metavar="PLAN.json", help="a plan from `outcore plan`")
    p.add_argument("--graph", metavar="GRAPH.json", required=True,
                   help="the graph the plan was made for (the one `outcore plan` read: "
                        "rescaled to the plan's micro-batch when its search split the batch)")
    p.add_argument("--microbatches", type=positive_int, help="default: the plan's")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], help="default: the plan's")
    p.add_argument("--dp", type=positive_int, default=1,
                   help="data-parallel replicas of the whole plan (collective cost model)")
    p.add_argument("--batch-size", type=positive_int,
                   help="samples per iteration (default: the graph's batch)")
    p.add_argument("--tp", type=positive_int,
                   help="what if every device slot of the plan were this many tensor-parallel "
                        "ranks (default: the plan's own tp)")
    c = p.add_argument_group("cluster (default: the flat network the plan was made for)")
    c.add_argument("--nodes", type=positive_int, help="machines; with --gpus-per-node, the "
                   "plan's devices and its --dp copies are laid out node by node")
    c.add_argument("--gpus-per-node", type=positive_int, help="devices per machine")
    c.add_argument("--device", help="device preset (v100, a100, h100, ...; default: v100)")
    c.add_argument("--intra", default="nvlink2", help="intra-node link preset (nvlink2, "
                   "nvlink, pcie3, ...; default nvlink2)")
    c.add_argument("--inter", default="ib-edr", help="inter-node link preset (ib-edr, ib-hdr, "
                   "100gbe, ...; default ib-edr)")
    c.add_argument("--collective", default="auto",
                   choices=["auto", "hierarchical", "hierarchical-rhd", "ring"],
                   help="data-parallel all-reduce model (see docs/gems.md; default auto)")
    c.add_argument("--dp-bucket", metavar="SIZE", default="0",
                   help="gradient bucket (e.g. 25MiB as DDP): all-reduce overlaps each "
                   "piece's last backward; 0 (default): starts after it")
    c.add_argument("--dp-fused", action="store_true", help="one all-reduce of each device's "
                   "gradients after its whole backward (GEMS/torchgems), not one per piece")
    p.add_argument("--schedule-file", metavar="FILE.json",
                   help="simulate this schedule's action lists (outcore plan --schedule-out; "
                        "checked against the plan) instead of the plan's own lowering")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--trace", metavar="FILE.json", help="write a Chrome/Perfetto trace")
    p.add_argument("--gantt", metavar="FILE.png", help="draw the timeline and memory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import outcore
    from outcore.units import parse_bytes

    outcore.api.keep_freed_memory()  # as outcore plan does; this process ends with it
    g = outcore.load_graph(args.graph)
    p = outcore.load_plan(args.plan, g)
    if args.tp and args.tp != p.layout.tp:
        p = outcore.with_tensor_parallel(p, args.tp)
        note(f"every device slot widened to {args.tp} tensor-parallel ranks: {p.devices} ranks")
    if args.nodes or args.gpus_per_node:
        cl = outcore.cluster_of(p.devices * args.dp, nodes=args.nodes,
                                per_node=args.gpus_per_node, device=args.device or "v100",
                                intra=args.intra, inter=args.inter,
                                memory_bytes=p.memory_bytes)
        r = outcore.simulate(p, g, cluster=cl, microbatches=args.microbatches,
                             schedule=args.schedule, dp=args.dp, global_batch=args.batch_size,
                             collective=args.collective,
                             dp_bucket_bytes=float(parse_bytes(args.dp_bucket)),
                             dp_fused=args.dp_fused, schedule_file=args.schedule_file)
        note(f"cluster: {cl.nodes} nodes x {cl.devices_per_node} {cl.device.name}, "
             f"{args.intra} inside, {args.inter} between; dp all-reduce: {args.collective}")
    else:
        r = outcore.simulate(p, g, microbatches=args.microbatches, schedule=args.schedule,
                             dp=args.dp, global_batch=args.batch_size,
                             schedule_file=args.schedule_file)
    if args.trace:
        outcore.save_chrome_trace(check_output_suffix(args.trace, (".json",)), [r.timeline])
        note(f"wrote {args.trace}")
    if args.gantt:
        outcore.draw_timeline(r.timeline, check_output_suffix(args.gantt, (".png", ".svg")))
        note(f"wrote {args.gantt}")
    if args.json:
        print(json.dumps({**r.to_dict(), "fits": r.fits}, indent=1))
        return _fit_status(r, p)
    rows = []
    for d in range(len(r.busy_s)):
        rows.append([slot_label(d, p.layout.tp), format_seconds(r.busy_s[d]),
                     format_seconds(r.bubble_s[d]),
                     format_bytes(r.comm_bytes[d]),
                     format_bytes(r.peak_bytes[d]) + (f" / {format_bytes(p.memory_bytes)}"
                                                      if p.memory_bytes else "")])
    console.print(table(f"simulated iteration: {r.schedule.kind}, {r.schedule.microbatches} "
                        f"micro-batches, dp={args.dp}",
                        ["device", "busy", "bubbles", "sent", "peak memory"], rows))
    console.print(f"iteration {format_seconds(r.iteration_s)}   "
                  f"{r.samples_per_s:.1f} samples/s   "
                  f"fits memory: {'yes' if r.fits else 'NO'}")
    return _fit_status(r, p)


def _fit_status(r, p) -> int:
    """0 when the simulated iteration fits the plan's limit; else 1, the devices over it named on
    stderr."""
    if r.fits:
        return 0
    over = [f"device {slot_label(d, p.layout.tp)} peaks at {format_bytes(b)}"
            for d, b in enumerate(r.peak_bytes) if p.memory_bytes and b > p.memory_bytes]
    print(f"outcore simulate: the plan does not fit its {format_bytes(p.memory_bytes)} per "
          f"device: {', '.join(over)}", file=sys.stderr)
    return 1
