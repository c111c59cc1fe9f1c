"""The training worker: what every rank runs for ``outcore train``."""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from outcore.config import TrainConfig, data_source
from outcore.core.modules import saved_buffers
from outcore.core.samehost import SPIN_ENV
from outcore.errors import NonFiniteError, OutcoreError, PlanError, RuntimeFailure, UsageError
from outcore.graph.io import from_dict as graph_from_dict
from outcore.hardware.allocator import frozen_objects
from outcore.plan.plan import align, from_dict as plan_from_dict
from outcore.runtime import checkpoint, resume
from outcore.runtime.data import ImageFolderData, SyntheticData, TextData, split
from outcore.runtime.trainer import Trainer
from outcore.runtime.weights import load_weights
from outcore.schedule import io as schedule_io
from outcore.trace import Timeline, save_events
from outcore.zoo import build_model, built_for_real
from outcore.zoo.weightless import built_in_part, registered

log = logging.getLogger(__name__)


def make_optimizer(cfg: TrainConfig):
    """``params -> optimizer`` for the configured optimizer.

    The multi-tensor (``foreach``) implementation whenever the parameters are plain tensors:
    PyTorch picks it by default on CUDA only, and on CPU loops over the tensors in Python
    instead, which for a rank's many small tensors is most of the step (128 tensors of a
    64-layer MLP on one CPU thread: SGD with momentum 351 us with the multi-tensor kernels
    against 548 us looping, Adam 1121 against 1759 us). Tensor-parallel shards (DTensors)
    beside plain tensors keep PyTorch's choice: its multi-tensor kernels take one kind or the
    other."""
    opt = cfg.optim
    name = opt.optimizer.lower()
    kinds = {"adam": lambda ps, fe: torch.optim.Adam(ps, lr=opt.lr,
                                                     weight_decay=opt.weight_decay, foreach=fe),
             "adamw": lambda ps, fe: torch.optim.AdamW(ps, lr=opt.lr,
                                                       weight_decay=opt.weight_decay, foreach=fe),
             "sgd": lambda ps, fe: torch.optim.SGD(ps, lr=opt.lr, momentum=opt.momentum,
                                                   weight_decay=opt.weight_decay, foreach=fe)}
    if name not in kinds:
        raise UsageError(f"unknown optimizer {opt.optimizer!r}: choose adam, adamw or sgd")

    def make(params):
        params = list(params)
        plain = not any(hasattr(p, "to_local") for p in params)
        return kinds[name](params, True if plain else None)

    return make


def make_lr_scheduler(cfg: TrainConfig):
    if cfg.optim.lr_schedule == "none":
        return None
    if cfg.optim.lr_schedule == "cosine":
        steps = max(cfg.run.steps, 1)
        return lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    if cfg.optim.lr_schedule == "step":
        return lambda opt: torch.optim.lr_scheduler.StepLR(opt, max(cfg.run.steps // 3, 1), 0.1)
    raise UsageError(f"unknown lr schedule {cfg.optim.lr_schedule!r}: choose none, cosine or step")


# after the first two steps, peak memory is measured on every MEASURE_EVERY-th step only: on CPU
# the tracker sees every tensor PyTorch creates, and a measured step of the transformer's 2-stage
# pipeline took ~3x an ordinary one (one step in ten measured: 5.98 ms a step on average, 4.98
# median; benchmarks/step_wall.py)
MEASURE_EVERY = 100


def _rank_part(build: Any, seed: int, names: list[str], order: list[tuple[str, ...]]) -> Any:
    """The model with the parameters ``names`` built as the whole model has them with ``seed``
    (:func:`outcore.zoo.weightless.built_in_part`); a model that cannot be built so is built
    whole (the same values, all of them)."""
    torch.manual_seed(seed)
    try:
        return built_in_part(build, set(names), order)
    except Exception as e:  # its build reads a parameter back, or registers others
        log.info("building the whole model: this rank's part alone could not be built (%s: %s)",
                 type(e).__name__, e)
    torch.manual_seed(seed)
    return built_for_real(build, "the model")


def build_trainer(cfg: TrainConfig, graph_doc: dict[str, Any], plan_doc: dict[str, Any],
                  device: torch.device):
    """Resolve the model, build it with the seed, and make this rank's :class:`Trainer`."""
    graph = graph_from_dict(graph_doc, source="graph")
    plan = align(plan_from_dict(plan_doc, source="plan"), graph) \
        if plan_doc.get("graph", {}).get("depth") is None else plan_from_dict(plan_doc)
    made = graph.meta.get("precision", "32")
    if made != cfg.graph.precision:
        raise PlanError(f"the graph was captured in precision {made}, the run asks for "
                        f"{cfg.graph.precision}: capture and plan with --precision "
                        f"{cfg.graph.precision}")
    # every rank builds its part: the model without its weights (a tensor-parallel rank splits
    # its layers so, shards without values), traced and cut; then only the parameters its
    # pieces use, with the whole model's values (a tp rank cuts its shards from them, a
    # sharded rank keeps its shard)
    spec, model = build_model(cfg.graph.model, input_shape=cfg.graph.input_shape,
                              batch_size=cfg.graph.batch_size, seed=cfg.run.seed, weights=False)
    order = registered(model)
    micro_inputs = split(spec.example_inputs, cfg.planning.microbatches * plan.layout.copies)[0]
    schedule_file = cfg.planning.schedule_file
    schedule_doc = schedule_io.load(schedule_file) if schedule_file else None
    trainer = Trainer(model, graph, plan, microbatches=cfg.planning.microbatches,
                      micro_inputs=micro_inputs, schedule=cfg.planning.schedule,
                      optimizer=make_optimizer(cfg), lr_scheduler=make_lr_scheduler(cfg),
                      device=device, timeout_s=cfg.run.timeout,
                      track_memory=cfg.worker.track_memory,
                      schedule_doc=schedule_doc,
                      materialise=lambda names: _rank_part(spec.build, cfg.run.seed, names,
                                                           order),
                      precision=cfg.graph.precision,
                      build_batch_bytes=cfg.worker.build_batch_bytes)
    trainer.start_weights = cfg.graph.weights or spec.weights  # given, or the model's own
    if trainer.scaler is not None:
        trainer.scaler.scale = cfg.worker.loss_scale
    output_name = next(n.name for n in trainer.gm.graph.nodes if n.op == "output")
    output_meta = trainer.executor.metas[output_name]
    kind, path = data_source(cfg.dataset.data)
    if kind == "synthetic":
        data = SyntheticData(spec.example_inputs, spec.int_high, output_meta, cfg.graph.batch_size,
                             cfg.run.seed, cfg.graph.task or spec.task, spec.task_options)
    elif kind == "imagefolder":
        data = ImageFolderData(path, spec.example_inputs[0],
                               cfg.graph.batch_size, cfg.run.seed)
    elif kind == "text":
        data = TextData(path, spec.example_inputs[0],
                        cfg.graph.batch_size,
                        cfg.run.seed, cfg.graph.task or spec.task, spec.task_options,
                        vocab=spec.int_high[0] if spec.int_high else None)
    else:  # tiles, huge images: each tile rank reads only its tile
        from outcore.parallel.spatial.data import TileFolderData
        data = TileFolderData.for_trainer(path, trainer, cfg.graph.batch_size, cfg.run.seed)
    if trainer.spatial is not None and kind != "tiles":
        from outcore.parallel.spatial.data import TileCut  # the tile group holds only its tiles
        data = TileCut.for_trainer(data, trainer)
    return trainer, data


def train_worker(ctx: Any, cfg: TrainConfig, graph_doc: dict[str, Any],
                 plan_doc: dict[str, Any]) -> dict[str, Any]:
    """Train ``cfg.run.steps`` steps on this rank; rank 0 writes the metrics. Returns a summary."""
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if ctx.backend == "nccl" \
        else torch.device("cpu")
    if cfg.run.on_nonfinite not in ("stop", "skip"):
        raise UsageError(f"unknown on_nonfinite {cfg.run.on_nonfinite!r}: choose stop or skip")
    if cfg.worker.spin_us is not None:  # the launcher's decision; the environment's wins
        os.environ.setdefault(SPIN_ENV, f"{cfg.worker.spin_us:g}")
    trainer, data = build_trainer(cfg, graph_doc, plan_doc, device)
    cap_allocator(device, plan_doc.get("memory_bytes"))
    trainer.executor.guard_nonfinite = True
    begun = resume.begin(trainer, cfg)
    if trainer.start_weights and begun.checkpoint is None:  # a resumed run has its own
        load_weights(trainer, trainer.start_weights)
    try:
        # the model, the pieces and torch's own objects live as long as the steps: left out of
        # the garbage collector's scans while they run
        with frozen_objects(collect=True):
            return _train_steps(ctx, cfg, trainer, data, begun)
    finally:
        if begun.lock is not None:
            begun.lock.release()


def cap_allocator(device: torch.device, limit: float | None) -> float | None:
    """On CUDA, cap this process's caching allocator at the plan's memory limit, so that a
    plan that does not fit fails loudly (an out-of-memory error naming the rank and step)
    instead of running over the limit it promised. Returns the fraction set (None: no cap)."""
    if device.type != "cuda" or not limit:
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(float(limit) / total, 1.0)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def _train_steps(ctx: Any, cfg: TrainConfig, trainer: Any, data: Any,
                 begun: resume.Start) -> dict[str, Any]:
    rank, world = trainer.rank, trainer.world
    start = begun.step
    last_good = begun.checkpoint
    metrics_file = resume.open_metrics(cfg.run.metrics_out, start) if rank == 0 else None
    losses, step_times, last_events = [], [], []
    peaks = [0] * world
    measured_at = -1
    busy = [0.0] * world
    host = [0] * world
    step = start
    try:
        for step in range(start, cfg.run.steps):
            if step == cfg.worker.fail_at_step and rank == cfg.worker.fail_rank:
                _inject_failure(cfg)
            need = trainer.needs_inputs or trainer.needs_targets
            d0 = time.perf_counter()
            inputs, targets = trainer.on_device(*data.batch(step)) if need else (None, None)
            data_s = time.perf_counter() - d0
            if world > 1:
                _barrier(ctx, cfg.run.timeout, trainer.messenger)
            t0 = time.perf_counter()
            last = step == cfg.run.steps - 1
            measure = cfg.worker.track_memory and (step < start + 2 or step % MEASURE_EVERY == 0)
            report = trainer.step(inputs, targets, trace=last and cfg.worker.trace_dir is not None,
                                  track_memory=measure)
            step_s = time.perf_counter() - t0
            gathered = trainer.messenger.gather_over_ranks([float(report.peak_bytes),
                                                            report.busy_s, host_peak_bytes()])
            if measure:  # steps without measurement repeat the latest measured peaks
                peaks = [int(g[0]) for g in gathered]
                measured_at = step
            busy = [g[1] for g in gathered]
            host = [int(g[2]) for g in gathered]
            losses.append(report.loss)
            step_times.append(step_s)
            last_events = report.events
            bad = trainer.executor.nonfinite or (False, False)
            scaler = trainer.scaler
            overflow = scaler is not None and bad == (False, True)  # 16-mixed: scale backs off
            if metrics_file is not None:
                record = {"step": step, "steps": cfg.run.steps, "time": time.time(),
                          "loss": report.loss, "step_s": step_s, "data_s": data_s,
                          "samples_per_s": cfg.graph.batch_size / step_s, "peak_bytes": peaks,
                          "peak_measured_at": measured_at, "busy_s": busy,
                          "host_peak_bytes": host}
                if scaler is not None:
                    record["loss_scale"] = scaler.scale
                if overflow:
                    record["skipped"] = True  # the loss scale overflowed the gradients
                elif any(bad):
                    record["nonfinite"] = [w for w, b in zip(("loss", "gradient"), bad) if b]
                    record["skipped"] = cfg.run.on_nonfinite == "skip"
                metrics_file.write(resume.json_line(record))
                metrics_file.flush()
            if overflow:
                log.info("step %d: the scaled gradients overflowed float16: skipped; loss "
                         "scale now %g", step, scaler.scale)
            elif any(bad):
                _on_nonfinite(cfg, step, report.loss, bad, last_good)
            if cfg.run.checkpoint_dir and cfg.run.checkpoint_every and \
                    (step + 1) % cfg.run.checkpoint_every == 0:
                last_good = checkpoint.save(trainer, cfg.run.checkpoint_dir, step + 1)
    except OutcoreError as e:
        if f"step {step}" in str(e):
            raise
        raise type(e)(f"{e} (step {step})") from e
    except Exception as e:  # name the rank and the step of any failure inside a step
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "more than 1 value per channel" in text:
            text = (f"batch norm cannot train on a micro-batch of "
                    f"{cfg.graph.batch_size // max(cfg.planning.microbatches, 1)} (it needs "
                    "more than one "
                    "value per channel): use a larger --batch-size or fewer --microbatches")
        raise RuntimeFailure(f"rank {rank} step {step}: {type(e).__name__}: {text}") from e
    finally:
        if metrics_file is not None:
            metrics_file.close()
    trainer.sync_running_stats()  # the trained model: replicas agree on their statistics
    if cfg.worker.trace_dir and last_events and trainer.shard == 0:  # one timeline per device slot
        tl = Timeline(world, tuple(last_events), max((e.end_s for e in last_events), default=0),
                      source="measured", meta={"rank": rank})
        save_events(Path(cfg.worker.trace_dir) / f"rank{rank}.json", tl)
    return _summary(cfg, trainer, {"rank": rank, "losses": losses, "step_s": step_times,
                                   "peak_bytes": peaks, "peak_measured_at": measured_at,
                                   "busy_s": busy, "host_peak_bytes": host,
                                   "built_bytes": trainer.built_bytes})


def _summary(cfg: TrainConfig, trainer: Any, out: dict[str, Any]) -> dict[str, Any]:
    """What the worker returns: its figures, its pieces, and (tests) its final state."""
    out["pieces"] = [p.id for p in trainer.pieces.pieces if p.device == trainer.slot]
    if trainer.tensor_layout is not None:
        out["tensor_split"] = list(trainer.tensor_layout.split_modules)
    if trainer.sharder is not None:
        out["sharded"] = sorted(trainer.sharder.by_name)
    if cfg.worker.return_state:  # whole tensors (a tensor-parallel shard gathered from its group)
        out["state"] = {k: _whole(v).detach().cpu().clone()
                        for k, v in trainer.full_parameters().items()}
        out["buffers"] = {k: b.detach().cpu().clone() for k, b in saved_buffers(trainer.gm)
                          if b.device.type != "meta"}
    return out


def host_peak_bytes() -> int:
    """This process's peak resident memory so far (what a node's RAM must hold for it): the
    tensors, and the interpreter, libraries and allocator slack around them."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, else KiB


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _on_nonfinite(cfg: TrainConfig, step: int, loss: float, bad: tuple[bool, bool],
                  last_good: Path | None) -> None:
    """Stop (one line naming the step and the last good checkpoint) or log the skipped step."""
    what = " and ".join(w for w, b in zip(("loss", "gradient"), bad) if b)
    detail = f"loss {loss}" if bad[0] else "a NaN or infinite gradient"
    if cfg.run.on_nonfinite == "skip":
        log.warning("step %d: non-finite %s (%s); skipped its optimizer update", step, what,
                    detail)
        return
    ckpt = f"the last good checkpoint is {last_good}" if last_good is not None else \
        "no checkpoint was written yet" + ("" if cfg.run.checkpoint_dir
                                           else " (no --checkpoint-dir)")
    raise NonFiniteError(f"step {step}: non-finite {what} ({detail}); stopped before its "
                         f"optimizer update; {ckpt}. Lower --lr, or pass --on-nonfinite skip "
                         "to skip such steps")


def _barrier(ctx: Any, timeout_s: float, messenger: Any) -> None:
    """Line the ranks up before a step; on gloo, a rank that does not arrive is named (on the
    same-host links too: a sum over them, whose receives name a silent or exited peer; 0.03-0.04
    ms a step against gloo's barrier's 0.17-0.28 ms between 2 ranks here)."""
    if messenger.sum_on_links:
        messenger.sum_over_ranks([1.0], "waiting for the other ranks before a step")
    elif ctx.backend == "gloo":
        from datetime import timedelta
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=timeout_s), wait_all_ranks=True)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0]
            raise RuntimeFailure(f"rank {dist.get_rank()}: waiting for the other ranks before "
                                 f"a step: {first}") from e
    else:
        dist.barrier()


def _inject_failure(cfg: TrainConfig) -> None:
    """Fault injection for tests: raise, hang, or die hard at a chosen step."""
    if cfg.worker.fail_mode == "hang":
        time.sleep(10 * cfg.run.timeout + 60)
    if cfg.worker.fail_mode == "exit":
        os._exit(3)
    raise RuntimeError(f"injected failure at step {cfg.worker.fail_at_step}")
