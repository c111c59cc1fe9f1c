"""The job orchestrator behind ``outcore.train``: resolve the configuration, capture, cost,
plan, launch the workers, and report against the prediction.

On a plain machine it spawns one local worker process per device (gloo on CPU, NCCL on GPUs);
under torchrun, mpirun or srun it joins the job it is in (rank 0 plans, every rank trains).
Every artifact goes to the run folder: ``graph.json``, ``plan.json``, ``config.json``,
``metrics.jsonl``, ``trace/`` (measured timelines), ``timeline.png`` (measured beside
predicted), ``trace.json`` (Chrome/Perfetto) and ``report.json``. A run that writes
checkpoints keeps its configuration and plan beside them, and a resumed run starts from those.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from outcore.config import (
    TrainConfig,
    data_source,
    default_of,
    degree,
    differences,
    dumps,
    from_options,
    options_doc,
)
from outcore.core.env import detect
from outcore.errors import PlanError, UsageError
from outcore.graph.io import save as save_graph, to_dict as graph_to_dict
from outcore.graph.ir import Graph
from outcore.placers.result import compact
from outcore.plan.plan import (
    Plan,
    align,
    load as load_plan,
    save as save_plan,
    to_dict as plan_to_dict,
)
from outcore.plan.request import PlanRequest, replicas_asked
from outcore.report import MetricsWatcher, TrainReport, report
from outcore.runtime import checkpoint, resume
from outcore.runtime.local_cluster import local_cluster
from outcore.runtime.rundir import unique_run_dir
from outcore.search.layouts import LayoutChoice
from outcore.search.verdict import fits

log = logging.getLogger(__name__)

# the options that fix the layout: with none of them given, train searches it
LAYOUT_OPTIONS = ("parallel", "replicas", "dp", "tp", "shard", "plan")


@dataclass(frozen=True, kw_only=True)
class Job:
    """One training job, resolved once.

    Attributes:
        cfg: the whole configuration, resolved: the model named with its task, the batch
            size, the micro-batches (an int, or "auto" while the plan has not chosen), the run
            folder and the files in it; every worker receives it.
        copies: model copies (GEMS replicas x dp) that split each global batch: the saved
            plan's, or the request's (:func:`replicas_asked` x ``dp``).
        search_layout: the plan chooses the layout (dp, GEMS mode and replicas, tp, shard).
        tp, depth: the request's tensor-parallel and sharding degrees (None: searched).
        asked: the configuration as asked for, before it was resolved (what a checkpoint
            folder keeps for a resumed run).
    """

    cfg: TrainConfig
    asked: TrainConfig
    copies: int
    search_layout: bool
    tp: int | None
    depth: int | None

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run.run_dir or ".")

    @property
    def microbatches_auto(self) -> bool:
        """The plan chooses the micro-batch count."""
        return self.cfg.planning.microbatches == "auto"


def train(model: str, devices: int | None = None, *,
          progress: Callable[[str, int, int], None] | None = None,
          on_metrics: Callable[[dict[str, Any]], None] | None = None,
          **options: Any) -> TrainReport:
    """Train ``model`` on ``devices`` devices: capture, cost, plan, start one worker per
    device, train, and report measured time and memory beside the plan's prediction.

    ``progress(phase, done, total)`` follows the preparation; ``on_metrics(record)`` receives
    each step's metrics as rank 0 writes them. Every option of ``outcore train`` is a keyword
    argument of the same name (``_`` for ``-``):

{options}
    """
    given = {"model": model, **options}
    if devices is not None:
        given["devices"] = devices
    return run(resolve(given), progress=progress, on_metrics=on_metrics)


train.__doc__ = (train.__doc__ or "").format(options=options_doc("train"))


def resolve(given: dict[str, Any]) -> Job:
    """The :class:`Job` of the options ``given`` (flat names, as ``outcore.train`` takes
    them; creates the run folder). A resumed run starts from the configuration saved with its
    checkpoints, and the options given now replace it (the run says which)."""
    cfg = from_options(given)
    if cfg.run.resume:
        cfg = _resumed(cfg, given)
    check_inputs(cfg)
    asked = cfg
    run, planning, graph = cfg.run, cfg.planning, cfg.graph
    devices = planning.devices
    sp = planning.sp
    plan_file = planning.plan
    search_layout = devices > 1 and not plan_file and (
        planning.layout == "auto" or (planning.layout is None and sp == 1 and not any(
            getattr(planning, k) is not None for k in LAYOUT_OPTIONS)))
    tp = degree(planning.tp, search_layout)
    depth = degree(planning.shard, search_layout)
    dp = planning.dp or 1
    parallel = planning.parallel or "mp"
    copies = load_plan(plan_file).layout.copies if plan_file else \
        1 if search_layout else replicas_asked(parallel, planning.replicas, devices, dp) * dp
    if devices % (dp * (tp or 1)):
        raise UsageError(f"--dp {dp} x --tp {tp} must divide --devices {devices}")
    batch = graph.batch_size or default_of("batch_size")
    if batch is None:
        batch = 8
    mbs = planning.microbatches
    if mbs is None:
        mbs = 1 if sp > 1 else None  # a spatial plan splits the image, not the batch
    if mbs is None:
        mbs = _default_microbatches(batch // copies, devices // (dp * (tp or 1))) \
            if plan_file else "auto"
    if mbs != "auto" and batch % (mbs * copies):
        raise UsageError(f"batch size {batch} does not split into {mbs} micro-batches x "
                         f"{copies} model copies: make --batch-size a multiple of "
                         f"{mbs * copies}")
    steps = run.steps
    if cfg.dataset.epochs:
        steps = _steps_for_epochs(cfg.dataset.data, cfg.dataset.epochs, batch)
    model = graph.model
    if graph.task:
        from outcore.zoo.ecosystem import with_task
        model = with_task(model, graph.task)
    root = _run_dir(run.run_dir, model)
    cfg = cfg.replace(model=model, batch_size=batch, microbatches=mbs, steps=steps,
                      run_dir=str(root),
                      metrics_out=run.metrics_out or str(root / "metrics.jsonl"),
                      trace_dir=str(root / "trace") if run.timeline else None)
    return Job(cfg=cfg, asked=asked, copies=copies, search_layout=search_layout, tp=tp,
               depth=depth)


def check_inputs(cfg: TrainConfig) -> None:
    """Refuse, before capture and profiling, what would otherwise stop the workers: more local
    workers than GPUs, data that is not there, a checkpoint folder that cannot be written,
    nothing left to resume."""
    kind, path = data_source(cfg.dataset.data)
    want_dir = kind in ("imagefolder", "tiles")
    if kind != "synthetic" and not (Path(path).is_dir() if want_dir else Path(path).is_file()):
        what = "folder" if want_dir else "file"
        inside = {"imagefolder": "one sub-folder of images per class",
                  "tiles": "one sub-folder of images per class, read tile by tile",
                  "text": "the text to train on, as bytes"}[kind]
        raise UsageError(f"no {what} at {path} (--data {kind}:{what.upper()}: {inside})")
    if detect().launcher == "none":  # local workers: one GPU each, where there are GPUs
        from outcore.runtime.launch import check_gpus
        check_gpus(cfg.planning.devices)
    weights = cfg.graph.weights
    if weights and not Path(weights).exists():
        raise UsageError(f"no weights file at {weights} (--weights: a .safetensors file, a "
                         "folder of them, or a torch state dict)")
    folder = cfg.run.checkpoint_dir
    if cfg.run.resume and not folder:
        raise UsageError("--resume needs --checkpoint-dir (the folder to resume from)")
    if not folder:
        return
    try:
        Path(folder).mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise UsageError(f"cannot write checkpoints to {folder}: {e.strerror or e}; pass a "
                         "--checkpoint-dir you can write") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write checkpoints to {folder}: permission denied; pass a "
                         "--checkpoint-dir you can write")
    found = checkpoint.latest(folder) if cfg.run.resume else None
    if found is not None:
        resume.refuse_finished(found[0], found[1], cfg.run.steps)


def _steps_for_epochs(data: str, epochs: int, batch: int) -> int:
    """Steps of ``epochs`` passes over an image folder of global batches."""
    kind, path = data_source(data)
    if kind != "imagefolder":
        raise UsageError("--epochs needs --data imagefolder:PATH; with synthetic data use "
                         "--steps")
    import torchvision
    n = len(torchvision.datasets.ImageFolder(path))
    return max(1, epochs * (n // batch))


SAVED_CONFIG, SAVED_PLAN = checkpoint.SAVED_CONFIG, checkpoint.SAVED_PLAN
# options a resumed run may change without planning again
FREE_ON_RESUME = ("steps", "run_dir", "metrics_out", "trace", "checkpoint_every", "resume",
                  "on_nonfinite", "timeout", "explain", "timeline", "lr", "lr_schedule",
                  "data", "epochs")


def _resumed(cfg: TrainConfig, given: dict[str, Any]) -> TrainConfig:
    """``cfg`` for a resumed run: the configuration saved in its checkpoint folder, with the
    options given now in its place; the plan saved there too unless an option given now
    changes what is planned. Says what changed."""
    folder = Path(cfg.run.checkpoint_dir or "")
    saved_path = folder / SAVED_CONFIG
    if not cfg.run.checkpoint_dir or not saved_path.is_file():
        return cfg  # nothing saved (a folder written by an older outcore): as given
    try:
        saved = TrainConfig.from_dict(json.loads(saved_path.read_text()))
    except (ValueError, TypeError) as e:
        raise UsageError(f"{saved_path} is not a configuration outcore wrote ({e}): resume "
                         "with the options of the run that wrote it, or drop --resume") from None
    saved = saved.replace(run_dir=None, metrics_out=None)  # a new run folder each run
    merged = saved.replace(**{k: v for k, v in _given_fields(cfg, given).items()})
    changed = differences(saved, merged)
    replanned = [name for name, _, _ in changed if name not in FREE_ON_RESUME]
    if not replanned and (folder / SAVED_PLAN).is_file() and merged.planning.plan is None:
        merged = merged.replace(plan=str(folder / SAVED_PLAN))
    shown = "; ".join(f"{name} {old!r} -> {new!r}" for name, old, new in changed
                      if name != "resume")
    log.warning("resuming with the configuration saved in %s%s%s", folder,
                f" (changed now: {shown})" if shown else "",
                "; planning again" if replanned else ", and its plan")
    return merged


def _given_fields(cfg: TrainConfig, given: dict[str, Any]) -> dict[str, Any]:
    """The options the caller gave, as parsed in ``cfg`` (flat names)."""
    out = {}
    for name in given:
        for section in ("graph", "dataset", "optim", "planning", "run"):
            part = getattr(cfg, section)
            if hasattr(part, name):
                out[name] = getattr(part, name)
    return out


def prepare(job: Job, *, local: bool = True,
            progress: Callable[[str, int, int], None] | None = None) -> tuple[Graph, Plan]:
    """Capture the model at the micro-batch size, cost it, and plan it (or load the plan)."""
    from outcore.api import model_graph, plan as search

    cfg = job.cfg
    g_opts, planning = cfg.graph, cfg.planning
    whole = (job.microbatches_auto or job.search_layout) and not planning.plan

    def captured(split: int) -> Graph:
        return model_graph(g_opts.model, input_shape=g_opts.input_shape,
                           batch_size=g_opts.batch_size, seed=cfg.run.seed, costs=g_opts.costs,
                           split=split, threads=cfg.worker.threads, progress=progress,
                           leaves=tuple(g_opts.leaf), precision=g_opts.precision)

    mbs = planning.microbatches
    g = captured(1 if whole else int(mbs) * job.copies)
    if planning.plan:
        p = load_plan(planning.plan)
        if p.graph.get("depth") is None:
            p = align(p, g)
        if p.devices != planning.devices:
            raise PlanError(f"{planning.plan} is a plan for {p.devices} devices, but --devices "
                            f"is {planning.devices}: pass --devices {p.devices}, or re-plan")
        if planning.schedule not in ("auto", p.schedule):  # the schedule asked for
            p = _predicted_on(p.replace(schedule=planning.schedule), g)
        return g, p
    if progress:
        progress("planning", 0, 1)
    req = plan_request(job, local)
    p = search(g, req, progress=progress)
    if whole:  # the plan chose the split: capture again at its micro-batch
        micro = captured(p.microbatches * p.layout.copies)
        if not np.array_equal(np.sort(micro.ids), np.sort(g.ids)):
            p = _replanned(micro, req, p, "has other nodes at the chosen micro-batch than at "
                           "the whole batch")
        else:  # predicted on the whole batch's costs scaled down linearly: predict on these
            p = _predicted_on(p, micro)
            if not fits(p):  # the model at that size needs more than its rescaled costs said
                p = _replanned(micro, req, p, "needs more memory at the chosen micro-batch "
                               "than its costs rescaled from the whole batch said")
        g = micro
    return g, p


def plan_request(job: Job, local: bool = True) -> PlanRequest:
    """The planning request of a job (the cluster measured here when ``local``)."""
    planning, cfg = job.cfg.planning, job.cfg
    devices = planning.devices
    parallel = planning.parallel or "mp"
    dp = planning.dp or 1
    return PlanRequest.make(
        devices, planning.memory, cluster=local_cluster(devices, local),
        strategy="single" if devices == (job.tp or 1) and job.copies == 1
        else planning.strategy, parallel=parallel,
        replicas=replicas_asked(parallel, planning.replicas, devices, dp)
        if parallel == "master" else None,
        dp=dp, schedule=planning.schedule, microbatches=planning.microbatches,
        optimizer=cfg.optim.planned, seed=cfg.run.seed, memory_policy=planning.memory_policy,
        batch_stats=planning.batch_stats,
        search_layout=job.search_layout, tp=None if job.search_layout else job.tp,
        depth=None if job.search_layout else job.depth, sp=planning.sp,
        sp_join=planning.sp_join, sp_grid=planning.sp_grid)


def _predicted_on(p: Plan, g: Graph, schedule_file: str | None = None) -> Plan:
    """``p`` with its prediction simulated on ``g`` (with ``schedule_file``'s action lists if
    given), the graph the job trains. After the layout search: the search weighed micro-batch
    counts on the whole batch's graph rescaled (``graph.batch.at_microbatch``), which misses
    part of what does not shrink with the samples; hf:mixtral at dp 2 was predicted at 7.4 ms
    from there, 9.1 ms on its own capture at 4 samples (11.6 ms measured)."""
    from outcore.api import simulate
    return p.replace(predicted={**p.predicted,
                                **simulate(p, g, schedule_file=schedule_file).to_dict()})



def _replanned(g: Graph, req: PlanRequest, chosen: Plan, why: str) -> Plan:
    """The plan of ``chosen``'s layout on ``g``, the model captured at the chosen micro-batch,
    placed again with the layout the layout search chose held fixed: where the capture has
    other nodes than at the whole batch (``torch.export`` specialises a batch of 1, and some
    models take other branches for it), or where ``chosen`` does not fit on its costs."""
    from outcore.api import plan as search

    lay = chosen.layout
    fixed = LayoutChoice(dp=lay.dp, parallel=lay.mode, replicas=lay.replicas,
                         microbatches=chosen.microbatches, samples=g.batch_size, tp=lay.tp,
                         sp=lay.sp, depth=lay.depth).request(req, req.memory_policy)
    p = search(g, fixed)
    return p.with_notes(*chosen.notes, f"the model {why}: placed again with the chosen layout")


def settle(job: Job, p: Plan) -> Job:
    """``job`` with the micro-batch count, schedule and model copies of its plan (which may
    have chosen them: the user gave none)."""
    planning = job.cfg.planning
    if (planning.microbatches, planning.schedule, job.copies) == \
            (p.microbatches, p.schedule, p.layout.copies):
        return job
    return replace(job, cfg=job.cfg.replace(microbatches=p.microbatches, schedule=p.schedule),
                   copies=p.layout.copies)


def _run_dir(run_dir: str | None, model: str) -> Path:
    """The run's folder: ``run_dir``, or a new ``outcore-runs/<time>-<model>[-N]`` (jobs
    started in the same second never share one); other ranks of a launched job get rank 0's
    folder by broadcast, so they create none of their own."""
    if run_dir or detect().rank != 0:
        root = Path(run_dir or "outcore-runs")
        root.mkdir(parents=True, exist_ok=True)
        return root
    return unique_run_dir("outcore-runs", _slug(model))


def run(job: Job, *, progress: Callable[[str, int, int], None] | None = None,
        on_metrics: Callable[[dict[str, Any]], None] | None = None) -> TrainReport:
    """Prepare (capture, cost, plan), start the workers, train, and report."""
    if detect().launcher != "none":
        return _train_in_job(job)
    g, planned = prepare(job, progress=progress)
    job = settle(job, planned)
    p = _only_used_devices(g, planned, progress)  # says so when it starts fewer workers
    _say_statistics(g, p, job.cfg.graph.batch_size, progress)
    p = _with_schedule_file(job.cfg, g, p)
    _save_artifacts(job, g, p)
    from outcore.runtime.launch import run_local
    from outcore.runtime.worker import train_worker

    cfg = job.cfg
    if progress and p.devices == planned.devices:
        progress(f"starting {_workers(p.devices)}", 0, 1)
    watcher = MetricsWatcher(Path(cfg.run.metrics_out or job.run_dir / "metrics.jsonl"),
                              on_metrics)
    results = run_local(train_worker, p.devices, (_with_spin(cfg, p.devices),
                                                   graph_to_dict(g), plan_to_dict(p)),
                        timeout_s=cfg.run.timeout, threads=cfg.worker.threads,
                        poll=watcher.poll)
    watcher.poll()
    return report(cfg, g, p, job.run_dir, results)


def _workers(n: int) -> str:
    return f"{n} worker{'s' if n != 1 else ''}"


def _with_spin(cfg: TrainConfig, workers: int) -> TrainConfig:
    """``cfg`` with the same-host receives' poll decided here, before the workers start (in a
    worker the decision could count its starting siblings as other load)."""
    from outcore.core.samehost import auto_spin_us
    return cfg.replace(spin_us=auto_spin_us(workers))


def _say_statistics(g: Graph, p: Plan, batch: int | None,
                    progress: Callable[[str, int, int], None] | None) -> None:
    """Say over which samples batch norm takes its statistics when they are not the whole
    batch (the plan split it into micro-batches or copies): the loss then differs from one
    device training the whole batch at once, and ``--microbatches`` is what fixes it."""
    from outcore.search.runnable import has_batch_statistics

    chunks = p.layout.copies * p.microbatches
    if chunks == 1 or not has_batch_statistics(g):
        return
    samples = f" of {batch // chunks} samples" if batch else ""
    said = (f"batch statistics: over each of {chunks} micro-batches{samples}, not the whole "
            "batch as one device with one micro-batch takes them (--microbatches sets how many)")
    log.info(said)
    if progress:
        progress(said, 0, 1)


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
           f"plan on more); starting {_workers(used + extra)}")
    log.info(why)
    if progress:
        progress(why, 0, 1)
    assignment = compact(p.assignment)[0]
    small = p.replace(devices=used + extra, assignment=assignment).with_notes(why)
    if p.spatial is not None:
        small = small.replace(spatial=replace(p.spatial, stage=int(
            assignment[p.spatial.indices(g)[0]])))
    return _predicted_on(small, g)


def _save_artifacts(job: Job, g: Graph, p: Plan) -> None:
    """The graph, the plan and the configuration in the run folder, and beside the
    checkpoints (what a resumed run starts from)."""
    root = job.run_dir
    save_graph(g, root / "graph.json")
    save_plan(p, root / "plan.json")
    (root / "config.json").write_text(dumps(job.cfg))
    folder = job.cfg.run.checkpoint_dir
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True, mode=0o700)
        asked = job.asked.replace(plan=None) if job.asked.planning.plan == str(
            Path(folder) / SAVED_PLAN) else job.asked
        (Path(folder) / SAVED_CONFIG).write_text(dumps(asked))
        save_plan(p, Path(folder) / SAVED_PLAN)


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



def _train_in_job(job: Job) -> TrainReport:
    """Under torchrun/mpirun/srun: rank 0 plans and broadcasts; every rank trains."""
    from outcore.runtime.launch import run_in_job

    return run_in_job(_job_main, (job,), timeout_s=job.cfg.run.timeout,
                      threads=job.cfg.worker.threads)


def _job_main(ctx: Any, job: Job) -> TrainReport | None:
    import torch.distributed as dist

    from outcore.runtime.worker import train_worker

    devices = job.cfg.planning.devices
    if devices != ctx.world_size:
        raise UsageError(f"--devices {devices} but the job has {ctx.world_size} processes")
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
    return report(job.cfg, g, p, job.run_dir, gathered)  # rank 0's own graph and plan


def _with_schedule_file(cfg: TrainConfig, g: Graph, p: Plan) -> Plan:
    """With a schedule file, the prediction is that file's action lists, simulated."""
    schedule_file = cfg.planning.schedule_file
    return _predicted_on(p, g, schedule_file) if schedule_file else p

