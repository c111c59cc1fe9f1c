"""``outcore graph`` and ``outcore profile``: capture (and cost) a model; write JSON or pictures."""

from __future__ import annotations

import argparse

from outcore.api import add_options, from_args
from outcore.cli.common import (
    MODEL_HELP,
    check_output_suffix,
    console,
    is_graph_file,
    nonneg_int,
    note,
    table,
)
from outcore.errors import UsageError
from outcore.units import format_bytes, format_seconds

DESCRIPTION = """Capture a model's layer graph with torch.fx (torch.export where fx cannot) and
write it as outcore-graph/1 JSON (-o g.json) and/or draw it (-o g.svg / g.png). --depth N
collapses modules deeper than N into blocks (0 = whole model, 1 = top-level children). --costs
profile measures every layer's forward and backward time here (profile:cuda on a GPU), one
layer at a time when the whole model's training state does not fit the device; --costs
profile-by-layer always does so (identical layers timed once, no weights built); --costs
estimate:DEVICE predicts them from FLOPs and bytes (a100, v100, h100, mi250x, cpu).
MODEL may also be a graph JSON file (to cost, collapse or draw it). With --plan the picture
colours nodes by device. `outcore profile` is `outcore graph --costs profile`."""


def add_parser(sub: argparse._SubParsersAction, name: str = "graph") -> None:
    help_text = ("capture a model's graph; write JSON or a picture" if name == "graph"
                 else "capture and profile a model (graph --costs profile)")
    p = sub.add_parser(name, help=help_text, description=DESCRIPTION)
    p.add_argument("model", help=MODEL_HELP + "; or a graph JSON file")
    add_options(p, "graph")
    out = p.add_argument_group("output")
    out.add_argument("--depth", type=nonneg_int, metavar="N",
                     help="collapse modules deeper than N into blocks (default: every layer)")
    out.add_argument("--repeat", type=nonneg_int, default=5,
                     help="timed runs per layer when profiling (median; default 5)")
    out.add_argument("--plan", metavar="PLAN.json",
                     help="colour the picture by this plan's devices")
    out.add_argument("-o", "--output", action="append", default=[], metavar="FILE",
                     help="output file: .json, .svg or .png (repeat for several)")
    p.set_defaults(func=run, command_name=name)


def run(args: argparse.Namespace) -> int:
    import outcore

    outputs = [check_output_suffix(o, (".json", ".svg", ".png")) for o in args.output]
    profiled = {"costs": "profile"} if args.command_name == "profile" and \
        not hasattr(args, "costs") else {}
    cfg = from_args(args, "graph", **profiled)
    costs = cfg.graph.costs
    if is_graph_file(args.model):
        g = outcore.load_graph(args.model)
        if costs.startswith("estimate"):
            g = outcore.estimate(g, costs.partition(":")[2] or "cpu")
        elif costs != "none":
            raise UsageError(f"--costs {costs} needs the model, not a graph file: profiling "
                             "runs its layers")
    else:
        g = _captured(args.model, cfg, args.repeat)
    if args.depth is not None:
        g = outcore.collapse(g, args.depth)
    for out in outputs:
        if out.suffix == ".json":
            outcore.save_graph(g, out)
        else:
            assignment = outcore.load_plan(args.plan, g).assignment if args.plan else None
            outcore.draw_graph(g, out, assignment=assignment, title=g.name)
        note(f"wrote {out}")
    _summary(g)
    return 0


def _captured(model: str, cfg, repeat: int):
    """The model's graph, costed as ``cfg`` asks (profiling shows a progress bar)."""
    from rich.progress import Progress

    import outcore
    opts = cfg.graph
    profiling = opts.costs.startswith("profile")
    with Progress(transient=True, disable=not profiling) as bar:
        task = bar.add_task("profiling layers", total=1)
        g = outcore.model_graph(model, input_shape=opts.input_shape, batch_size=opts.batch_size,
                                costs=opts.costs, repeat=max(repeat, 1), warmup=2,
                                leaves=tuple(opts.leaf), task=opts.task,
                                precision=opts.precision,
                                progress=lambda phase, d, n: bar.update(
                                    task, description=phase, completed=d, total=max(n, 1)))
    if profiling:
        prof = g.meta.get("profile", {})
        if prof.get("nodes_timed") == "by_layer":
            note(f"profiled layer by layer on {prof.get('device')}: {prof['timed']} layers "
                 f"timed, {prof['reused']} the same as one timed; sum of layers "
                 f"{format_seconds(prof['sum_s'])}")
        else:
            note(f"profiled on {prof.get('device')}: sum of layers "
                 f"{format_seconds(prof['sum_s'])}, timed whole step "
                 f"{format_seconds(prof['step_s'])} (ratio {prof['ratio']:.2f})")
    return g


def _costed(g) -> str:
    """How the graph's nodes were costed, in words."""
    costs = g.meta.get("costs", "given")
    prof = g.meta.get("profile") or {}
    if costs == "profiled" and prof.get("nodes_timed") == "by_layer":
        return (f"profiled layer by layer on {prof.get('device')} ({prof['timed']} timed, "
                f"{prof['reused']} the same as one timed)")
    if costs == "profiled":
        return f"profiled on {prof.get('device')}"
    return str(costs)


def _summary(g) -> None:
    rows = [["nodes", g.num_nodes], ["edges", g.num_edges],
            ["parameters", format_bytes(g.total_param_bytes)],
            ["saved activations", format_bytes(int(g.saved_bytes.sum()))],
            ["batch size", g.batch_size if g.batch_size else "-"],
            ["costs", _costed(g)]]
    if g.total_compute_s > 0:
        rows.append(["forward + backward", format_seconds(g.total_compute_s)])
    if g.meta.get("forced_leaves"):
        rows.append(["untraceable modules kept whole", ", ".join(g.meta["forced_leaves"])])
    console.print(table(g.name, ["graph", ""], rows))
