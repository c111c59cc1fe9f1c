"""``outcore.train``: capture, cost, plan, launch the workers, and report against the prediction.

On a plain machine it spawns ``devices`` local worker processes (gloo on CPU, NCCL on GPUs);
under torchrun, mpirun or srun it joins the job it is in (rank 0 plans, every rank trains).
Every artifact goes to the run directory: ``graph.json``, ``plan.json``, ``config.json``,
``metrics.jsonl``, ``trace/`` (measured timelines), ``timeline.png`` (measured beside predicted),
``trace.json`` (Chrome/Perfetto) and ``report.json``.
"""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from outcore.errors import InfeasibleError, PlanError, UsageError
from outcore.graph.io import save as save_graph, to_dict as graph_to_dict
from outcore.graph.ir import Graph
from outcore.plan.plan import Plan, align, load as load_plan, make_plan, save as save_plan
from outcore.plan.plan import to_dict as plan_to_dict
from outcore.runtime.config import TrainConfig
from outcore.units import parse_bytes, parse_shape

log = logging.getLogger(__name__)


@dataclass
class TrainReport:
    """What a run did, next to what the plan predicted."""

    config: TrainConfig
    plan: Plan
    run_dir: Path
    losses: list[float]
    step_s: list[float]
    peak_bytes: list[int]
    busy_s: list[float]
    predicted: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)

    @property
    def median_step_s(self) -> float:
        steady = self.step_s[1:] if len(self.step_s) > 1 else self.step_s
        return statistics.median(steady) if steady else float("nan")

    @property
    def samples_per_s(self) -> float:
        return self.config.batch_size / self.median_step_s if self.step_s else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.config.model, "devices": self.plan.devices,
                "strategy": self.plan.strategy, "batch_size": self.config.batch_size,
                "microbatches": self.config.microbatches, "schedule": self.config.schedule,
                "steps": len(self.losses), "losses": self.losses, "step_s": self.step_s,
                "median_step_s": self.median_step_s, "samples_per_s": self.samples_per_s,
                "peak_bytes": self.peak_bytes, "busy_s": self.busy_s,
                "memory_bytes": self.plan.memory_bytes, "predicted": self.predicted,
                "files": self.files}


def _threads_profile(fn: Callable[[], Any], threads: int | None) -> Any:
    import torch
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def replication_request(parallel: str, replicas: int | None, dp: int,
                        devices: int) -> tuple[int, int]:
    """(model replicas, copies) a train run asks for; copies = replicas x dp."""
    if parallel == "mp":
        r = 1
    elif parallel == "mast":
        r = 2
    else:
        r = replicas or (4 if devices // max(dp, 1) >= 4 else 2)
    return r, r * dp


def prepare(cfg: TrainConfig, devices: int, *, memory: str | float | None, strategy: str,
            plan_path: str | None, costs: str, parallel: str = "mp",
            replicas: int | None = None, dp: int = 1, memory_policy: str = "auto",
            local: bool = True,
            progress: Callable[[str, int, int], None] | None = None) -> tuple[Graph, Plan]:
    """Capture the model at the micro-batch size, cost it, and plan it (or load the plan)."""
    import torch

    from outcore.api import plan as make_a_plan
    from outcore.graph.capture import capture
    from outcore.runtime.data import split
    from outcore.zoo import resolve_model

    spec = resolve_model(cfg.model, input_shape=cfg.input_shape, batch_size=cfg.batch_size)
    torch.manual_seed(cfg.seed)
    model = spec.build()
    if plan_path:
        from outcore.plan.replicas import replication_of
        rep = replication_of(load_plan(plan_path))
        copies = rep.copies if rep else 1
    else:
        R, copies = replication_request(parallel, replicas, dp, devices)
    micro = split(spec.example_inputs, cfg.microbatches * copies)[0]
    if progress:
        progress("capturing the graph", 0, 1)
    g = capture(model, micro, name=cfg.model)
    if costs == "profile":
        from outcore.cost.profile import profile
        g = _threads_profile(lambda: profile(
            g, model, micro, warmup=1, repeat=3,
            progress=(lambda d, n: progress("profiling layers", d, n)) if progress else None),
            cfg.threads)
    elif costs.startswith("estimate"):
        from outcore.cost.analytical import estimate
        device = costs.partition(":")[2] or "cpu"
        g = estimate(g, device)
    else:
        raise UsageError(f"unknown cost source {costs!r}: use profile or estimate[:DEVICE]")
    if plan_path:
        p = load_plan(plan_path)
        if p.graph.get("depth") is None:
            p = align(p, g)
        if p.devices != devices:
            raise PlanError(f"{plan_path} is a plan for {p.devices} devices, but --devices is "
                            f"{devices}: pass --devices {p.devices}, or re-plan")
        return g, p
    device = "cuda" if torch.cuda.is_available() else "cpu"
    from outcore.api import _cluster_doc, make_cluster
    from outcore.hardware.presets import link_preset
    # local CPU workers talk over gloo on loopback (measured preset); GPUs: a generic link
    link = link_preset("gloo-loopback") if device == "cpu" else None
    bandwidth = link.bandwidth if link else "16GB/s"
    latency = link.latency_s if link else "25us"
    cores = _local_cores() if (device == "cpu" and local) else None
    if cores and link and devices > cores:
        # more workers than cores: a message waits for its receiver to be scheduled (measured
        # with outcore.runtime.linkprobe on 2 cores with a third busy process: 1.6-2 ms)
        latency = OVERSUBSCRIBED_LATENCY_S
    cluster = make_cluster(devices, memory, bandwidth, latency,
                           device=None if device == "cuda" else "cpu", host_cores=cores)
    if progress:
        progress("planning", 0, 1)
    if devices == 1 and copies == 1:
        from outcore.partition.memory_policy import choose
        from outcore.sim.simulate import simulate
        p = make_plan(g, np.zeros(g.num_nodes, dtype=np.int64), strategy="single", devices=1,
                      memory_bytes=float(parse_bytes(memory)) if memory is not None else None,
                      microbatches=cfg.microbatches, schedule=cfg.schedule,
                      optimizer=cfg.optimizer, cluster=_cluster_doc(cluster))
        try:
            p = choose(g, p, mode=memory_policy, cluster=cluster)
        except InfeasibleError as e:
            raise InfeasibleError(f"{e}; or train on several devices (--devices)") from None
        return g, p.replace(predicted=simulate(p, g, cluster=cluster).to_dict())
    p = make_a_plan(g, devices, memory, strategy=strategy, parallel=parallel, replicas=R,
                    dp=dp, microbatches=cfg.microbatches, schedule=cfg.schedule,
                    optimizer=cfg.optimizer, seed=cfg.seed, memory_policy=memory_policy,
                    device=None if device == "cuda" else "cpu", bandwidth=bandwidth,
                    latency=latency, host_cores=cores)
    return g, p


def train(model: str, devices: int = 1, *, memory: str | float | None = None,
          strategy: str = "auto", plan: str | None = None, parallel: str = "mp",
          replicas: int | None = None, dp: int = 1, memory_policy: str = "auto",
          input_shape: str | tuple[int, ...] | None = None, batch_size: int = 8,
          microbatches: int | None = None, steps: int = 10, schedule: str = "1f1b",
          optimizer: str = "adam", lr: float = 1e-3, lr_schedule: str = "none", seed: int = 0,
          data: str = "synthetic", costs: str = "profile", run_dir: str | None = None,
          metrics_out: str | None = None, trace: bool = True,
          checkpoint_dir: str | None = None, checkpoint_every: int = 0, resume: bool = False,
          on_nonfinite: str = "stop", timeout_s: float = 60.0, threads: int | None = 1,
          progress: Callable[[str, int, int], None] | None = None,
          on_metrics: Callable[[dict[str, Any]], None] | None = None) -> TrainReport:
    """Train ``model`` on ``devices`` devices (see the module docstring).

    Args:
        model: model name (``torchvision:resnet18``, ``outcore:transformer``, ``file.py:fn``).
        devices: workers (one per device); 1 = plain single-process training.
        memory: per-device memory limit the plan must respect (``16GiB``).
        strategy: planner (``pardnn``, ``pipeline``, ...); ignored with ``plan``.
        plan: a saved ``outcore-plan/1`` file to use instead of planning.
        input_shape: example input shape (``8x3x224x224``); the batch is ``batch_size``.
        batch_size: global batch per step.
        microbatches: micro-batches per step (default: ``2 x devices`` when the batch allows).
        steps: training steps.
        costs: ``profile`` (measure each layer here) or ``estimate[:DEVICE]`` (analytical).
        run_dir: where artifacts go (default: a new ``outcore-runs/<time>-<model>[-N]``).
        on_nonfinite: ``stop`` at the first NaN/inf loss or gradient, or ``skip`` its update.
        progress: ``progress(phase, done, total)`` for the preparation phases.
        on_metrics: called with each step's metrics as rank 0 writes them.
    """
    if devices < 1:
        raise UsageError(f"--devices must be at least 1, got {devices}")
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    shape = parse_shape(input_shape) if isinstance(input_shape, str) else input_shape
    _, copies = replication_request(parallel, replicas, dp, devices)
    M = microbatches or _default_microbatches(batch_size // copies, devices // dp)
    if batch_size % (M * copies):
        raise UsageError(f"batch size {batch_size} does not split into {M} micro-batches x "
                         f"{copies} model copies: make --batch-size a multiple of "
                         f"{M * copies}")
    from outcore.runtime.env import detect
    from outcore.runtime.rundir import unique_run_dir
    job = detect()
    if run_dir or job.rank != 0:  # other ranks of a job get rank 0's folder (broadcast)
        root = Path(run_dir or "outcore-runs")
        root.mkdir(parents=True, exist_ok=True)
    else:  # a new folder per run: jobs started in the same second never share one
        root = unique_run_dir("outcore-runs", _slug(model))
    metrics = metrics_out or str(root / "metrics.jsonl")
    cfg = TrainConfig(model=model, input_shape=shape, batch_size=batch_size, microbatches=M,
                      steps=steps, schedule=schedule, optimizer=optimizer, lr=lr,
                      lr_schedule=lr_schedule, seed=seed, data=data, metrics_out=metrics,
                      trace_dir=str(root / "trace") if trace else None,
                      checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                      resume=resume, on_nonfinite=on_nonfinite, timeout_s=timeout_s,
                      threads=threads)
    if job.launcher != "none":
        return _train_in_job(cfg, devices, memory, strategy, plan, costs, root,
                             dict(parallel=parallel, replicas=replicas, dp=dp,
                                  memory_policy=memory_policy))
    g, p = prepare(cfg, devices, memory=memory, strategy=strategy, plan_path=plan, costs=costs,
                   parallel=parallel, replicas=replicas, dp=dp, memory_policy=memory_policy,
                   progress=progress)
    save_graph(g, root / "graph.json")
    save_plan(p, root / "plan.json")
    (root / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    from outcore.runtime.launch import run_local
    from outcore.runtime.worker import train_worker

    if progress:
        progress(f"starting {devices} worker(s)", 0, 1)
    watcher = _MetricsWatcher(Path(metrics), on_metrics)
    results = run_local(train_worker, devices, (cfg, graph_to_dict(g), plan_to_dict(p)),
                        timeout_s=timeout_s, threads=threads, poll=watcher.poll)
    watcher.poll()
    return _report(cfg, g, p, root, results)


OVERSUBSCRIBED_LATENCY_S = 1.5e-3


def _local_cores() -> int:
    """CPU cores this process may use (the local workers share them)."""
    import os
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _default_microbatches(batch: int, devices: int) -> int:
    if devices == 1:
        return 1
    for m in (2 * devices, devices, 2, 1):
        if batch % m == 0 and batch // m >= 1:
            return m
    return 1


def _slug(model: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in model.split(":")[-1] or model)[:40]


class _MetricsWatcher:
    """Tails rank 0's metrics file and hands each new line to a callback."""

    def __init__(self, path: Path, callback: Callable[[dict[str, Any]], None] | None):
        self.path, self.callback, self.offset = path, callback, 0

    def poll(self) -> None:
        if self.callback is None or not self.path.exists():
            return
        with open(self.path) as f:
            f.seek(self.offset)
            chunk = f.read()
        lines = chunk.split("\n")
        complete, rest = lines[:-1], lines[-1]
        self.offset += len(chunk) - len(rest)
        for line in complete:
            if line.strip():
                self.callback(json.loads(line))


def _report(cfg: TrainConfig, g: Graph, p: Plan, root: Path,
            results: list[dict[str, Any]]) -> TrainReport:
    r0 = results[0]
    report = TrainReport(cfg, p, root, r0["losses"], r0["step_s"], r0["peak_bytes"],
                         r0["busy_s"], dict(p.predicted))
    files = {"graph": str(root / "graph.json"), "plan": str(root / "plan.json"),
             "metrics": cfg.metrics_out or ""}
    if cfg.trace_dir and Path(cfg.trace_dir).is_dir():
        files.update(_timeline_files(cfg, g, p, root))
    report.files = files
    (root / "report.json").write_text(json.dumps(report.to_dict(), indent=1))
    return report


def _timeline_files(cfg: TrainConfig, g: Graph, p: Plan, root: Path) -> dict[str, str]:
    """Merge the ranks' measured timelines; draw them under the simulator's prediction."""
    from outcore.sim.simulate import simulate
    from outcore.sim.timeline import Timeline, load_events, save_chrome_trace

    parts = sorted(Path(cfg.trace_dir).glob("rank*.json"))
    if not parts:
        return {}
    events = []
    for part in parts:
        events += list(load_events(part).events)
    measured = Timeline(p.devices, tuple(sorted(events, key=lambda e: e.start_s)),
                        max((e.end_s for e in events), default=0.0), source="measured")
    predicted = simulate(p, g).timeline
    out = {"trace": str(save_chrome_trace(root / "trace.json", [predicted, measured],
                                          ["predicted", "measured"]))}
    try:
        from outcore.viz import draw_comparison
        draw_comparison(predicted, measured, root / "timeline.png")
        out["timeline"] = str(root / "timeline.png")
    except Exception as e:  # a picture must never fail a finished training run
        log.warning("could not draw the timeline: %s", e)
    return out


def _train_in_job(cfg: TrainConfig, devices: int, memory: Any, strategy: str,
                  plan: str | None, costs: str, root: Path,
                  replication: dict[str, Any]) -> TrainReport:
    """Under torchrun/mpirun/srun: rank 0 plans and broadcasts; every rank trains."""
    from outcore.runtime.launch import run_in_job

    out = run_in_job(_job_main, (cfg, devices, memory, strategy, plan, costs, str(root),
                                 replication), timeout_s=cfg.timeout_s, threads=cfg.threads)
    return out


def _job_main(ctx: Any, cfg: TrainConfig, devices: int, memory: Any, strategy: str,
              plan: str | None, costs: str, root: str,
              replication: dict[str, Any]) -> TrainReport | None:
    import torch.distributed as dist

    from outcore.runtime.worker import train_worker

    if devices != ctx.world_size:
        raise UsageError(f"--devices {devices} but the job has {ctx.world_size} processes")
    docs: list[Any] = [None, None, None, None]
    if ctx.rank == 0:
        g, p = prepare(cfg, devices, memory=memory, strategy=strategy, plan_path=plan,
                       costs=costs, local=False, **replication)
        save_graph(g, Path(root) / "graph.json")
        save_plan(p, Path(root) / "plan.json")
        docs = [graph_to_dict(g), plan_to_dict(p), cfg, root]
    dist.broadcast_object_list(docs, src=0)
    cfg, root = docs[2], docs[3]  # rank 0's run directory and paths for everyone
    result = train_worker(ctx, cfg, docs[0], docs[1])
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, result)
    if ctx.rank != 0:
        return None
    from outcore.graph.io import from_dict as gfd
    from outcore.plan.plan import from_dict as pfd
    g = gfd(docs[0])
    p = pfd(docs[1])
    if p.graph.get("depth") is None:
        p = align(p, g)
    return _report(cfg, g, p, Path(root), gathered)
