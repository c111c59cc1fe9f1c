"""outcore's public functions (the README's "The Python API"). Each CLI subcommand calls them only.

    g = outcore.capture(model, example_inputs)            # graph IR with module hierarchy
    g = outcore.profile(g, model, example_inputs)          # or outcore.estimate(g, "a100")
    g = outcore.model_graph("torchvision:resnet18", costs="estimate:a100")  # name -> costed
    p = outcore.plan(g, devices=4, memory="16GiB", strategy="pardnn")
    r = outcore.simulate(p, g, microbatches=8, schedule="1f1b")
    low = outcore.lower(p, g)                              # the schedule every rank runs
    report = outcore.train("outcore:transformer", devices=4, memory="64MiB")
    trainer = outcore.parallelize(model, example_inputs, plan=p, graph=g)  # in torch.distributed
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from outcore.config import TrainConfig, add_options, degree, from_args, given
from outcore.errors import InfeasibleError, PlanError, UsageError, speaks_api
from outcore.graph.ir import Graph
from outcore.hardware.cluster import make_cluster
from outcore.hardware.spec import Cluster, DeviceSpec
from outcore.plan.plan import Plan
from outcore.plan.request import PlanRequest, replicas_asked

if TYPE_CHECKING:  # torch-dependent types, imported lazily at call time
    from outcore.runtime.trainer import Trainer
    from outcore.schedule.lower import Lowered
    from outcore.sim.simulate import SimResult

log = logging.getLogger(__name__)

# the run configuration's command-line side (outcore.config), for the CLI
__all__ = ["PlanRequest", "add_options", "capture", "check_fits", "estimate", "export",
           "fixed_hash_seed", "from_args",
           "given", "load_graph", "load_plan", "lower", "make_cluster", "model_graph",
           "parallelize", "plan", "plan_request", "plan_request_of", "profile", "save_graph",
           "save_plan", "simulate", "strategies"]


def fixed_hash_seed() -> None:
    """Run this program with ``PYTHONHASHSEED=0`` (started again so, once, when it is not
    set: call it first, before any work), which its worker processes inherit; the ``outcore``
    command does. Python hashes strings with a seed of its own in
    each process, and a model's code that iterates a set of strings (Gemma 4 computes its
    rotary tables over ``set(config.layer_types)``) traced in another order in the planning
    process than in the workers; with one seed every process traces alike. A seed the user
    sets is kept."""
    if "PYTHONHASHSEED" in os.environ or not getattr(sys, "orig_argv", None):
        return
    os.environ["PYTHONHASHSEED"] = "0"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


@speaks_api
def capture(model: Any, example_inputs: Any, *, depth: int | None = None,
            name: str | None = None, leaf_modules: tuple[str, ...] = (),
            precision: str = "32") -> Graph:
    """The layer graph of a PyTorch model (see :func:`outcore.graph.capture.capture`);
    ``leaf_modules``: module paths or class names kept as single layers; ``precision``:
    ``32``, ``bf16-mixed`` or ``16-mixed`` (activations recorded as autocast makes them)."""
    from outcore.graph.capture import capture as _capture
    return _capture(model, example_inputs, depth=depth, name=name, leaf_modules=leaf_modules,
                    precision=precision)


@speaks_api
def profile(g: Graph, model: Any, example_inputs: Any, *, device: str | None = None,
            warmup: int = 2, repeat: int = 5, progress: Any = None,
            by_layer: bool = False) -> Graph:
    """Measure every node's forward and backward time on the device at hand; ``by_layer``:
    one layer at a time on the device, identical layers timed once (a model that does not
    fit the device, or one built without its weights)."""
    from outcore.cost.profile import profile as _profile
    from outcore.cost.profile_layers import profile_by_layer
    how = profile_by_layer if by_layer else _profile
    return how(g, model, example_inputs, device=device, warmup=warmup, repeat=repeat,
               progress=progress)


@speaks_api
def estimate(g: Graph, device: str | DeviceSpec = "cpu") -> Graph:
    """Predict every node's times from FLOPs and bytes against a device spec (no torch)."""
    from outcore.cost.analytical import estimate as _estimate
    return _estimate(g, device)


@speaks_api
def model_graph(model: str, *, input_shape: tuple[int, ...] | None = None,
                batch_size: int | None = None, seed: int = 0, costs: str = "estimate:cpu",
                split: int = 1, threads: int | None = None, device: str | None = None,
                repeat: int = 3, warmup: int = 1,
                progress: Callable[[str, int, int], None] | None = None,
                leaves: tuple[str, ...] = (), task: str | None = None,
                precision: str = "32") -> Graph:
    """A model name's costed layer graph: resolve, build with ``seed``, capture, cost.

    Args:
        model: ``torchvision:resnet18``, ``outcore:transformer``, ``path/file.py:fn``, ...
        costs: ``profile`` (time each layer here; ``profile:cuda:1`` on that device; layer
            by layer when the whole model's training state does not fit the device),
            ``profile-by-layer[:DEVICE]`` (always one layer at a time, identical layers timed
            once, the model built without its weights), ``estimate[:DEVICE]`` (analytical,
            default ``cpu``) or ``none`` (capture only).
        task: build an ``hf:``/``timm:`` model for this task (``causal_lm``, ...).
        split: capture at ``1 / split`` of the batch (one micro-batch of a global batch).
        threads: torch threads while profiling (None: leave as is).
        progress: ``progress(phase, done, total)``.
        leaves: module paths or class names captured as single layers (``--leaf``).
        precision: ``32``, ``bf16-mixed`` or ``16-mixed``: captured and profiled under it.
    """
    from outcore.runtime.data import split as split_batch
    from outcore.zoo import build_model
    from outcore.zoo.weightless import fake_inputs

    if task:
        from outcore.zoo.ecosystem import with_task
        model = with_task(model, task.replace("-", "_"))
    kind, _, where = costs.partition(":")
    if kind in ("profile", "profile-by-layer") and where:
        device = where
        costs = kind
    # only the whole-model profile runs the model: capture, estimates and the profile by
    # layer need shapes, not weights (a layer gets values on the device when it is timed)
    spec, net = build_model(model, input_shape=input_shape, batch_size=batch_size, seed=seed,
                            weights=False)
    by_layer = costs == "profile-by-layer" or (
        costs == "profile" and not _fits_for_profile(model, net, device))
    if costs == "profile" and not by_layer:
        spec, net = build_model(model, input_shape=input_shape, batch_size=batch_size,
                                seed=seed)
    real = split_batch(spec.example_inputs, max(split, 1))[0]
    micro = fake_inputs(net, real)
    if progress:
        progress("capturing the graph", 0, 1)
    g = capture(net, micro, name=model, leaf_modules=leaves, precision=precision)
    if by_layer:
        tick = (lambda d, n: progress("profiling layer by layer", d, n)) if progress else None
        return _with_threads(threads, lambda: profile(
            g, net, real, device=device, warmup=warmup, repeat=repeat, progress=tick,
            by_layer=True))
    if costs == "profile":
        tick = (lambda d, n: progress("profiling layers", d, n)) if progress else None
        return _with_threads(threads, lambda: profile(g, net, micro, device=device, warmup=warmup,
                                                      repeat=repeat, progress=tick))
    if costs.startswith("estimate"):
        return estimate(g, costs.partition(":")[2] or "cpu")
    if costs == "none":
        return g
    raise UsageError(f"unknown cost source {costs!r}: use profile, profile-by-layer, "
                     "estimate[:DEVICE] or none")


def _fits_for_profile(model: str, hollow: Any, device: str | None) -> bool:
    """Whether the whole ``model`` (``hollow``: built without its weights) can be profiled on
    ``device``: its parameters, their gradients and the profiled Adam step's two moments
    (four copies) fit what the device has free. Otherwise it is profiled layer by layer."""
    import torch

    from outcore.hardware.probe import free_memory_bytes

    need = 4 * sum(p.numel() * p.element_size() for p in hollow.parameters())
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    room = free_memory_bytes(dev)
    if room and need > room:
        log.warning("%s: its parameters, gradients and optimizer state (%.1f GiB) do not fit "
                    "%s (%.1f GiB free): profiling it layer by layer", model, need / 2**30, dev,
                    room / 2**30)
        return False
    return True


def _with_threads(threads: int | None, fn: Callable[[], Any]) -> Any:
    from outcore.hardware.probe import torch_threads
    with torch_threads(threads or None):
        return fn()


@speaks_api
def plan_request(devices: int, memory: str | float | None = None, **options: Any
                 ) -> PlanRequest:
    """A validated :class:`PlanRequest` from user-facing units (see
    :meth:`PlanRequest.make`: ``bandwidth``, ``latency``, ``device``, ``host_cores``,
    ``cluster`` and every request field)."""
    return PlanRequest.make(devices, memory, **options)


@speaks_api
def plan_request_of(cfg: TrainConfig) -> PlanRequest:
    """The planning request of a configuration's planning options, as ``outcore plan`` makes
    it (the layout as given unless ``layout="auto"``; the micro-batches as given, else one, or
    chosen by the search with ``layout="auto"``)."""
    pl = cfg.planning
    searched = pl.layout == "auto"
    return plan_request(pl.devices, pl.memory, strategy=pl.strategy,
                        parallel=pl.parallel or "mp", replicas=pl.replicas, dp=pl.dp or 1,
                        tp=degree(pl.tp, searched), depth=degree(pl.shard, searched), sp=pl.sp,
                        sp_join=pl.sp_join, sp_grid=pl.sp_grid, bandwidth=pl.bandwidth,
                        latency=pl.latency,
                        microbatches=pl.microbatches or ("auto" if searched else 1),
                        schedule=pl.schedule, optimizer=cfg.optim.planned,
                        memory_policy=pl.memory_policy, device=pl.device,
                        search_layout=searched, seed=cfg.run.seed, batch_stats=pl.batch_stats)


def capture_split(cfg: TrainConfig) -> int:
    """Into how many micro-batches ``outcore plan`` splits a given ``--batch-size`` (the
    global batch) before it captures the model, as ``outcore train`` does when the request
    fixes them: the micro-batches times the model copies (the plan takes the graph as one
    micro-batch). 1 when the search chooses the split (it rescales the whole batch's graph) or
    the model's own example batch is used."""
    pl = cfg.planning
    if cfg.graph.batch_size is None or pl.layout == "auto" or pl.microbatches == "auto":
        return 1
    dp = pl.dp or 1
    copies = dp * replicas_asked(pl.parallel or "mp", pl.replicas, pl.devices, dp)
    return int(pl.microbatches or 1) * copies


@speaks_api
def plan(g: Graph, devices: int | PlanRequest, memory: str | float | None = None, *,
         progress: Callable[[str, int, int], None] | None = None, **options: Any) -> Plan:
    """Partition ``g`` over ``devices`` devices of ``memory`` each; predict with the simulator.

    ``devices`` may be a ready :class:`PlanRequest`; otherwise the request is built from
    ``devices``, ``memory`` and ``options`` (``strategy``: ``auto`` tries every planner of
    ``outcore.placers.auto_placers()`` and keeps the fastest that fits;
    ``parallel``: ``mp``, ``mast`` or ``master``; ``replicas``; ``dp``; ``microbatches``;
    ``schedule``; ``optimizer``; ``memory_policy``; ``seed``; and the cluster: ``bandwidth``,
    ``latency``, ``device``, ``host_cores`` or ``cluster``).

    ``progress(phase, done, total)`` follows the layouts when the search chooses them.

    Raises :class:`InfeasibleError` (naming the smallest device count or memory that would fit)
    when nothing fits. ``predicted`` holds the simulated iteration time, throughput, per-device
    peak memory, busy time and communication, and the planner's lower bound.
    """
    from outcore.search import search
    req = devices if isinstance(devices, PlanRequest) else plan_request(devices, memory,
                                                                         **options)
    return search(g, req, progress=progress)


@speaks_api
def export(checkpoint: str | Path, out: str | Path) -> dict[str, Any]:
    """Write a run's weights from its checkpoint (a ``--checkpoint-dir``, whose newest usable
    checkpoint is taken, or one ``step_<N>`` folder) to ``out``: one ``.safetensors`` file
    named like the model's ``state_dict()``, or a folder with ``model.safetensors`` (and a
    Hugging Face model's ``config.json``, so ``from_pretrained(out)`` loads it). Returns what
    was written: ``step``, ``tensors``, ``bytes``, ``file`` (and ``config``)."""
    from outcore.runtime.export import export_weights
    return export_weights(checkpoint, out)


def strategies() -> dict[str, str]:
    """Planner names and what each does."""
    from outcore.placers import strategies as placer_strategies
    return placer_strategies()


@speaks_api
def lower(p: Plan, g: Graph, *, schedule_file: str | os.PathLike | None = None,
          **options: Any) -> "Lowered":
    """The schedule every rank runs for plan ``p`` (``options``: ``microbatches``,
    ``schedule``, ``cluster``, ``global_batch``); with ``schedule_file``, that file's action
    lists, checked against the plan (see :mod:`outcore.schedule.io`). ``g``: the graph at
    the plan's micro-batch, or the graph the search split into micro-batches
    (:func:`microbatch_graph` rescales it)."""
    from outcore.schedule import io as schedule_io
    from outcore.schedule.lower import lower as _lower
    low = _lower(microbatch_graph(g, p), p, **options)
    return schedule_io.adopt(low, schedule_io.load(schedule_file)) if schedule_file else low


@speaks_api
def save_schedule(low: "Lowered", path: str | os.PathLike) -> Any:
    """Write a lowered plan's schedule as ``outcore-schedule/1`` JSON."""
    from outcore.schedule import io as schedule_io
    return schedule_io.save(low, path)


@speaks_api
def simulate(p: Plan, g: Graph, *, microbatches: int | None = None, schedule: str | None = None,
             cluster: Cluster | None = None, dp: int = 1, global_batch: int | None = None,
             schedule_file: str | os.PathLike | None = None, **options: Any) -> "SimResult":
    """Predict one training iteration of a plan (see :func:`outcore.sim.simulate`; ``options``
    such as ``collective``, ``dp_bucket_bytes`` and ``dp_fused`` pass through). With
    ``schedule_file`` the file's action lists are simulated. ``g`` as for :func:`lower`."""
    from outcore.sim.simulate import simulate as _simulate
    g = microbatch_graph(g, p)
    low = lower(p, g, microbatches=microbatches, schedule=schedule, cluster=cluster,
                global_batch=global_batch, schedule_file=schedule_file)
    return _simulate(p, g, dp=dp, lowered=low, **options)


@speaks_api
def load_graph(path: str | os.PathLike) -> Graph:
    """Read an ``outcore-graph/1`` file."""
    from outcore.graph.io import load
    return load(path)


@speaks_api
def save_graph(g: Graph, path: str | os.PathLike) -> Any:
    from outcore.graph.io import save
    return save(g, path)


@speaks_api
def collapse(g: Graph, depth: int) -> Graph:
    """``g`` with modules deeper than ``depth`` collapsed into blocks."""
    from outcore.graph.coarsen import collapse as _collapse
    return _collapse(g, depth)


@speaks_api
def load_plan(path: str | os.PathLike, graph: Graph | None = None) -> Plan:
    """Read a plan file (``outcore-plan/2`` or ``/1``); with ``graph``, check that it was made
    for that graph and align it to the graph's node order."""
    from outcore.plan.plan import align, load
    p = load(path)
    if graph is None:
        return p
    if p.node_ids.size != graph.num_nodes:
        raise PlanError(f"{path} places {p.node_ids.size} nodes but graph {graph.name!r} has "
                        f"{graph.num_nodes}: pass the graph the plan was made for (depth "
                        f"{p.graph.get('depth')})")
    return align(p, graph)


@speaks_api
def save_plan(p: Plan, path: str | os.PathLike) -> Any:
    from outcore.plan.plan import save
    return save(p, path)


@speaks_api
def device_loads(p: Plan, g: Graph) -> tuple[np.ndarray, np.ndarray, int]:
    """Per device slot of the plan (a rank, or ``tp`` ranks with tensor parallelism): nodes and
    forward + backward seconds (of one tensor-parallel shard); and the model copies."""
    from outcore.cost.tensor import tensor_graph
    from outcore.plan.replicas import expand
    tp = p.layout.tp
    if tp > 1:
        g = tensor_graph(g, tp, p.cluster_or_default().link(0, 1))[0]
    big, assignment, copies = expand(g, p)
    slots = p.devices // tp
    nodes = np.bincount(assignment, minlength=slots)
    compute = np.bincount(assignment, weights=big.fwd_s + big.bwd_s, minlength=slots)
    return nodes, compute, copies


@speaks_api
def with_tensor_parallel(p: Plan, tp: int) -> Plan:
    """``p`` with every device slot ``tp`` tensor-parallel ranks (the same placement)."""
    from dataclasses import replace

    from outcore.plan.layout import check_positive
    check_positive("tp", tp)
    return p.replace(layout=replace(p.layout, tp=tp), devices=p.devices // p.layout.tp * tp,
                     predicted={})


@speaks_api
def parallelize(model: Any, example_inputs: Any, *, plan: Plan, graph: Graph | None = None,
                microbatches: int | None = None, **trainer_options: Any) -> "Trainer":
    """This rank's :class:`~outcore.runtime.trainer.Trainer` for ``plan``, inside an initialised
    torch.distributed process group (one process per device of the plan).

    ``model`` must be freshly built with the same seed on every rank. ``graph`` is the graph the
    plan was made for (captured from ``model`` at layer level); captured here if omitted.
    ``example_inputs`` is one global batch (its first dimension is split into micro-batches).
    """
    from outcore.runtime.data import split
    from outcore.runtime.trainer import Trainer

    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    M = int(microbatches or plan.microbatches or 1)
    micro = split(inputs, M * plan.layout.copies)[0]
    if graph is None:
        graph = capture(model, micro)
    return Trainer(model, graph, plan, microbatches=M, micro_inputs=micro,
                   schedule=plan.schedule, **trainer_options)


@speaks_api
def check_fits(p: Plan) -> None:
    """Raise :class:`InfeasibleError` when the plan's predicted peaks exceed its memory limit."""
    from outcore.search import fits
    if not fits(p):
        peaks = p.predicted["peak_bytes"]
        worst = int(np.argmax(peaks))
        from outcore.units import format_bytes
        raise InfeasibleError(f"device {worst} needs {format_bytes(max(peaks))}, limit "
                              f"{format_bytes(p.memory_bytes)}: add devices, raise --memory, "
                              "or use fewer micro-batches in flight (--schedule 1f1b)")


@speaks_api
def draw_graph(g: Graph, path: str | os.PathLike, **options: Any) -> Any:
    """Draw the graph (``assignment=`` colours nodes by device); see :mod:`outcore.viz`."""
    from outcore.viz import draw_graph as _draw
    return _draw(g, path, **options)


@speaks_api
def draw_timeline(timeline: Any, path: str | os.PathLike, **options: Any) -> Any:
    """Draw a timeline (Gantt chart and memory over time); see :mod:`outcore.viz`."""
    from outcore.viz import draw_timeline as _draw
    return _draw(timeline, path, **options)


@speaks_api
def save_chrome_trace(path: str | os.PathLike, timelines: Any, names: Any = None) -> Any:
    """Write timelines as a Chrome/Perfetto trace."""
    from outcore.trace import save_chrome_trace as _save
    return _save(path, timelines, names)


@speaks_api
def cluster_of(devices: int, *, nodes: int | None = None, per_node: int | None = None,
               device: str = "v100", intra: str = "nvlink2", inter: str = "ib-edr",
               memory_bytes: float | None = None) -> Cluster:
    """A cluster of ``nodes`` machines of ``per_node`` preset devices with preset links, for
    at least ``devices`` devices (each count derived from the other when omitted)."""
    from outcore.hardware.presets import device_preset, link_preset
    per_node = per_node or -(-devices // (nodes or 1))
    nodes = nodes or -(-devices // per_node)
    cl = Cluster(device_preset(device), nodes, per_node, link_preset(intra), link_preset(inter))
    if cl.size < devices:
        raise UsageError(f"{nodes} nodes x {per_node} devices hold {cl.size} devices; "
                         f"{devices} are needed: add nodes")
    return cl.with_memory(memory_bytes) if memory_bytes else cl


def launcher() -> tuple[str, int]:
    """The job launcher this process runs under (``none``, ``torchrun``, ``mpirun``,
    ``srun``) and its rank."""
    from outcore.core.env import detect
    job = detect()
    return job.launcher, job.rank


@speaks_api
def explain(p: Plan, *, per_layout: int = 3) -> list[dict[str, Any]]:
    """The candidates the search judged for ``p``, best first, with why each lost (see
    :func:`outcore.search.explain.rows`)."""
    from outcore.search.explain import rows
    return rows(p, per_layout=per_layout)


@speaks_api
def draw_candidates(p: Plan, path: str | os.PathLike) -> Any:
    """Draw the search's candidates for ``p``: time against memory (see :mod:`outcore.viz`)."""
    from outcore.viz.explain import draw_candidates as _draw
    return _draw(explain(p), path, memory_bytes=p.memory_bytes,
                 title=f"candidates for {p.graph.get('name', 'the graph')}")


def keep_freed_memory() -> bool:
    """Keep freed memory in this process's heap for the rest of the process (glibc; see
    :func:`outcore.hardware.allocator.keep_heap`): the search frees and remakes arrays the size
    of the graph thousands of times. ``outcore plan`` and ``outcore simulate`` do; a program
    calling :func:`plan` may. Returns whether the allocator accepted it."""
    from outcore.hardware.allocator import keep_heap
    return keep_heap()


def microbatch_graph(g: Graph, p: Plan) -> Graph:
    """``g`` at the micro-batch size of plan ``p``: ``g`` rescaled
    (``outcore.graph.batch.at_microbatch``) when it holds the batch the search split into
    micro-batches and copies (the plan's micro-batch x micro-batches x copies: the graph
    the plan was searched on), else ``g`` itself."""
    from outcore.graph.batch import at_microbatch
    size = p.graph.get("batch_size")
    if not size or not g.batch_size or size == g.batch_size or \
            g.batch_size != size * p.microbatches * p.layout.copies:
        return g
    return at_microbatch(g, int(size), float(p.cluster_or_default().device.launch_s))
