"""The job orchestrator behind ``outcore.train``: capture, cost, plan, launch the workers, and
report against the prediction.

On a plain machine it spawns ``devices`` local worker processes (gloo on CPU, NCCL on GPUs);
under torchrun, mpirun or srun it joins the job it is in (rank 0 plans, every rank trains).
Every artifact goes to the run directory: ``graph.json``, ``plan.json``, ``config.json``,
``metrics.jsonl``, ``trace/`` (measured timelines), ``timeline.png`` (measured beside predicted),
``trace.json`` (Chrome/Perfetto) and ``report.json``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from outcore.errors import PlanError, UsageError
from outcore.graph.io import save as save_graph, to_dict as graph_to_dict
from outcore.graph.ir import Graph
from outcore.plan.plan import Plan, align, load as load_plan, save as save_plan
from outcore.plan.plan import to_dict as plan_to_dict
from outcore.plan.request import PlanRequest
from outcore.runtime.config import TrainConfig
from outcore.runtime.local_cluster import local_cluster
from outcore.units import parse_shape

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
    comm: list[dict[str, Any]] = field(default_factory=list)  # trace.comm_profile rows

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
                "files": self.files, "comm": self.comm}


@dataclass(frozen=True, kw_only=True)
class Job:
    """One training job, validated once: what to train (``cfg``, shared with every worker),
    on how many devices, and how to get its plan (a saved file, or a planning request's
    options; the cluster is measured when the job starts).

    Attributes:
        cfg: the workers' configuration (model, batch, steps, optimizer, data, ...).
        devices: workers, one per device.
        memory: per-device memory limit (``16GiB``; None: unlimited).
        plan_path: a saved plan to use instead of planning.
        costs: ``profile`` or ``estimate[:DEVICE]``.
        strategy, parallel, replicas, dp, tp, depth, memory_policy, sp, sp_join, sp_grid: the
            planning request's options (``depth`` is ``--shard``).
        copies: model copies (GEMS replicas x dp) that split each global batch: the saved
            plan's, or the request's (:func:`replicas_asked` x ``dp``).
        microbatches_auto: the user gave no micro-batch count: the plan chooses it.
        search_layout: the user gave no layout: the plan chooses dp and the GEMS mode.
        run_dir: where every artifact goes.
    """

    cfg: TrainConfig
    devices: int
    memory: str | float | None = None
    plan_path: str | None = None
    costs: str = "profile"
    strategy: str = "auto"
    parallel: str = "mp"
    replicas: int | None = None
    dp: int = 1
    tp: int | None = 1  # None: the planner chooses
    depth: int | None = 1  # sharding over the data-parallel copies; None: the planner chooses
    memory_policy: str = "auto"
    copies: int = 1
    run_dir: str = "."
    sp: int = 1
    sp_join: str | None = None
    sp_grid: str | None = None
    microbatches_auto: bool = False
    search_layout: bool = False


def replicas_asked(parallel: str, replicas: int | None, devices: int, dp: int) -> int:
    """GEMS replicas a train run asks for (the capture's micro-batch depends on them)."""
    if parallel == "mp":
        return 1
    if parallel == "mast":
        return 2
    return replicas or (4 if devices // max(dp, 1) >= 4 else 2)


def prepare(job: Job, *, local: bool = True,
            progress: Callable[[str, int, int], None] | None = None) -> tuple[Graph, Plan]:
    """Capture the model at the micro-batch size, cost it, and plan it (or load the plan)."""
    from outcore.api import model_graph, plan as search

    cfg = job.cfg
    whole = (job.microbatches_auto or job.search_layout) and not job.plan_path
    g = model_graph(cfg.model, input_shape=cfg.input_shape, batch_size=cfg.batch_size,
                    seed=cfg.seed, costs=job.costs,
                    split=1 if whole else cfg.microbatches * job.copies,
                    threads=cfg.threads, progress=progress, leaves=tuple(cfg.leaves))
    if job.plan_path:
        p = load_plan(job.plan_path)
        if p.graph.get("depth") is None:
            p = align(p, g)
        if p.devices != job.devices:
            raise PlanError(f"{job.plan_path} is a plan for {p.devices} devices, but --devices "
                            f"is {job.devices}: pass --devices {p.devices}, or re-plan")
        if cfg.schedule not in ("auto", p.schedule):  # the schedule asked for, predicted so
            p = _predicted_on(p.replace(schedule=cfg.schedule), g)
        return g, p
    if progress:
        progress("planning", 0, 1)
    req = PlanRequest.make(job.devices, job.memory, cluster=local_cluster(job.devices, local),
                           strategy="single" if job.devices == (job.tp or 1) and job.copies == 1
                           else job.strategy, parallel=job.parallel,
                           replicas=replicas_asked(job.parallel, job.replicas, job.devices,
                                                   job.dp) if job.parallel == "master" else None,
                           dp=job.dp, schedule=cfg.schedule,
                           microbatches="auto" if job.microbatches_auto else cfg.microbatches,
                           optimizer=cfg.optimizer, seed=cfg.seed,
                           memory_policy=job.memory_policy, search_layout=job.search_layout,
                           tp=None if job.search_layout else job.tp,
                           depth=None if job.search_layout else job.depth,
                           sp=job.sp, sp_join=job.sp_join, sp_grid=job.sp_grid)
    p = search(g, req, progress=progress)
    if whole:  # the plan chose the split: capture again at its micro-batch
        micro = model_graph(cfg.model, input_shape=cfg.input_shape, batch_size=cfg.batch_size,
                            seed=cfg.seed, costs=job.costs,
                            split=p.microbatches * p.layout.copies, threads=cfg.threads,
                            progress=progress, leaves=tuple(cfg.leaves))
        if not np.array_equal(np.sort(micro.ids), np.sort(g.ids)):
            p = _replanned(micro, req, p)
        else:  # predicted on the whole batch's costs scaled down linearly: predict on these
            p = _predicted_on(p, micro)
        g = micro
    return g, p


def _predicted_on(p: Plan, g: Graph, schedule_file: str | None = None) -> Plan:
    """``p`` with its prediction simulated on ``g`` (with ``schedule_file``'s action lists if
    given), the graph the job trains. After the layout search: the search weighed micro-batch
    counts on the whole batch's graph rescaled (``graph.batch.at_microbatch``), which misses
    part of what does not shrink with the samples; hf:mixtral at dp 2 was predicted at 7.4 ms
    from there, 9.1 ms on its own capture at 4 samples (11.6 ms measured)."""
    from outcore.api import simulate
    return p.replace(predicted={**p.predicted,
                                **simulate(p, g, schedule_file=schedule_file).to_dict()})


def _replanned(g: Graph, req: PlanRequest, chosen: Plan) -> Plan:
    """The plan of ``chosen``'s layout on ``g``: the model captured at the chosen micro-batch
    has other nodes than at the whole batch (``torch.export`` specialises a batch of 1, and
    some models take other branches for it), so the placement is searched again with the
    layout the layout search chose held fixed."""
    from outcore.api import plan as search
    from outcore.search.layouts import LayoutChoice

    lay = chosen.layout
    fixed = LayoutChoice(dp=lay.dp, parallel=lay.mode, replicas=lay.replicas,
                         microbatches=chosen.microbatches, samples=g.batch_size, tp=lay.tp,
                         sp=lay.sp, depth=lay.depth).request(req, req.memory_policy)
    p = search(g, fixed)
    return p.with_notes(*chosen.notes, "the model at the chosen micro-batch has other nodes "
                        "than at the whole batch: placed again with the chosen layout")


def settle(job: Job, p: Plan) -> Job:
    """``job`` with the micro-batch count, schedule and model copies of its plan (which may
    have chosen them: the user gave none)."""
    if (job.cfg.microbatches, job.cfg.schedule, job.copies) == \
            (p.microbatches, p.schedule, p.layout.copies):
        return job
    return replace(job, cfg=replace(job.cfg, microbatches=p.microbatches, schedule=p.schedule),
                   copies=p.layout.copies)


def train(model: str, devices: int = 1, *, memory: str | float | None = None,
          strategy: str = "auto", plan: str | None = None, parallel: str = "mp",
          replicas: int | None = None, dp: int = 1, tp: int = 1, memory_policy: str = "auto",
          input_shape: str | tuple[int, ...] | None = None, batch_size: int = 8,
          microbatches: int | None = None, steps: int = 10, schedule: str = "auto",
          optimizer: str = "adam", lr: float = 1e-3, lr_schedule: str = "none", seed: int = 0,
          data: str = "synthetic", costs: str = "profile", run_dir: str | None = None,
          metrics_out: str | None = None, trace: bool = True,
          checkpoint_dir: str | None = None, checkpoint_every: int = 0, resume: bool = False,
          on_nonfinite: str = "stop", timeout_s: float = 60.0, threads: int | None = 1,
          schedule_file: str | None = None, sp: int = 1, sp_join: str | None = None,
          sp_grid: str | None = None, search_layout: bool = False, task: str | None = None,
          shard: int | None = 1,
          leaves: tuple[str, ...] = (),
          progress: Callable[[str, int, int], None] | None = None,
          on_metrics: Callable[[dict[str, Any]], None] | None = None) -> TrainReport:
    """Train ``model`` on ``devices`` devices (see the module docstring).

    Args:
        model: model name (``torchvision:resnet18``, ``outcore:transformer``, ``file.py:fn``).
        devices: workers (one per device); 1 = plain single-process training.
        memory: per-device memory limit the plan must respect (``16GiB``).
        strategy: planner (``pardnn``, ``pipeline``, ...); ignored with ``plan``.
        parallel, replicas, dp: GEMS mode and replicas, data-parallel copies.
        tp: tensor-parallel ranks per device slot (``dp x tp`` divides ``devices``).
        shard: data-parallel copies that shard each slot's parameters, gradients and
            optimizer state (FSDP / ZeRO-3; divides ``dp``; None: the plan chooses).
        plan: a saved plan file to use instead of planning.
        schedule_file: a saved ``outcore-schedule/1`` file (``outcore plan --schedule-out``)
            whose action lists the workers run.
        input_shape: example input shape (``8x3x224x224``); the batch is ``batch_size``.
        batch_size: global batch per step.
        microbatches: micro-batches per step (default: the plan chooses them).
        schedule: ``1f1b``, ``gpipe`` or ``auto`` (the search's choice; a given plan's).
        search_layout: the plan also chooses ``dp`` and the GEMS mode (the layout options
            given are ignored).
        steps: training steps.
        costs: ``profile`` (measure each layer here) or ``estimate[:DEVICE]`` (analytical).
        run_dir: where artifacts go (default: a new ``outcore-runs/<time>-<model>[-N]``).
        on_nonfinite: ``stop`` at the first NaN/inf loss or gradient, or ``skip`` its update.
        task: what the targets are (``classification``, ``regression``, ``causal_lm``,
            ``masked_lm``, ``seq2seq_lm``; default: inferred from the model and its output).
        leaves: module paths or class names captured as single layers.
        progress: ``progress(phase, done, total)`` for the preparation phases.
        on_metrics: called with each step's metrics as rank 0 writes them.
        sp, sp_join, sp_grid: spatial parallelism (see ``outcore plan --help``).
    """
    if sp > 1 and microbatches is None:
        microbatches = 1  # a spatial plan splits the image, not the (small) batch
    job = make_job(model, devices, memory=memory, strategy=strategy, plan=plan,
                   parallel=parallel, replicas=replicas, dp=dp, tp=tp,
                   memory_policy=memory_policy, input_shape=input_shape,
                   batch_size=batch_size, microbatches=microbatches,
                   steps=steps, schedule=schedule, optimizer=optimizer, lr=lr,
                   lr_schedule=lr_schedule, seed=seed, data=data, costs=costs,
                   run_dir=run_dir, metrics_out=metrics_out, trace=trace,
                   checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                   resume=resume, on_nonfinite=on_nonfinite, timeout_s=timeout_s,
                   threads=threads, schedule_file=schedule_file, search_layout=search_layout,
                   task=task, leaves=tuple(leaves))
    job = replace(job, sp=sp, sp_join=sp_join, sp_grid=sp_grid, depth=shard)
    return run(job, progress=progress, on_metrics=on_metrics)


def make_job(model: str, devices: int, *, memory: Any, strategy: str, plan: str | None,
             parallel: str, replicas: int | None, dp: int, memory_policy: str, costs: str,
             tp: int = 1,
             run_dir: str | None, batch_size: int, microbatches: int | None,
             input_shape: Any, metrics_out: str | None, trace: bool,
             search_layout: bool = False, **cfg_fields: Any) -> Job:
    """The validated :class:`Job` of :func:`train`'s arguments (creates the run directory)."""
    if devices < 1:
        raise UsageError(f"--devices must be at least 1, got {devices}")
    if cfg_fields["steps"] < 1:
        raise UsageError(f"--steps must be at least 1, got {cfg_fields['steps']}")
    shape = parse_shape(input_shape) if isinstance(input_shape, str) else input_shape
    search_layout = search_layout and not plan and devices > 1
    copies = load_plan(plan).layout.copies if plan else \
        1 if search_layout else replicas_asked(parallel, replicas, devices, dp) * dp
    if devices % (dp * (tp or 1)):
        raise UsageError(f"--dp {dp} x --tp {tp} must divide --devices {devices}")
    auto = microbatches is None and not plan
    M = microbatches or (1 if auto else _default_microbatches(batch_size // copies,
                                                              devices // (dp * (tp or 1))))
    if batch_size % (M * copies):
        raise UsageError(f"batch size {batch_size} does not split into {M} micro-batches x "
                         f"{copies} model copies: make --batch-size a multiple of "
                         f"{M * copies}")
    if cfg_fields.get("task"):
        from outcore.zoo.ecosystem import with_task
        model = with_task(model, cfg_fields["task"])
    root = _run_dir(run_dir, model)
    cfg = TrainConfig(model=model, input_shape=shape, batch_size=batch_size, microbatches=M,
                      metrics_out=metrics_out or str(root / "metrics.jsonl"),
                      trace_dir=str(root / "trace") if trace else None, **cfg_fields)
    return Job(cfg=cfg, devices=devices, memory=memory, plan_path=plan, costs=costs,
               strategy=strategy, parallel=parallel, replicas=replicas, dp=dp, tp=tp,
               memory_policy=memory_policy, copies=copies, run_dir=str(root),
               microbatches_auto=auto, search_layout=search_layout)


def _run_dir(run_dir: str | None, model: str) -> Path:
    """The run's folder: ``run_dir``, or a new ``outcore-runs/<time>-<model>[-N]`` (jobs
    started in the same second never share one); other ranks of a launched job get rank 0's
    folder by broadcast, so they create none of their own."""
    from outcore.core.env import detect
    from outcore.runtime.rundir import unique_run_dir
    if run_dir or detect().rank != 0:
        root = Path(run_dir or "outcore-runs")
        root.mkdir(parents=True, exist_ok=True)
        return root
    return unique_run_dir("outcore-runs", _slug(model))


def run(job: Job, *, progress: Callable[[str, int, int], None] | None = None,
        on_metrics: Callable[[dict[str, Any]], None] | None = None) -> TrainReport:
    """Prepare (capture, cost, plan), start the workers, train, and report."""
    from outcore.core.env import detect
    if detect().launcher != "none":
        return _train_in_job(job)
    g, p = prepare(job, progress=progress)
    job = settle(job, p)
    p = _only_used_devices(g, p, progress)
    p = _with_schedule_file(job.cfg, g, p)
    root = Path(job.run_dir)
    _save_artifacts(job, g, p)
    from outcore.runtime.launch import run_local
    from outcore.runtime.worker import train_worker

    if progress:
        progress(f"starting {p.devices} worker(s)", 0, 1)
    watcher = _MetricsWatcher(Path(job.cfg.metrics_out or root / "metrics.jsonl"), on_metrics)
    results = run_local(train_worker, p.devices, (_with_spin(job.cfg, p.devices),
                                                   graph_to_dict(g), plan_to_dict(p)),
                        timeout_s=job.cfg.timeout_s, threads=job.cfg.threads,
                        poll=watcher.poll)
    watcher.poll()
    return _report(job.cfg, g, p, root, results)


def _with_spin(cfg: TrainConfig, workers: int) -> TrainConfig:
    """``cfg`` with the same-host receives' poll decided here, before the workers start (in a
    worker the decision could count its starting siblings as other load)."""
    from outcore.core.samehost import auto_spin_us
    return replace(cfg, spin_us=auto_spin_us(workers))


def _only_used_devices(g: Graph, p: Plan,
                       progress: Callable[[str, int, int], None] | None) -> Plan:
    """A plain plan that leaves devices idle runs on the devices it uses: local workers are
    started only for them, and the plan says why."""
    tp = p.layout.tp          # a device slot is tp ranks
    used = p.used_devices * tp
    extra = p.layout.sp - 1   # spatial plans: the extra tile ranks come after the stages
    if p.layout.replicated or used >= p.devices - extra:
        return p
    why = (f"the plan uses {used + extra} of {p.devices} devices ({p.strategy} found no faster "
           f"plan on more); starting {used + extra} worker(s)")
    log.info(why)
    if progress:
        progress(why, 0, 1)
    from outcore.placers.result import compact
    assignment = compact(p.assignment)[0]
    small = p.replace(devices=used + extra, assignment=assignment).with_notes(why)
    if p.spatial is not None:
        small = small.replace(spatial=replace(p.spatial, stage=int(
            assignment[p.spatial.indices(g)[0]])))
    return _predicted_on(small, g)


def _save_artifacts(job: Job, g: Graph, p: Plan) -> None:
    root = Path(job.run_dir)
    save_graph(g, root / "graph.json")
    save_plan(p, root / "plan.json")
    (root / "config.json").write_text(json.dumps(job.cfg.to_dict(), indent=1))


def _default_microbatches(batch: int, devices: int) -> int:
    if devices == 1:
        return 1
    for m in (2 * devices, devices, 2, 1):
        if batch % m == 0 and batch // m >= 1:
            return m
    return 1


def _slug(model: str) -> str:
    """The model's name for its run folder: ``resnet18`` of ``torchvision:resnet18``,
    ``gpt2`` of ``hf:gpt2:hidden_size=32`` (never its options), ``build`` of ``net.py:build``."""
    parts = model.split(":")
    name = parts[1] if len(parts) > 1 and parts[0] in ("hf", "timm", "outcore", "torchvision") \
        else parts[-1]
    return "".join(c if c.isalnum() else "-" for c in name or model)[:40]


class _MetricsWatcher:
    """Tails rank 0's metrics file and hands each new line of this run to a callback.

    The file may be one an earlier run left in the same run folder, until rank 0 replaces it
    (a fresh run makes a new file, a resumed one rewrites it keeping its earlier steps): lines
    stamped before this watcher started are not this run's progress and are skipped, and a
    replaced or shorter file is read from its start. A line that is not JSON is skipped: the
    progress display never stops a run."""

    def __init__(self, path: Path, callback: Callable[[dict[str, Any]], None] | None):
        self.path, self.callback, self.offset = path, callback, 0
        self.since = time.time()
        self.inode: int | None = None

    def poll(self) -> None:
        if self.callback is None:
            return
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self.inode or st.st_size < self.offset:
                    self.inode, self.offset = st.st_ino, 0
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1  # a torn last line waits for its end
        self.offset += end
        for line in chunk[:end].decode("utf-8", "replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and float(record.get("time", 0)) >= self.since:
                self.callback(record)


def _report(cfg: TrainConfig, g: Graph, p: Plan, root: Path,
            results: list[dict[str, Any]]) -> TrainReport:
    r0 = results[0]
    report = TrainReport(cfg, p, root, r0["losses"], r0["step_s"], r0["peak_bytes"],
                         r0["busy_s"], dict(p.predicted))
    files = {"graph": str(root / "graph.json"), "plan": str(root / "plan.json"),
             "metrics": cfg.metrics_out or ""}
    if cfg.trace_dir and Path(cfg.trace_dir).is_dir():
        files.update(_timeline_files(cfg, g, p, root, report))
    report.files = files
    (root / "report.json").write_text(json.dumps(_strict(report.to_dict()), indent=1,
                                                 allow_nan=False))
    return report


def _strict(value: Any) -> Any:
    """``value`` with NaN and infinities as None (strict JSON: a skipped step has no loss)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def _timeline_files(cfg: TrainConfig, g: Graph, p: Plan, root: Path,
                    report: TrainReport | None = None) -> dict[str, str]:
    """Merge the ranks' measured timelines; draw them under the simulator's prediction."""
    from outcore.api import simulate
    from outcore.trace import Timeline, comm_profile, load_events, save_chrome_trace

    parts = sorted(Path(cfg.trace_dir).glob("rank*.json"))
    if not parts:
        return {}
    events = []
    for part in parts:
        events += list(load_events(part).events)
    measured = Timeline(p.devices // p.layout.tp, tuple(sorted(events, key=lambda e: e.start_s)),
                        max((e.end_s for e in events), default=0.0), source="measured")
    predicted = simulate(p, g, schedule_file=cfg.schedule_file).timeline
    if report is not None:
        report.comm = comm_profile(measured, predicted)
    out = {"trace": str(save_chrome_trace(root / "trace.json", [predicted, measured],
                                          ["predicted", "measured"]))}
    try:
        from outcore.viz import draw_comparison
        draw_comparison(predicted, measured, root / "timeline.png")
        out["timeline"] = str(root / "timeline.png")
    except Exception as e:  # a picture must never fail a finished training run
        log.warning("could not draw the timeline: %s", e)
    return out


def _train_in_job(job: Job) -> TrainReport:
    """Under torchrun/mpirun/srun: rank 0 plans and broadcasts; every rank trains."""
    from outcore.runtime.launch import run_in_job

    return run_in_job(_job_main, (job,), timeout_s=job.cfg.timeout_s, threads=job.cfg.threads)


def _job_main(ctx: Any, job: Job) -> TrainReport | None:
    import torch.distributed as dist

    from outcore.runtime.worker import train_worker

    if job.devices != ctx.world_size:
        raise UsageError(f"--devices {job.devices} but the job has {ctx.world_size} processes")
    docs: list[Any] = [None, None, None]
    if ctx.rank == 0:
        g, p = prepare(job, local=False)
        job = settle(job, p)
        p = _with_schedule_file(job.cfg, g, p)
        _save_artifacts(job, g, p)
        docs = [graph_to_dict(g), plan_to_dict(p), job]
    dist.broadcast_object_list(docs, src=0)
    job = docs[2]  # rank 0's run directory and paths for everyone
    result = train_worker(ctx, job.cfg, docs[0], docs[1])
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, result)
    if ctx.rank != 0:
        return None
    return _report(job.cfg, g, p, Path(job.run_dir), gathered)  # rank 0's own graph and plan


def _with_schedule_file(cfg: TrainConfig, g: Graph, p: Plan) -> Plan:
    """With a schedule file, the prediction is that file's action lists, simulated."""
    return _predicted_on(p, g, cfg.schedule_file) if cfg.schedule_file else p
