"""``outcore plan``: partition a graph (or a model) over devices under a memory limit."""

from __future__ import annotations

import argparse
from pathlib import Path

from outcore.api import add_options, from_args
from outcore.cli.common import (
    MODEL_HELP,
    check_output_suffix,
    console,
    is_graph_file,
    nonneg_int,
    note,
    plural,
    slot_label,
    table,
)
from outcore.errors import UsageError
from outcore.units import format_bytes, format_seconds

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
                       description=DESCRIPTION, epilog="placers: " + strategies_help())
    p.add_argument("source", metavar="GRAPH.json|MODEL",
                   help="an outcore-graph/1 file, or a model (" + MODEL_HELP + ")")
    add_options(p, "plan")
    out = p.add_argument_group("output")
    out.add_argument("--depth", type=nonneg_int, help="plan on blocks of this module depth")
    out.add_argument("-o", "--output", metavar="PLAN.json",
                     help="plan file (default plan.json, which is never replaced unless named "
                          "here); a MODEL's graph is written beside it as PLAN.graph.json")
    out.add_argument("--picture", metavar="FILE.png|svg",
                     help="also draw the graph coloured by device")
    out.add_argument("--gantt", metavar="FILE.png", help="also draw the simulated timeline")
    out.add_argument("--schedule-out", metavar="FILE.json",
                     help="also write the schedule every rank runs (outcore-schedule/1: one "
                          "line of actions per rank; read back by simulate/train "
                          "--schedule-file)")
    p.set_defaults(func=run)


def load_or_capture(source: str, cfg):
    """A graph from a JSON file, or captured and costed from a model name."""
    import outcore

    g = cfg.graph
    if is_graph_file(source):
        graph = outcore.load_graph(source)
        made = graph.meta.get("precision", "32")
        if g.precision != "32" and g.precision != made:
            raise UsageError(f"{source} was captured in precision {made}, not {g.precision}: "
                             f"capture the model again with --precision {g.precision}")
        return graph, False
    return outcore.model_graph(source, input_shape=g.input_shape, batch_size=g.batch_size,
                               costs=g.costs, leaves=tuple(g.leaf), task=g.task,
                               precision=g.precision,
                               split=outcore.api.capture_split(cfg)), True


def _outputs(args: argparse.Namespace, captured: bool) -> tuple[Path, Path]:
    """The plan file and the graph file beside it. A file the command was not asked to
    write by name is never replaced: without -o, an existing plan.json (or plan.graph.json)
    is refused."""
    out = check_output_suffix(args.output or "plan.json", (".json",))
    gpath = out.with_name(out.stem + ".graph.json")
    if args.output is None:
        clash = [str(f) for f in (out, gpath) if f.exists() and (f == out or captured)]
        if clash:
            raise UsageError(f"{' and '.join(clash)} exist already: name the plan file with -o "
                             "(-o plan.json replaces it)")
    return out, gpath


def run(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    import outcore

    outcore.api.keep_freed_memory()  # the search remakes graph-sized arrays; the process ends
    cfg = from_args(args, "plan")
    schedule_out = check_output_suffix(args.schedule_out, (".json",)) \
        if args.schedule_out else None
    g, captured = load_or_capture(args.source, cfg)
    out, gpath = _outputs(args, captured or args.depth is not None)
    if args.depth is not None:
        g = outcore.collapse(g, args.depth)
    with Progress(transient=True, console=console, disable=not console.is_terminal) as bar:
        # the layout search's layouts, and a refusal's checks of what would fit
        task = bar.add_task("planning", total=1)
        p = outcore.plan(g, outcore.api.plan_request_of(cfg), progress=lambda phase, d, n:
                         bar.update(task, description=phase, completed=d, total=max(n, 1)))
    whole, g = g, outcore.api.microbatch_graph(g, p)
    outcore.save_plan(p, out)
    note(f"wrote {out}")
    # a graph captured or collapsed here exists nowhere else: written at the plan's micro-batch
    if captured or args.depth is not None:
        outcore.save_graph(g, gpath)
        note(f"wrote {gpath} (the graph the plan is for: outcore simulate {out} --graph {gpath})")
    elif g is not whole:  # simulate rescales the input as this did (outcore.api.lower)
        note(f"the plan is for micro-batches of {plural(g.batch_size, 'sample')}: outcore "
             f"simulate {out} --graph {args.source} simulates them")
    if schedule_out:
        outcore.save_schedule(outcore.lower(p, g), schedule_out)
        note(f"wrote {schedule_out}")
    print_plan(g, p)
    if cfg.run.explain:
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
                  + f"   schedule {p.schedule}, {plural(p.microbatches, 'micro-batch')}"
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
