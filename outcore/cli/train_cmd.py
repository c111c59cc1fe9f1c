"""``outcore train``: the main job — plan a model over local workers and train it."""

from __future__ import annotations

import argparse

from outcore.cli.common import (MODEL_HELP, add_leaf_arg, add_mesh_args, console, note,
                                positive_int, degree_arg, table)
from outcore.units import format_bytes, format_seconds

# The embedded default job: a model whose training step does not fit one device of DEFAULT_MEMORY,
# trained across DEFAULT_DEVICES local workers.
TASKS = ("classification", "regression", "causal-lm", "masked-lm", "seq2seq-lm")
DEFAULT_MODEL = "outcore:transformer:layers=8,d_model=256,heads=4,seq=32,vocab=512"
DEFAULT_DEVICES = 4
DEFAULT_MEMORY = "48MiB"
DEFAULT_BATCH = 16
DEFAULT_MICROBATCHES = 4

DESCRIPTION = f"""Train a model across devices: capture its graph, cost every layer (profiled
here, or estimated), plan it under --memory per device (or use --plan), then spawn --devices
local workers (gloo on CPU, NCCL on GPUs; under torchrun, mpirun or srun it joins that job
instead) and train with the plan's schedule. Shows progress; ends with a report of measured
throughput, busy time and peak memory per device next to the plan's prediction, and a timeline
picture. With no MODEL it runs the default job: {DEFAULT_MODEL} on {DEFAULT_DEVICES} workers
with {DEFAULT_MEMORY} each, which one device of that size cannot train."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="plan and train a model across local workers (main job)",
                       description=DESCRIPTION)
    p.add_argument("model", nargs="?", help=MODEL_HELP + f" (default {DEFAULT_MODEL})")
    p.add_argument("--devices", "-k", type=positive_int, help="workers, one per device "
                   f"(default {DEFAULT_DEVICES} for the default job, else 1)")
    p.add_argument("--memory", help="memory per device the plan must fit (e.g. 16GiB)")
    p.add_argument("--strategy", default="auto",
                   help="planner: auto, pardnn, pipeline, ... (see outcore plan --help)")
    p.add_argument("--plan", metavar="PLAN.json", help="use this plan instead of planning")
    p.add_argument("--schedule-file", metavar="FILE.json",
                   help="run this schedule's action lists (outcore plan --schedule-out; "
                        "checked against the plan) instead of the plan's own lowering")
    p.add_argument("--parallel", choices=["mp", "mast", "master"],
                   help="mp (one replica), mast (GEMS: two replicas in opposite directions), "
                        "master (GEMS: --replicas replicas); see outcore plan --help. Without "
                        "--parallel, --replicas and --dp the plan chooses the layout")
    p.add_argument("--replicas", type=positive_int,
                   help="master: replicas (default 4, or 2 with fewer than 4 devices)")
    p.add_argument("--dp", type=positive_int,
                   help="data-parallel copies of the model-parallel group (divides --devices)")
    add_mesh_args(p)
    p.add_argument("--memory-policy", choices=["auto", "none", "checkpoint", "offload"],
                   default="auto", help="how to fit --memory when the placement alone does not "
                   "(see outcore plan --help); on a CPU only checkpointing saves memory")
    p.add_argument("--input-shape", metavar="SHAPE", help="example input shape, e.g. 8x3x32x32")
    p.add_argument("--batch-size", type=positive_int, help="global batch per step (default 8; "
                   f"{DEFAULT_BATCH} for the default job)")
    p.add_argument("--microbatches", type=positive_int,
                   help="micro-batches per step (default: the plan chooses the fewest that "
                        "fit, more when they are faster)")
    p.add_argument("--explain", action="store_true",
                   help="also print the plan's candidates (the chosen layout and the runner-up)")
    p.add_argument("--schedule", choices=["auto", "gpipe", "1f1b"], default="auto",
                   help="pipeline schedule of the micro-batches: 1f1b (one forward, one "
                        "backward: fewest activations held), gpipe (every forward, then every "
                        "backward), or auto (default: the search simulates both on its best "
                        "placement and keeps gpipe only when it is faster; with --plan, the "
                        "plan's)")
    p.add_argument("--steps", type=positive_int, default=10, help="training steps (default 10)")
    p.add_argument("--epochs", type=positive_int,
                   help="epochs over an image folder (instead of --steps)")
    p.add_argument("--optimizer", choices=["adam", "adamw", "sgd"], default="adam")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    p.add_argument("--lr-schedule", choices=["none", "cosine", "step"], default="none")
    p.add_argument("--seed", type=int, default=0, help="seeds weights and data (default 0)")
    p.add_argument("--data", default="synthetic",
                   help="synthetic (seeded random batches), imagefolder:PATH or text:FILE "
                        "(byte-level tokens)")
    p.add_argument("--task", choices=list(TASKS),
                   help="what the model learns, i.e. the targets: classification (one class "
                   "per example), regression (real targets, MSE), causal-lm (each token "
                   "predicts the next), masked-lm (15%% of tokens masked, predicted), "
                   "seq2seq-lm (encoder-decoder). Default: inferred from the model and its "
                   "output. hf:/timm: models are built for it (a regression head, a masked-LM "
                   "head)")
    add_leaf_arg(p)
    p.add_argument("--costs", default="profile",
                   help="profile (time each layer here) or estimate[:DEVICE]")
    p.add_argument("--run-dir", help="where artifacts go (default outcore-runs/<time>-<model>)")
    p.add_argument("--metrics-out", metavar="FILE.jsonl",
                   help="per-step metrics, one JSON object per line")
    p.add_argument("--trace", metavar="DIR", help="also copy the measured timeline files here")
    p.add_argument("--checkpoint-dir", help="write sharded checkpoints here (one job at a time: "
                   "a LOCK file names the writer). A checkpoint is code (its .metadata is a "
                   "pickle): use only folders you wrote; outcore refuses folders other users "
                   "can write and files whose digests do not match")
    p.add_argument("--checkpoint-every", type=positive_int, default=0, metavar="N",
                   help="checkpoint every N steps")
    p.add_argument("--resume", action="store_true", help="continue from the newest intact "
                   "checkpoint in --checkpoint-dir (loading it runs code its author could "
                   "control: resume only from your own checkpoints)")
    p.add_argument("--on-nonfinite", choices=["stop", "skip"], default="stop",
                   help="a NaN/inf loss or gradient: stop (default, exit non-zero naming the "
                   "step and the last good checkpoint) or skip that step's update")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="longest wait for any message or worker before failing (default 60)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    import outcore

    launcher, rank = outcore.launcher()
    if launcher != "none" and rank != 0:
        return _run_quiet(args)
    default_job = args.model is None
    model = args.model or DEFAULT_MODEL
    devices = args.devices or (DEFAULT_DEVICES if default_job else 1)
    memory = args.memory or (DEFAULT_MEMORY if default_job else None)
    batch = args.batch_size or (DEFAULT_BATCH if default_job else 8)
    steps = args.steps
    if args.epochs:
        steps = _steps_for_epochs(args, batch)
    if default_job:
        note(f"default job: {model} on {devices} local workers with {memory} each "
             "(one device of that size cannot train it)")
    columns = [TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[info]}"),
               TimeRemainingColumn()]
    # a terminal gets live bars; a log file (CI, batch jobs, nohup) gets one line per phase and step
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
            bar.update(task, visible=True, completed=m["step"] + 1, info=info)
            if not live:
                console.print(f"step {m['step'] + 1}/{steps}  {info}", soft_wrap=True)

        mbs = args.microbatches or (DEFAULT_MICROBATCHES if default_job else None)
        report = outcore.train(
            model, devices, memory=memory, strategy=args.strategy, plan=args.plan,
            parallel=args.parallel or "mp", replicas=args.replicas, dp=args.dp or 1,
            tp=degree_arg(args.tp, False), shard=degree_arg(args.shard, False),
            search_layout=_layout_open(args),
            memory_policy=args.memory_policy, sp=args.sp, sp_join=args.sp_join,
            sp_grid=args.sp_grid, input_shape=args.input_shape, batch_size=batch,
            microbatches=mbs,
            steps=steps, schedule=args.schedule, optimizer=args.optimizer, lr=args.lr,
            lr_schedule=args.lr_schedule, seed=args.seed, data=args.data, costs=args.costs,
            run_dir=args.run_dir, metrics_out=args.metrics_out,
            checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
            resume=args.resume, on_nonfinite=args.on_nonfinite, timeout_s=args.timeout,
            schedule_file=args.schedule_file, progress=on_progress, on_metrics=on_metrics,
            **_task_leaves(args))
    print_report(report)
    if args.explain:
        from outcore.cli.plan_cmd import print_explain
        print_explain(report.plan, top=6)
    if args.trace:
        _copy_trace(report, args.trace)
    return 0


def _run_quiet(args: argparse.Namespace) -> int:
    """A non-zero rank under torchrun/mpirun/srun: train without printing (rank 0 reports)."""
    import outcore
    default_job = args.model is None
    outcore.train(
        args.model or DEFAULT_MODEL, args.devices or (DEFAULT_DEVICES if default_job else 1),
        memory=args.memory or (DEFAULT_MEMORY if default_job else None),
        strategy=args.strategy, plan=args.plan, parallel=args.parallel or "mp",
        replicas=args.replicas, dp=args.dp or 1, tp=degree_arg(args.tp, False),
        shard=degree_arg(args.shard, False),
        memory_policy=args.memory_policy,
        search_layout=_layout_open(args),
        sp=args.sp, sp_join=args.sp_join, sp_grid=args.sp_grid, input_shape=args.input_shape,
        batch_size=args.batch_size or (DEFAULT_BATCH if default_job else 8),
        microbatches=args.microbatches or (DEFAULT_MICROBATCHES if default_job else None),
        steps=args.steps, schedule=args.schedule,
        optimizer=args.optimizer, lr=args.lr, lr_schedule=args.lr_schedule, seed=args.seed,
        data=args.data, costs=args.costs, run_dir=args.run_dir, metrics_out=args.metrics_out,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
        resume=args.resume, on_nonfinite=args.on_nonfinite, timeout_s=args.timeout,
        schedule_file=args.schedule_file, **_task_leaves(args))
    return 0


def _layout_open(args: argparse.Namespace) -> bool:
    """No layout option given: the plan chooses dp and the GEMS mode."""
    return args.parallel is None and args.replicas is None and args.dp is None \
        and args.plan is None and args.tp == 0 and args.sp == 1 and args.shard == 0


def _task_leaves(args: argparse.Namespace) -> dict:
    """``--task`` (runtime spelling: causal_lm) and ``--leaf`` as train() arguments."""
    task = args.task.replace("-", "_") if args.task else None
    return {"task": task, "leaves": tuple(args.leaf)}


def _steps_for_epochs(args: argparse.Namespace, batch: int) -> int:
    from outcore.errors import UsageError
    if not args.data.startswith("imagefolder:"):
        raise UsageError("--epochs needs --data imagefolder:PATH; with synthetic data use --steps")
    import torchvision
    n = len(torchvision.datasets.ImageFolder(args.data.split(":", 1)[1]))
    return max(1, args.epochs * (n // batch))


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
    tp = report.plan.layout.tp  # the prediction is per device slot of tp ranks
    p_peak = pred.get("peak_bytes", [None] * K)
    p_busy = pred.get("busy_s", [None] * K)
    limit = report.plan.memory_bytes
    rows = []
    for r in range(K):
        s = r // tp
        rows.append([r, format_seconds(report.busy_s[r]),
                     format_seconds(p_busy[s]) if p_busy[s] is not None else "-",
                     format_bytes(report.peak_bytes[r]) if report.peak_bytes[r] else "-",
                     format_bytes(p_peak[s]) if p_peak[s] is not None else "-",
                     format_bytes(limit) if limit else "-"])
    console.print(table(f"{report.config.model}: {K} device(s), {report.plan.strategy} plan, "
                        f"{report.config.schedule}, {report.config.microbatches} micro-batches",
                        ["rank", "busy (measured)", "busy (predicted)", "peak memory (measured)",
                         "peak (predicted)", "limit"], rows))
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
