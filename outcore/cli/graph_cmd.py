"""``outcore graph`` and ``outcore profile``: capture (and cost) a model; write JSON or pictures."""

from __future__ import annotations

import argparse

from outcore.cli.common import (add_leaf_arg, add_model_args, check_output_suffix, console,
                                is_graph_file, nonneg_int, note, table)
from outcore.units import format_bytes, format_seconds, parse_shape

DESCRIPTION = """Capture a model's layer graph with torch.fx and write it as outcore-graph/1
JSON (-o g.json) and/or draw it (-o g.svg / g.png). --depth N collapses modules deeper than N
into blocks (0 = whole model, 1 = top-level children). --profile measures every layer's forward
and backward time here; --estimate DEVICE predicts them from FLOPs and bytes (a100, v100, h100,
mi250x, cpu). MODEL may also be a graph JSON file (to collapse or draw it). With --plan the
picture colours nodes by device."""


def add_parser(sub: argparse._SubParsersAction, name: str = "graph") -> None:
    help_text = ("capture a model's graph; write JSON or a picture" if name == "graph"
                 else "capture and profile a model (graph --profile)")
    p = sub.add_parser(name, help=help_text, description=DESCRIPTION)
    add_model_args(p)
    p.add_argument("--depth", type=nonneg_int, metavar="N",
                   help="collapse modules deeper than N into blocks (default: every layer)")
    costs = p.add_mutually_exclusive_group()
    costs.add_argument("--profile", action="store_true", default=(name == "profile"),
                       help="measure each layer's forward and backward time on this machine")
    costs.add_argument("--estimate", metavar="DEVICE",
                       help="predict layer times analytically for a device preset")
    add_leaf_arg(p)
    p.add_argument("--device", help="device to profile on (cpu, cuda, cuda:1; default: best)")
    p.add_argument("--repeat", type=nonneg_int, default=5, help="timed runs per layer (median)")
    p.add_argument("--plan", metavar="PLAN.json", help="colour the picture by this plan's devices")
    p.add_argument("-o", "--output", action="append", default=[], metavar="FILE",
                   help="output file: .json, .svg or .png (repeat for several)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import outcore

    outputs = [check_output_suffix(o, (".json", ".svg", ".png")) for o in args.output]
    if is_graph_file(args.model):
        g = outcore.load_graph(args.model)
    else:
        g = _captured(args)
    if args.estimate:
        g = outcore.estimate(g, args.estimate)
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


def _captured(args: argparse.Namespace):
    """The model's graph, profiled here with --profile (with a progress bar)."""
    from rich.progress import Progress

    import outcore
    shape = parse_shape(args.input_shape) if args.input_shape else None
    with Progress(transient=True, disable=not args.profile) as bar:
        task = bar.add_task("profiling layers", total=1)
        g = outcore.model_graph(args.model, input_shape=shape, batch_size=args.batch_size,
                                costs="profile" if args.profile else "none",
                                device=args.device, repeat=max(args.repeat, 1), warmup=2,
                                leaves=tuple(args.leaf),
                                progress=lambda phase, d, n: bar.update(
                                    task, description=phase, completed=d, total=max(n, 1)))
    if args.profile:
        prof = g.meta.get("profile", {})
        note(f"profiled on {prof.get('device')}: sum of layers {format_seconds(prof['sum_s'])},"
             f" timed whole step {format_seconds(prof['step_s'])} (ratio {prof['ratio']:.2f})")
    return g


def _summary(g) -> None:
    rows = [["nodes", g.num_nodes], ["edges", g.num_edges],
            ["parameters", format_bytes(g.total_param_bytes)],
            ["saved activations", format_bytes(int(g.saved_bytes.sum()))],
            ["batch size", g.batch_size if g.batch_size else "-"],
            ["costs", g.meta.get("costs", "given")]]
    if g.total_compute_s > 0:
        rows.append(["forward + backward", format_seconds(g.total_compute_s)])
    if g.meta.get("forced_leaves"):
        rows.append(["untraceable modules kept whole", ", ".join(g.meta["forced_leaves"])])
    console.print(table(g.name, ["graph", ""], rows))
