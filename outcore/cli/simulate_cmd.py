"""``outcore simulate``: predict one training iteration of a plan."""

from __future__ import annotations

import argparse
import json

import numpy as np

from outcore.cli.common import check_output_suffix, console, note, positive_int, table
from outcore.units import format_bytes, format_seconds

DESCRIPTION = """Simulate one training iteration of a plan event by event: each device runs
its actions (forward/backward of a piece for a micro-batch, sends, receives, all-reduces) on one
compute stream; messages cost latency + bytes / bandwidth with per-link contention. Prints the
iteration time and, per device, busy time, bubbles, bytes sent and peak memory; --json prints
the same as JSON. --trace writes a Chrome trace (open in Perfetto), --gantt a PNG timeline with
memory over time."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="predict one training iteration of a plan",
                       description=DESCRIPTION)
    p.add_argument("plan", metavar="PLAN.json", help="a plan from `outcore plan`")
    p.add_argument("--graph", metavar="GRAPH.json", required=True,
                   help="the graph the plan was made for")
    p.add_argument("--microbatches", type=positive_int, help="default: the plan's")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], help="default: the plan's")
    p.add_argument("--dp", type=positive_int, default=1,
                   help="data-parallel replicas of the whole plan (collective cost model)")
    p.add_argument("--batch-size", type=positive_int,
                   help="samples per iteration (default: the graph's batch)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--trace", metavar="FILE.json", help="write a Chrome/Perfetto trace")
    p.add_argument("--gantt", metavar="FILE.png", help="draw the timeline and memory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import outcore
    from outcore.graph import load
    from outcore.plan import align, load as load_plan

    g = load(args.graph)
    p = load_plan(args.plan)
    if p.node_ids.size != g.num_nodes:
        from outcore.errors import PlanError
        raise PlanError(f"{args.plan} places {p.node_ids.size} nodes but {args.graph} has "
                        f"{g.num_nodes}: pass the graph the plan was made for")
    p = align(p, g)
    r = outcore.simulate(p, g, microbatches=args.microbatches, schedule=args.schedule,
                         dp=args.dp, global_batch=args.batch_size)
    if args.trace:
        from outcore.sim import save_chrome_trace
        save_chrome_trace(check_output_suffix(args.trace, (".json",)), [r.timeline])
        note(f"wrote {args.trace}")
    if args.gantt:
        from outcore.viz import draw_timeline
        draw_timeline(r.timeline, check_output_suffix(args.gantt, (".png", ".svg")))
        note(f"wrote {args.gantt}")
    if args.json:
        print(json.dumps(r.to_dict(), indent=1))
        return 0
    rows = []
    for d in range(p.devices):
        rows.append([d, format_seconds(r.busy_s[d]), format_seconds(r.bubble_s[d]),
                     format_bytes(r.comm_bytes[d]),
                     format_bytes(r.peak_bytes[d]) + (f" / {format_bytes(p.memory_bytes)}"
                                                      if p.memory_bytes else "")])
    console.print(table(f"simulated iteration: {r.schedule.kind}, {r.schedule.microbatches} "
                        f"micro-batches, dp={args.dp}",
                        ["device", "busy", "bubbles", "sent", "peak memory"], rows))
    console.print(f"iteration {format_seconds(r.iteration_s)}   "
                  f"{r.samples_per_s:.1f} samples/s   "
                  f"fits memory: {'yes' if r.fits else 'NO'}")
    return 0
