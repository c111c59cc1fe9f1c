"""``outcore train``: the main job — plan a model over local workers and train it."""

from __future__ import annotations

import argparse

from outcore.api import add_options, given as options_given
from outcore.cli.common import MODEL_HELP, console, note, plural, table
from outcore.units import format_bytes, format_seconds

# The embedded default job: a model whose training step does not fit one device of its memory,
# trained across local workers; the options it sets unless the command line gives them.
DEFAULT_JOB = {"model": "outcore:transformer:layers=8,d_model=256,heads=4,seq=32,vocab=512",
               "devices": 4, "memory": "48MiB", "batch_size": 16, "microbatches": 4}

DESCRIPTION = f"""Train a model across devices: capture its graph, cost every layer (profiled
here, or estimated), plan it under --memory per device (or use --plan), then spawn --devices
local workers (gloo on CPU, NCCL on GPUs; under torchrun, mpirun or srun it joins that job
instead) and train with the plan's schedule. Shows progress; ends with a report of measured
throughput, busy time and peak memory per device next to the plan's prediction, and a timeline
picture. With no MODEL it runs the default job: {DEFAULT_JOB['model']} on
{DEFAULT_JOB['devices']} workers with {DEFAULT_JOB['memory']} each, which one device of that size
cannot train. Every option is also a keyword argument of outcore.train() (- becomes _)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="plan and train a model across local workers (main job)",
                       description=DESCRIPTION)
    p.add_argument("model", nargs="?", help=MODEL_HELP + f" (default {DEFAULT_JOB['model']})")
    add_options(p, "train")
    p.set_defaults(func=run)


def job_options(args: argparse.Namespace) -> tuple[str, dict]:
    """The model and the options the command line gives (the default job's where it gives no
    model)."""
    given = options_given(args, "train")
    if args.model is not None:
        return args.model, given
    defaults = {k: v for k, v in DEFAULT_JOB.items() if k != "model"}
    return DEFAULT_JOB["model"], {**defaults, **given}


def run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    import outcore

    model, options = job_options(args)
    launcher, rank = outcore.launcher()
    if launcher != "none" and rank != 0:  # rank 0 reports
        outcore.train(model, **options)
        return 0
    if args.model is None:
        note(f"default job: {model} on {options['devices']} local workers with "
             f"{options['memory']} each (one device of that size cannot train it)")
    steps = options.get("steps", 10)
    columns = [TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[info]}"),
               TimeRemainingColumn()]
    # a terminal gets live bars; a log file (CI, batch jobs, nohup) one line per phase and step
    live = console.is_terminal
    with Progress(*columns, console=console, transient=False, disable=not live) as bar:
        prep = bar.add_task("preparing", total=1, info="")
        task = bar.add_task("training", total=steps, info="", visible=False)
        phases: set[str] = set()

        def on_progress(phase: str, done: int, total: int) -> None:
            bar.update(prep, description=phase, completed=done, total=max(total, 1))
            if not live and phase not in phases:
                phases.add(phase)
                console.print(f"{phase} ...", soft_wrap=True)

        def on_metrics(m: dict) -> None:
            bar.update(prep, visible=False)
            loss = f"{m['loss']:.4f}" if m["loss"] is not None else "non-finite"
            info = f"loss {loss}  {m['samples_per_s']:.1f} samples/s"
            bar.update(task, visible=True, completed=m["step"] + 1,
                       total=m.get("steps", steps), info=info)
            if not live:
                console.print(f"step {m['step'] + 1}/{m.get('steps', steps)}  {info}",
                              soft_wrap=True)

        report = outcore.train(model, progress=on_progress, on_metrics=on_metrics, **options)
    print_report(report)
    if report.config.run.explain:
        from outcore.cli.plan_cmd import print_explain
        print_explain(report.plan, top=6)
    if report.config.run.trace:
        _copy_trace(report, report.config.run.trace)
    return 0


def _copy_trace(report, directory: str) -> None:
    import shutil
    from pathlib import Path
    dest = Path(directory)
    dest.mkdir(parents=True, exist_ok=True)
    for key in ("trace", "timeline"):
        if key in report.files:
            shutil.copy(report.files[key], dest)
    src = report.run_dir / "trace"
    if src.is_dir():
        for f in src.glob("rank*.json"):
            shutil.copy(f, dest)
    note(f"wrote the timelines to {dest}")


def print_report(report) -> None:
    pred = report.predicted
    K = report.plan.devices
    p_peak, p_busy = report.per_rank("peak_bytes"), report.per_rank("busy_s")
    limit = report.plan.memory_bytes
    host = report.host_peak_bytes or [0] * K
    rows = []
    for r in range(K):
        rows.append([r, format_seconds(report.busy_s[r]),
                     format_seconds(p_busy[r]) if p_busy[r] is not None else "-",
                     format_bytes(report.peak_bytes[r]) if report.peak_bytes[r] else "-",
                     format_bytes(p_peak[r]) if p_peak[r] is not None else "-",
                     format_bytes(limit) if limit else "-",
                     format_bytes(host[r]) if host[r] else "-"])
    cfg = report.config
    console.print(table(f"{cfg.graph.model}: {plural(K, 'device')}, {report.plan.strategy} "
                        f"plan, {cfg.planning.schedule}, "
                        f"{plural(cfg.planning.microbatches, 'micro-batch')}"
                        + ("" if cfg.graph.precision == "32" else f", {cfg.graph.precision}"),
                        ["rank", "busy (measured)", "busy (predicted)", "peak memory (measured)",
                         "peak (predicted)", "limit", "process peak (host)"], rows))
    from outcore.cli.plan_cmd import policy_lines
    for line in policy_lines(report.plan):
        console.print(line)
    it = pred.get("iteration_s")
    console.print(f"step time {format_seconds(report.median_step_s)} measured (median), "
                  f"{format_seconds(it) if it else '-'} predicted;  "
                  f"{report.samples_per_s:.1f} samples/s;  loss {report.losses[0]:.4f} -> "
                  f"{report.losses[-1]:.4f}")
    if report.comm:
        console.print(table("communication (last step): measured beside the link model",
                            ["kind", "count", "bytes", "measured", "achieved", "predicted",
                             "model"], [_comm_row(c) for c in report.comm]))
    for key in ("timeline", "trace", "metrics", "plan"):
        if report.files.get(key):
            console.print(f"{key}: {report.files[key]}")


def _comm_row(c: dict) -> list[str]:
    def bw(x):
        return f"{format_bytes(x)}/s" if x else "-"
    return [c["kind"], str(c["count"]), format_bytes(c["bytes"]), format_seconds(c["measured_s"]),
            bw(c["measured_bandwidth"]),
            format_seconds(c["predicted_s"]) if c["predicted_s"] is not None else "-",
            bw(c["predicted_bandwidth"])]
