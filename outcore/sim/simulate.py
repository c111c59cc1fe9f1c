"""Simulate a plan: lower it to its schedule (the one the runtime runs), run that in simulated
time, summarise."""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Iterator

import numpy as np

from outcore.errors import UsageError
from outcore.graph.ir import Graph
from outcore.hardware.spec import SAME_HOST_SUM_MAX_RANKS, Cluster
from outcore.plan.plan import Plan
from outcore.schedule.costs import PieceCosts
from outcore.schedule.ir import Schedule
from outcore.schedule.lower import Lowered, lower
from outcore.sim.engine import simulate_schedule
from outcore.sim.model import SimOptions
from outcore.trace import Timeline


@dataclass(frozen=True, eq=False)
class SimResult:
    """A simulated iteration.

    Attributes:
        timeline: every action's start and end, memory over time.
        schedule: the schedule that was simulated (what the runtime would execute).
        costs: per-piece costs used.
        iteration_s: time of one iteration (global batch).
        busy_s, idle_s, bubble_s: per rank: compute time, iteration minus compute, and idle time
            between the rank's first and last compute (pipeline bubbles).
        comm_bytes: bytes sent per rank (excluding data-parallel all-reduce).
        peak_bytes: peak memory per rank.
        samples_per_s: global batch / iteration time (× data-parallel replicas).
    """

    timeline: Timeline
    schedule: Schedule
    costs: PieceCosts
    iteration_s: float
    busy_s: np.ndarray
    idle_s: np.ndarray
    bubble_s: np.ndarray
    comm_bytes: np.ndarray
    peak_bytes: np.ndarray
    samples_per_s: float
    memory_limit_bytes: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"iteration_s": self.iteration_s, "samples_per_s": self.samples_per_s,
                "busy_s": self.busy_s.tolist(), "idle_s": self.idle_s.tolist(),
                "bubble_s": self.bubble_s.tolist(), "comm_bytes": self.comm_bytes.tolist(),
                "peak_bytes": self.peak_bytes.tolist(),
                "memory_limit_bytes": self.memory_limit_bytes,
                "schedule": self.schedule.kind, "microbatches": self.schedule.microbatches,
                "pieces": self.schedule.pieces.num_pieces,
                "transfers": self.schedule.pieces.num_transfers}

    @property
    def fits(self) -> bool:
        return self.memory_limit_bytes is None or bool(
            (self.peak_bytes <= self.memory_limit_bytes * (1 + 1e-9)).all())


def simulate(plan: Plan, g: Graph, *, cluster: Cluster | None = None,
             microbatches: int | None = None, schedule: str | None = None,
             global_batch: int | None = None, dp: int = 1,
             collective: str = "auto", dp_bucket_bytes: float = 0.0,
             dp_fused: bool = False, lowered: Lowered | None = None,
             checked: bool = True) -> SimResult:
    """Predict one training iteration of ``plan`` on ``cluster``.

    Args:
        plan: where each node runs (``plan.assignment``).
        g: the graph the plan was made for (costs at ``g.batch_size``).
        cluster: devices and links (default: from the plan).
        microbatches: micro-batches per iteration (default: the plan's).
        schedule: ``gpipe`` or ``1f1b`` (default: the plan's).
        global_batch: samples per iteration. By default the graph is one micro-batch: an
            iteration runs ``microbatches`` micro-batches of ``g.batch_size`` samples on each
            copy of the model (replicas x data-parallel copies of a replicated plan). Given,
            each micro-batch is ``global_batch / (microbatches * copies)`` samples (costs
            scaled linearly from the graph's batch).
        dp: data-parallel replicas of the whole plan. Give a ``cluster`` of at least
            ``plan.devices * dp`` devices to place them (copy ``d`` on devices
            ``[d * plan.devices, (d+1) * plan.devices)``): their all-reduce then follows the
            cluster's nodes and links; otherwise it is a flat ring over one link.
        collective: the data-parallel all-reduce model on such a cluster
            (``outcore.hardware.collectives.COLLECTIVES``).
        dp_bucket_bytes: 0 (default): each piece's gradients are all-reduced once its last
            backward ends; else DDP-style buckets of this many bytes (25 MiB in DDP) that
            overlap that backward (``SimOptions.dp_bucket_bytes``).
        dp_fused: one all-reduce of each rank's gradients after its last backward, not one
            per piece (GEMS' torchgems; ``SimOptions.dp_fused``).
        lowered: the plan already lowered (:func:`outcore.schedule.lower.lower`, e.g. with a
            schedule file's action lists); the lowering options above are then ignored.
        checked: check the lowered schedule (``lower``'s ``checked``).
    """
    if dp < 1:
        raise UsageError(f"data-parallel degree must be at least 1, got {dp}")
    memo = _MEMO.get()
    key = None
    if memo is not None and lowered is None and plan.spatial is None and \
            (microbatches, schedule, global_batch, dp, collective, dp_bucket_bytes,
             dp_fused) == (None, None, None, 1, "auto", 0.0, False):
        key = _memo_key(plan, g, cluster, checked)
        if key in memo.entries:
            memo.entries.move_to_end(key)
            found = memo.entries[key][0]
            memo.hits += 1
            return replace(found, memory_limit_bytes=plan.memory_bytes)
    result = _simulated(plan, g, cluster, microbatches, schedule, global_batch, dp, collective,
                        dp_bucket_bytes, dp_fused, lowered, checked)
    if key is not None:
        assert memo is not None  # a key is made only with a memo
        memo.entries[key] = (result, g, cluster, plan.cluster)  # (ids in the key stay taken)
        while len(memo.entries) > memo.size:
            memo.entries.popitem(last=False)
    return result


class _Memo:
    def __init__(self, size: int):
        self.size, self.hits = size, 0
        self.entries: OrderedDict = OrderedDict()


_MEMO: ContextVar[_Memo | None] = ContextVar("outcore_simulation_memo", default=None)


@contextmanager
def remembered(size: int = 6) -> Iterator[_Memo]:
    """Within, :func:`simulate` returns the simulation of an identical plan again (the same
    graph object, placement, layout, memory policies, schedule, micro-batches, optimizer and
    cluster; the memory limit may differ) instead of running it: a search meets the same
    placement from several planners and replica counts. The ``size`` most recent are kept (a
    simulation of a large graph holds its whole timeline)."""
    memo = _Memo(size)
    token = _MEMO.set(memo)
    try:
        yield memo
    finally:
        _MEMO.reset(token)


def _memo_key(plan: Plan, g: Graph, cluster: Cluster | None, checked: bool) -> tuple:
    pol = plan.policies
    return (id(g), id(cluster), id(plan.cluster), checked, _digest(plan.assignment),
            plan.devices, repr(plan.layout), plan.schedule, int(plan.microbatches),
            plan.optimizer, None if pol is None else (_digest(pol.group_of),
                                                      tuple(pol.policies)))


def _digest(a: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).hexdigest()


def _simulated(plan: Plan, g: Graph, cluster: Cluster | None, microbatches: int | None,
               schedule: str | None, global_batch: int | None, dp: int, collective: str,
               dp_bucket_bytes: float, dp_fused: bool, lowered: Lowered | None,
               checked: bool) -> SimResult:
    """:func:`simulate`, run."""
    low = lowered or lower(g, plan, microbatches=microbatches, schedule=schedule,
                           cluster=cluster, global_batch=global_batch, checked=checked)
    sched, costs, cl = low.schedule, low.costs, low.cluster
    opts = sim_options(plan, g, low, dp, collective, dp_bucket_bytes, dp_fused)
    tl = simulate_schedule(sched, costs, cl, opts)
    result = summarize(tl, sched, costs, low.batch, dp, plan.memory_bytes)
    if plan.spatial is not None:  # the extra tile ranks of spatial parallelism
        from outcore.sim.spatial import with_tile_ranks
        result = with_tile_ranks(result, plan, g, low)
    return result


def sim_options(plan: Plan, g: Graph, low: Lowered, dp: int = 1, collective: str = "auto",
                dp_bucket_bytes: float = 0.0, dp_fused: bool = False) -> SimOptions:
    """The :class:`SimOptions` :func:`simulate` runs ``low`` (``plan`` lowered) with."""
    sched, costs, cl = low.schedule, low.costs, low.cluster
    opt_scale = optimizer_scale(g, costs, cl, low.copies)
    return SimOptions(dp=dp, bucket_bytes=tuple(sched.meta.get("bucket_bytes", ())),
                      bucket_ring=tuple(sched.meta.get("bucket_ring", ())),
                      dp_collective=collective, dp_bucket_bytes=dp_bucket_bytes,
                      dp_fused=dp_fused,
                      optimizer_bytes_per_param_byte=opt_scale * optimizer_traffic(
                          plan.optimizer, cl.device.host_is_device),
                      optimizer_transient=ADAM_WORKING if plan.optimizer.lower().startswith(
                          "adam") else 0.0,
                      optimizer_per_tensor_s=opt_scale * optimizer_per_tensor_s(
                          plan.optimizer, cl.device.host_is_device),
                      optimizer_per_step_s=opt_scale * optimizer_per_step_s(
                          plan.optimizer, cl.device.host_is_device),
                      step_sync_s=step_sync_s(cl, max(plan.layout.ranks(plan.devices),
                                                      sched.num_ranks * dp)),
                      step_host_s=step_host_s(cl, sched.microbatches))


# The runtime's multi-tensor (foreach) Adam holds one temporary the size of all the rank's
# parameters during its step (``_foreach_sqrt`` of the second moments); SGD's foreach step works
# in place. The zoo MLP under Adam, one micro-batch: its measured peak is 4x its parameters
# (weights, gradients, two moments) plus 1.0x (2026-11-27, the CPU tracker).
ADAM_WORKING = 1.0


def optimizer_scale(g: Graph, costs: PieceCosts, cluster: Cluster, copies: int = 1) -> float:
    """Measured over modelled optimizer action on this model, on CPU: the profiler times a
    multi-tensor Adam step over all the parameters right after a forward + backward
    (``meta['profile']['adam_step_s']``, :func:`outcore.cost.profile.time_optimizer_step`), the
    model here prices the same step (its constants were fit on MLPs, whose backward leaves the
    optimizer's step faster than a convolution's does); 1 without a CPU profile.

    The step timed updated one copy of the whole model (``adam_param_bytes``,
    ``adam_tensors``; for profiles without them, the plan's parameters over its ``copies``):
    pricing every data-parallel copy's parameters against it halved the scale at ``dp`` 2
    (hf:mixtral: 0.76 ms predicted per rank, 1.7-2.6 ms measured)."""
    prof = g.meta.get("profile") or {}
    measured = prof.get("adam_step_s")
    if not measured or not cluster.device.host_is_device or \
            not str(prof.get("device", "")).startswith("cpu") or costs.param_tensors is None:
        return 1.0
    tensors = float(prof.get("adam_tensors") or np.sum(costs.param_tensors) / max(copies, 1))
    nbytes = float(prof.get("adam_param_bytes") or np.sum(costs.param_bytes) / max(copies, 1))
    if tensors <= 0:
        return 1.0
    adam = SimOptions(optimizer_bytes_per_param_byte=optimizer_traffic("adam", True),
                      optimizer_per_tensor_s=optimizer_per_tensor_s("adam", True),
                      optimizer_per_step_s=optimizer_per_step_s("adam", True))
    modelled = adam.optimizer_s(nbytes, tensors, cluster.device.mem_bandwidth)
    return float(np.clip(measured / modelled, 0.5, 4.0))


# The runtime's host work each step around a rank's actions on CPU workers: the trainer splits
# the batch and targets into micro-batches, the executor sets up the step and reads the loss
# after its last action. Timed inside workers (2026-11-27, the zoo MLP and transformer on 1-2
# workers, 1-8 micro-batches): 40-45 us with 1 micro-batch, 60 us with 8.
_STEP_HOST_S, _STEP_HOST_PER_MB_S = 38e-6, 3e-6


def step_host_s(cluster: Cluster, microbatches: int) -> float:
    """Host seconds a CPU rank spends each step outside its actions (``_STEP_HOST_S``); on an
    accelerator the host prepares the step while the device finishes the last: 0."""
    if not cluster.device.host_is_device:
        return 0.0
    return _STEP_HOST_S + _STEP_HOST_PER_MB_S * max(int(microbatches), 1)


def step_sync_s(cluster: Cluster, ranks: int) -> float:
    """The runtime's one sum of three numbers per step over all ``ranks`` processes (the
    non-finite check with the loss; ``outcore.core.comm.Messenger.sum_over_ranks``).

    Local CPU workers on one host (a link that copies on send: the same-host sockets), at most
    :data:`SAME_HOST_SUM_MAX_RANKS`: every rank sends to and reads from every other, one
    latency and ``ranks - 1`` sends and receives of host time. Otherwise the backend's
    all-reduce, latency only, as recursive doubling: ``2 ceil(lg p)`` latencies (gloo on this
    machine's loopback, 2 ranks: 183 us measured, 200 us charged)."""
    if ranks <= 1:
        return 0.0
    if cluster.nodes == 1 and cluster.intra.copy_on_send and ranks <= SAME_HOST_SUM_MAX_RANKS:
        dev = cluster.device
        return cluster.intra.latency_s + (ranks - 1) * (dev.send_overhead_s + dev.recv_overhead_s)
    link = cluster.inter if cluster.nodes > 1 else cluster.intra
    return 2 * math.ceil(math.log2(ranks)) * link.latency_for_collectives


# Memory traffic of one optimizer step, in bytes moved per parameter byte (and, for Adam, a
# working set of twice the largest parameter tensor during the step: measured with the CPU
# tracker, 2.0-3.0x the largest tensor for one, ten and eleven tensors of 8-400 MB; SGD with or
# without momentum needs none). A fused GPU Adam
# reads weight, gradient and two moments and writes three (7). PyTorch's CPU optimizers run a
# sequence of element-wise passes instead; measured here (2026-11-26, quiet machine, 1 thread,
# 20M parameters, under the allocator setting workers train with, outcore.hardware.allocator;
# against the 17.3 GB/s copy bandwidth of the cpu preset): Adam 0.38 ns/byte = 6.6 bytes per
# byte, SGD 0.046 ns/byte = 0.8, SGD with momentum 0.12 ns/byte = 2.0. (glibc's default
# allocator unmaps and faults Adam's temporaries back every step: 21.5 bytes per byte.)
# ``sgd`` is plain SGD; ``sgd-momentum`` SGD with a momentum buffer (``outcore train``'s
# default, ``OptimizerOptions.planned``): the same traffic and fixed costs, one copy more memory.
_OPT_TRAFFIC = {"adam": (7.0, 7.0), "adamw": (7.0, 7.0), "sgd": (4.0, 2.0),
                "sgd-momentum": (4.0, 2.0), "momentum": (4.0, 2.0)}


# Fixed costs of the runtime's OPT action on CPU, per step of a rank with parameters and per
# parameter tensor: the step checks every gradient for non-finite values (one multi-tensor
# kernel), steps the multi-tensor (foreach) optimizer and clears the gradients. Measured here
# (2026-11-26, quiet machine, one worker, the OPT action in the trainer, 64-layer MLPs of
# width 16 with 1, 16 and 64 layers: 4, 34 and 130 tensors; linear fits within 4 %): SGD with
# momentum 99 us + 3.8 us per tensor, Adam 152 us + 10.3 us per tensor. (Before the runtime
# used foreach optimizers and one multi-tensor check: SGD ~21 us, Adam ~33 us per tensor on a
# 74-tensor transformer.) GPU optimizers use fused multi-tensor kernels (a few us per tensor).
_OPT_PER_STEP_S = {"adam": 150e-6, "adamw": 150e-6, "sgd": 100e-6, "sgd-momentum": 100e-6,
                   "momentum": 100e-6}
_OPT_PER_TENSOR_S = {"adam": 10e-6, "adamw": 10e-6, "sgd": 4e-6, "sgd-momentum": 4e-6,
                     "momentum": 4e-6}


def optimizer_per_tensor_s(optimizer: str, host_is_device: bool) -> float:
    """Seconds per parameter tensor of an optimizer step (see ``_OPT_PER_TENSOR_S``)."""
    return _OPT_PER_TENSOR_S.get(optimizer.lower(), 10e-6) if host_is_device else 2e-6


def optimizer_per_step_s(optimizer: str, host_is_device: bool) -> float:
    """Fixed seconds of a rank's optimizer step on CPU (see ``_OPT_PER_STEP_S``); on an
    accelerator a few kernel launches, within its per-tensor figure."""
    return _OPT_PER_STEP_S.get(optimizer.lower(), 150e-6) if host_is_device else 0.0


def optimizer_traffic(optimizer: str, host_is_device: bool) -> float:
    """Bytes the optimizer step moves per parameter byte (see ``_OPT_TRAFFIC``)."""
    gpu, cpu = _OPT_TRAFFIC.get(optimizer.lower(), (7.0, 7.0))
    return cpu if host_is_device else gpu


def summarize(tl: Timeline, sched: Schedule, costs: PieceCosts, batch: int | None, dp: int,
              memory_limit: float | None) -> SimResult:
    R = tl.num_ranks
    busy = tl.busy_s()
    c = tl.columns()
    fb = c["fb"]
    first = np.full(R, np.inf)
    last = np.zeros(R)
    on = fb & c["compute"]
    np.minimum.at(first, c["rank"][on], c["start_s"][on])
    np.maximum.at(last, c["rank"][on], c["end_s"][on])
    span = np.where(np.isfinite(first), last - first, 0.0)
    compute_fb = np.zeros(R)  # summed in the events' order
    np.add.at(compute_fb, c["rank"][fb], c["end_s"][fb] - c["start_s"][fb])
    bubble = np.maximum(span - compute_fb, 0.0)
    it = tl.iteration_s
    samples = (batch or 0) * dp / it if it > 0 else float("inf")
    return SimResult(tl, sched, costs, it, busy, np.maximum(it - busy, 0.0), bubble,
                     tl.comm_bytes(), tl.peak_bytes(), samples, memory_limit)
