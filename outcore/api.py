"""outcore's public functions (DESIGN.md, "Public API"). Each CLI subcommand calls one of them.

    g = outcore.capture(model, example_inputs)            # graph IR with module hierarchy
    g = outcore.profile(g, model, example_inputs)          # or outcore.estimate(g, "a100")
    p = outcore.plan(g, devices=4, memory="16GiB", strategy="pardnn")
    r = outcore.simulate(p, g, microbatches=8, schedule="1f1b")
    report = outcore.train("outcore:transformer", devices=4, memory="64MiB")
    trainer = outcore.parallelize(model, example_inputs, plan=p, graph=g)  # in torch.distributed
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from outcore.errors import InfeasibleError, UsageError
from outcore.graph.ir import Graph
from outcore.hardware.spec import Cluster, DeviceSpec, flat_cluster
from outcore.plan.plan import Plan, make_plan
from outcore.units import parse_bandwidth, parse_bytes, parse_seconds

if TYPE_CHECKING:  # torch-dependent types, imported lazily at call time
    from outcore.runtime.trainer import Trainer
    from outcore.sim.simulate import SimResult

log = logging.getLogger(__name__)


def capture(model: Any, example_inputs: Any, *, depth: int | None = None,
            name: str | None = None) -> Graph:
    """The layer graph of a PyTorch model (see :func:`outcore.graph.capture.capture`)."""
    from outcore.graph.capture import capture as _capture
    return _capture(model, example_inputs, depth=depth, name=name)


def profile(g: Graph, model: Any, example_inputs: Any, *, device: str | None = None,
            warmup: int = 2, repeat: int = 5, progress: Any = None) -> Graph:
    """Measure every node's forward and backward time on the device at hand."""
    from outcore.cost.profile import profile as _profile
    return _profile(g, model, example_inputs, device=device, warmup=warmup, repeat=repeat,
                    progress=progress)


def estimate(g: Graph, device: str | DeviceSpec = "cpu") -> Graph:
    """Predict every node's times from FLOPs and bytes against a device spec (no torch)."""
    from outcore.cost.analytical import estimate as _estimate
    return _estimate(g, device)


def make_cluster(devices: int, memory: str | float | None = None,
                 bandwidth: str | float = "16GB/s", latency: str | float = "25us",
                 device: str | DeviceSpec | None = None,
                 host_cores: int | None = None) -> Cluster:
    """A flat cluster of ``devices`` devices from user-facing units (``host_cores``: the
    devices are worker processes sharing this many CPU cores)."""
    mem = float(parse_bytes(memory)) if memory is not None else float("inf")
    if mem <= 0:
        raise UsageError(f"memory must be positive, got {memory!r}")
    spec = None
    if device is not None:
        if isinstance(device, DeviceSpec):
            spec = device
        else:
            from outcore.hardware.presets import device_preset
            spec = device_preset(device)
    from dataclasses import replace as _replace
    from outcore.hardware.spec import RUNTIME_OVERHEAD_S
    spec = _replace(spec or DeviceSpec("generic", mem, 1e13, 1e12),
                    fwd_overhead_s=RUNTIME_OVERHEAD_S[0], bwd_overhead_s=RUNTIME_OVERHEAD_S[1])
    return flat_cluster(devices, memory_bytes=mem, bandwidth=parse_bandwidth(bandwidth),
                        latency_s=parse_seconds(latency), device=spec, host_cores=host_cores)


AUTO_CANDIDATES = ("pardnn", "pipeline", "subgraph")


def plan(g: Graph, devices: int, memory: str | float | None = None, *, strategy: str = "auto",
         parallel: str = "mp", replicas: int | None = None, dp: int = 1,
         bandwidth: str | float = "16GB/s", latency: str | float = "25us",
         microbatches: int = 1, schedule: str = "1f1b", optimizer: str = "adam",
         device: str | None = None, seed: int = 0, memory_policy: str = "auto",
         host_cores: int | None = None) -> Plan:
    """Partition ``g`` over ``devices`` devices of ``memory`` each; predict with the simulator.

    The graph is one micro-batch: an iteration runs ``microbatches`` micro-batches of
    ``g.batch_size`` samples on each copy of the model.

    Args:
        strategy: planner for the model-parallel split; ``auto`` runs every planner of
            ``AUTO_CANDIDATES`` and keeps the plan the simulator (the schedule the runtime
            executes) finds fastest among those that fit.
        parallel: ``mp`` (one replica), ``mast`` (GEMS: a second replica in reverse order on
            the same devices) or ``master`` (as many replica pairs as memory allows).
        replicas: for ``master``, the number of replicas (default: the best that fits).
        dp: data-parallel copies of the whole model-parallel group (``devices`` must divide).
        memory_policy: ``auto`` (when a placement does not fit, choose per piece the cheapest
            of checkpointing and offloading that makes it fit, before asking for more
            devices), ``none``, ``checkpoint`` or ``offload`` (only those).
        host_cores: the devices are local worker processes sharing this many CPU cores (the
            simulator then slows down ranks that compute at the same time).

    Raises :class:`InfeasibleError` (naming the smallest device count or memory that would fit)
    when nothing fits. ``predicted`` holds the simulated iteration time, throughput, per-device
    peak memory, busy time and communication, and the planner's lower bound.
    """
    from outcore.plan.replicas import MODES

    if not isinstance(devices, (int, np.integer)) or devices < 1:
        raise UsageError(f"devices must be a positive integer, got {devices!r}")
    if parallel not in MODES:
        raise UsageError(f"unknown parallel mode {parallel!r}: use {', '.join(MODES)}")
    if dp < 1 or devices % dp:
        raise UsageError(f"--dp {dp} must divide --devices {devices}")
    K = devices // dp
    if parallel == "mp":
        options = [1]
    elif parallel == "mast":
        options = [2]
    else:
        options = [replicas] if replicas else [r for r in (8, 4, 2) if r <= K]
    if not options or (parallel != "mp" and K < 2):
        raise UsageError(f"{parallel} needs at least 2 model-parallel devices; got {K}")
    mem = None if memory is None else float(parse_bytes(memory))
    cluster = make_cluster(K * dp, memory, bandwidth, latency, device, host_cores)
    common = dict(strategy=strategy, cluster=cluster, microbatches=microbatches,
                  schedule=schedule, optimizer=optimizer, seed=seed,
                  memory_policy=memory_policy)
    best: Plan | None = None
    notes: list[str] = []
    first_error: InfeasibleError | None = None
    for R in options:
        budget = None if mem is None else mem / R
        try:
            base = _plan_single(g, K, budget, limit=mem, check_fit=(R == 1), **common)
        except InfeasibleError as e:
            first_error = first_error or e
            notes.append(f"{R} replica(s): {e}")
            continue
        p = base if (R == 1 and dp == 1) else _replicate(g, base, parallel, R, dp, mem)
        sps = p.predicted.get("samples_per_s", 0.0)
        fits = _fits(p)
        notes.append(f"{parallel} with {R} replica(s) x dp {dp}: {sps:.1f} samples/s, peak "
                     f"{max(p.predicted['peak_bytes']) / 2**20:.1f} MiB"
                     + ("" if fits else " (does not fit)"))
        if fits and (best is None or sps > best.predicted["samples_per_s"]):
            best = p
    if best is None:
        if first_error is not None:
            raise first_error
        raise InfeasibleError(f"no {parallel} plan fits {memory} per device "
                              f"({'; '.join(notes)}): add devices or raise --memory")
    if len(options) > 1 or dp > 1:
        best = best.replace(extra={**best.extra, "notes": best.extra.get("notes", []) + notes})
    return best


def _fits(p: Plan) -> bool:
    peaks = p.predicted.get("peak_bytes") or [0]
    return not p.memory_bytes or max(peaks) <= p.memory_bytes * (1 + 1e-9)


def _cluster_doc(cluster: Cluster) -> dict[str, Any]:
    d = cluster.device
    return {"bandwidth": cluster.intra.bandwidth, "latency_s": cluster.intra.latency_s,
            "device": d.name, "peak_flops": d.peak_flops, "mem_bandwidth": d.mem_bandwidth,
            "host_bandwidth": d.host_bandwidth, "host_is_device": d.host_is_device,
            "fwd_overhead_s": d.fwd_overhead_s, "bwd_overhead_s": d.bwd_overhead_s,
            "host_cores": cluster.host_cores}


def _plan_single(g: Graph, K: int, budget: float | None, *, limit: float | None,
                 check_fit: bool, strategy: str, cluster: Cluster, microbatches: int,
                 schedule: str, optimizer: str, seed: int, memory_policy: str = "auto") -> Plan:
    """The fastest single-replica plan on K devices, planned under ``budget`` per device;
    with ``check_fit`` only plans whose simulated peak fits ``limit`` count."""
    from outcore.partition import STRATEGIES

    if strategy != "auto" and strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy {strategy!r}: use auto or one of "
                         f"{', '.join(STRATEGIES)}")
    names = AUTO_CANDIDATES if strategy == "auto" else (strategy,)
    tried: list[tuple[float, int, Plan]] = []
    notes: list[str] = []
    first_error: InfeasibleError | None = None
    for k, name in enumerate(names):
        try:
            p = _candidate(g, K, budget, name, limit=limit, check_fit=check_fit,
                           cluster=cluster, microbatches=microbatches, schedule=schedule,
                           optimizer=optimizer, seed=seed, memory_policy=memory_policy)
        except InfeasibleError as e:
            first_error = first_error or e
            notes.append(f"{name}: {e}")
            continue
        it = p.predicted["iteration_s"]
        pol = p.extra.get("memory_policy")
        notes.append(f"{name}: simulated {it * 1e3:.2f} ms per iteration, peak "
                     f"{max(p.predicted['peak_bytes']) / 2**20:.1f} MiB"
                     + (f", memory policies on {sum(x['nodes'] for x in pol['groups'])} nodes"
                        if pol else ""))
        tried.append((it, k, p))
    if not tried:
        if first_error is not None:
            raise first_error
        raise InfeasibleError(f"no plan fits when simulated with the {schedule} schedule "
                              f"({'; '.join(notes)}): add devices or raise --memory")
    _, _, best = min(tried, key=lambda t: (t[0], t[1]))
    if strategy == "auto":
        notes.append(f"auto: chose {best.strategy}")
        best = best.replace(extra={**best.extra, "notes": best.extra["notes"] + notes})
    return best


def _candidate(g: Graph, K: int, budget: float | None, name: str, *, limit: float | None,
               check_fit: bool, cluster: Cluster, microbatches: int, schedule: str,
               optimizer: str, seed: int, memory_policy: str) -> Plan:
    """One planner's plan, simulated; memory policies make it fit when it does not."""
    from outcore.partition import partition

    try:
        result = partition(g, K, memory_bytes=budget, cluster=cluster, strategy=name,
                           optimizer=optimizer, microbatches=microbatches, seed=seed)
        return _simulated(g, result, K, limit, check_fit, cluster, microbatches, schedule,
                          optimizer, memory_policy)
    except InfeasibleError as e:
        if memory_policy == "none" or not check_fit or budget is None:
            raise
        error = e
    # nothing fits as it is: place under a relaxed limit (memory-balanced) and make that fit
    # with memory policies; the tightest relaxation that works wins
    for relax in (1.5, 2.0, 4.0, 8.0, None):
        try:
            result = partition(g, K, memory_bytes=None if relax is None else budget * relax,
                               cluster=cluster, strategy=name, optimizer=optimizer,
                               microbatches=microbatches, seed=seed)
            return _simulated(g, result, K, limit, check_fit, cluster, microbatches, schedule,
                              optimizer, memory_policy)
        except InfeasibleError:
            continue
    raise InfeasibleError(f"{error}; memory policies ({memory_policy}) cannot close the gap "
                          "either", min_devices=error.min_devices,
                          min_memory_bytes=error.min_memory_bytes)


def _simulated(g: Graph, result: Any, K: int, limit: float | None, check_fit: bool,
               cluster: Cluster, microbatches: int, schedule: str, optimizer: str,
               memory_policy: str) -> Plan:
    """The plan of a partition result, with memory policies if needed, simulated."""
    from outcore.partition.memory_policy import choose
    from outcore.sim.simulate import simulate as _simulate

    p = make_plan(g, result.assignment, strategy=result.strategy, devices=K, memory_bytes=limit,
                  schedule=schedule, microbatches=microbatches, optimizer=optimizer,
                  cluster=_cluster_doc(cluster),
                  extra={"notes": list(result.notes), "devices_used": result.devices_used})
    if check_fit and limit:
        p = choose(g, p, mode=memory_policy, cluster=cluster)
    sim = _simulate(p, g, cluster=cluster)
    predicted = {**sim.to_dict(), "lower_bound_s": result.lower_bound_s,
                 "planner_makespan_s": result.makespan_s,
                 "planner_peak_bytes": np.asarray(result.peak_bytes).tolist()}
    return p.replace(predicted=predicted)


def _replicate(g: Graph, base: Plan, mode: str, replicas: int, dp: int,
               limit: float | None) -> Plan:
    """``base`` (a K-device split) replicated GEMS-style and ``dp`` times; simulated."""
    from outcore.plan.replicas import make_replication
    from outcore.sim.simulate import simulate as _simulate

    mode = "mp" if replicas == 1 else ("mast" if (mode == "mast" or replicas == 2) and
                                        mode != "master" else "master")
    rep = make_replication(mode, base.assignment, base.devices, replicas, dp)
    p = base.replace(devices=rep.ranks, memory_bytes=limit,
                     extra={**base.extra, "parallel": rep.to_dict()})
    sim = _simulate(p, g)
    return p.replace(predicted={**base.predicted, **sim.to_dict()})


def simulate(p: Plan, g: Graph, *, microbatches: int | None = None, schedule: str | None = None,
             cluster: Cluster | None = None, dp: int = 1, global_batch: int | None = None,
             **options: Any) -> "SimResult":
    """Predict one training iteration of a plan (see :func:`outcore.sim.simulate`; ``options``
    such as ``collective``, ``dp_bucket_bytes`` and ``dp_fused`` pass through)."""
    from outcore.sim.simulate import simulate as _simulate
    return _simulate(p, g, microbatches=microbatches, schedule=schedule, cluster=cluster, dp=dp,
                     global_batch=global_batch, **options)


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

    from outcore.plan.replicas import replication_of

    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    M = int(microbatches or plan.microbatches or 1)
    rep = replication_of(plan)
    micro = split(inputs, M * (rep.copies if rep else 1))[0]
    if graph is None:
        graph = capture(model, micro)
    return Trainer(model, graph, plan, microbatches=M, micro_inputs=micro,
                   schedule=plan.schedule, **trainer_options)


def check_fits(p: Plan) -> None:
    """Raise :class:`InfeasibleError` when the plan's predicted peaks exceed its memory limit."""
    peaks = p.predicted.get("peak_bytes")
    if p.memory_bytes and peaks and max(peaks) > p.memory_bytes * (1 + 1e-9):
        worst = int(np.argmax(peaks))
        from outcore.units import format_bytes
        raise InfeasibleError(f"device {worst} needs {format_bytes(max(peaks))}, limit "
                              f"{format_bytes(p.memory_bytes)}: add devices, raise --memory, "
                              "or use fewer micro-batches in flight (--schedule 1f1b)")
