"""One enumeration of layouts: data x GEMS replicas x micro-batches (x tensor x spatial), pruned
by cheap bounds before any placement is simulated (no torch).

Alpa and FlexFlow search the parallel layout instead of asking the user for it; outcore's
search does the same over its process mesh (:class:`~outcore.plan.layout.Layout`):

1. **Enumerate** (:func:`candidate_layouts`): every ``dp`` dividing the devices, every GEMS mode
   and replica count that fits the model-parallel devices (MP-Basic, MAST, MASTER with 4 and 8
   replicas; Jain et al., SC 2020), every micro-batch count dividing one copy's batch, every
   tensor-parallel degree of 1, 2, 4 and 8 that divides the devices and splits a layer
   (Megatron-LM; with ``sp`` from the request, which does not compose with ``tp``); with
   several data-parallel copies, plain copies and copies that shard the parameter state
   (``depth``: every divisor of ``dp``, or the request's). A fixed request field (``dp``,
   ``parallel``, ``replicas``, ``tp``, a number of micro-batches) fixes that dimension.
2. **Bound** each layout without placing anything, on the graph costed as one tensor-parallel
   rank sees it (:func:`outcore.cost.tensor.tensor_graph`): its time cannot beat
   ``max(total work / device slots, critical path of one micro-batch)``, and a device must hold at
   least ``(state x parameters x replicas + one micro-batch's saved activations) / stages``
   (parameter state only, when memory policies may drop activations; its weights and
   gradients only, when they may also offload the optimizer state to the host).
3. **Prune and evaluate** (:func:`search_layouts`): gradient accumulation before checkpointing —
   a first pass allows no memory policy, a second the request's (on every layout that may still
   beat the best plan: a placement that needs a policy can be faster than all that fit without
   one). Layouts
   whose memory floor exceeds the limit, or whose time bound cannot beat the best simulated plan,
   are skipped; the others are planned by the placement search (emulator first, simulator for the
   best few). Every candidate's outcome is kept in ``plan.extra["candidates"]`` (compact: one
   record each) for ``outcore plan --explain``.

The graph of a request with ``whole_batch`` holds the global batch of one iteration; each layout
plans on it rescaled to its micro-batch (:func:`outcore.graph.batch.at_microbatch`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from outcore.cost.memory import state_factor
from outcore.errors import InfeasibleError
from outcore.graph.algorithms import longest_to_sinks
from outcore.graph.batch import divisors
from outcore.graph.ir import Graph
from outcore.plan.request import PlanRequest
from outcore.search.runnable import has_batch_statistics
from outcore.search.tensor import tensor_costed
from outcore.units import format_bytes

__all__ = ["LayoutChoice", "Totals", "candidate_layouts", "fixed_s", "no_layout_fits",
           "tensor_degrees"]


# most micro-batches per copy the search tries
MAX_MICROBATCHES = 64


@dataclass(frozen=True, kw_only=True)
class LayoutChoice:
    """One candidate layout with its cheap bounds.

    Attributes:
        dp, parallel, replicas, tp, sp, depth: the mesh (``replicas`` 1 for ``mp``; ``depth``
            copies shard the parameter state).
        microbatches: micro-batches per iteration and model copy.
        samples: samples per micro-batch.
        time_bound_s: no plan of this layout is faster (total work / devices, critical path).
        params_floor_bytes: per device, parameter state alone (floor with checkpointing).
        memory_floor_bytes: per device, parameter state plus one micro-batch's activations.
        offload_floor_bytes: per device, what offloading leaves of the parameter state (the
            weights and gradients; the floor with policies that may offload parameters).
    """

    dp: int
    parallel: str
    replicas: int
    microbatches: int
    samples: int
    tp: int = 1
    sp: int = 1
    depth: int = 1
    time_bound_s: float = 0.0
    params_floor_bytes: float = 0.0
    memory_floor_bytes: float = 0.0
    offload_floor_bytes: float | None = None

    @property
    def label(self) -> str:
        mode = self.parallel if self.parallel != "master" else f"master x{self.replicas}"
        mesh = "".join(f" x {k} {v}" for k, v in (("shard", self.depth), ("tp", self.tp),
                                                  ("sp", self.sp)) if v > 1)
        return f"dp {self.dp} x {mode}{mesh}, {self.microbatches} x {self.samples} samples"

    def request(self, req: PlanRequest, memory_policy: str) -> PlanRequest:
        """``req`` fixed to this layout (the placement search's request)."""
        return req.replace(dp=self.dp, parallel=self.parallel, microbatches=self.microbatches,
                           replicas=self.replicas if self.parallel == "master" else None,
                           tp=self.tp, sp=self.sp, depth=self.depth,
                           memory_policy=memory_policy,
                           search_layout=False)

    def floor(self, memory_policy: str) -> float:
        """No plan of this layout under ``memory_policy`` needs less per device."""
        if memory_policy == "none":
            return self.memory_floor_bytes
        if memory_policy in ("auto", "offload") and self.offload_floor_bytes is not None:
            return self.offload_floor_bytes
        return self.params_floor_bytes


def _modes(req: PlanRequest, stages: int) -> list[tuple[str, int]]:
    """(GEMS mode, replicas) pairs for ``stages`` model-parallel devices."""
    if not req.search_layout:
        if req.parallel != "mp" and stages < 2:
            return []
        return [(req.parallel, r) for r in req.replica_options()]
    out = [("mp", 1)]
    if stages >= 2:
        out.append(("mast", 2))
    out += [("master", r) for r in (4, 8) if r <= stages]
    return out


class Totals:
    """What the bounds of one tensor-parallel degree's layouts read off its costed graph (of
    the global batch): one rank's work and critical path, parameter state, saved activations.

    ``fixed_s`` is what every node's forward and backward cost at any micro-batch size (the
    device's launch cost, as :func:`~outcore.graph.batch.at_microbatch` keeps it): a layout
    that runs the model ``n`` times per iteration (copies x micro-batches) does ``n`` times
    that part of the work and the rest once, and its critical path is the rescaled graph's.
    """

    def __init__(self, g: Graph, optimizer: str, fixed_s: float = 0.0) -> None:
        fwd, bwd = np.asarray(g.fwd_s, np.float64), np.asarray(g.bwd_s, np.float64)
        self._g = g
        self._fixed = np.minimum(fwd, fixed_s) + np.minimum(bwd, fixed_s)
        self._rest = fwd + bwd - self._fixed
        self.work_s = float((fwd + bwd).sum())
        self.fixed_work_s = float(self._fixed.sum())
        self.params_bytes = float(g.param_bytes.sum()) * state_factor(optimizer)
        self.saved_bytes = float(g.saved_bytes.sum())
        self._paths: dict[float, float] = {}

    def work_at(self, runs: int) -> float:
        """Work of ``runs`` runs of the model that together process the global batch once."""
        return self.fixed_work_s * runs + (self.work_s - self.fixed_work_s)

    def path_at(self, scale: float) -> float:
        """Critical path (forward + backward) of one micro-batch of ``scale`` x the batch."""
        if scale not in self._paths:
            g = self._g
            self._paths[scale] = (float(longest_to_sinks(
                g, self._fixed + self._rest * scale, np.zeros(g.num_edges)).max())
                if g.num_nodes else 0.0)
        return self._paths[scale]


def tensor_degrees(g: Graph, req: PlanRequest) -> tuple[dict[int, Totals], list[str]]:
    """The tensor-parallel degrees the layouts of ``req`` may use, each with its totals: the
    request's ``tp``, or (``tp=None``) 1, 2, 4 and 8 that divide the devices (none with
    ``sp``); and a note for each degree no layer of ``g`` splits into."""
    if req.tp is not None:
        options = [req.tp]
    else:
        options = [t for t in (1, 2, 4, 8) if req.devices % (t * req.sp) == 0
                   and (t == 1 or req.sp == 1)]
    totals: dict[int, Totals] = {}
    notes: list[str] = []
    for t in options:
        try:
            # a split layer's launch cost is not the one the rescaling keeps (it divides
            # the node's time by tp): its bound scales the whole time, which stays below it
            totals[t] = Totals(tensor_costed(g, req.replace(tp=t)), req.optimizer,
                                fixed_s(req) if t == 1 else 0.0)
        except InfeasibleError as e:
            if req.tp is not None:
                raise
            notes.append(str(e).split(" (")[0])  # "--tp N: no layer of ... can be split"
    return totals, notes


def candidate_layouts(g: Graph, req: PlanRequest,
                      degrees: dict[int, Totals] | None = None) -> list[LayoutChoice]:
    """Every layout the request allows, with bounds, in enumeration order (tp, dp, mode, M):
    plain layouts first, so that their plans prune the tensor-parallel ones by time.

    This is the one place layouts are enumerated: a new dimension (spatial degree) adds its
    values here. ``g`` holds the global batch when ``req.whole_batch``, else one micro-batch
    (then the request's own layout is the only candidate). ``degrees``: the tensor-parallel
    degrees and their totals (default: :func:`tensor_degrees`).
    """
    B = int(g.batch_size or 1)
    if degrees is None:
        degrees = tensor_degrees(g, req)[0]
    if not req.whole_batch:
        M = int(req.microbatches)
        copies = req.dp * (req.replica_options()[0] if req.parallel != "mp" else 1)
        totals = degrees[req.fixed_tp]  # of one micro-batch: every run does all of its work
        return [_choice(req.dp, req.parallel, req.replica_options()[0], M, B, req,
                        totals, 1.0, req.depth or 1, req.fixed_tp,
                        work_s=totals.work_s * M * copies)]
    # batch statistics as on one device: the request's micro-batches are of the whole batch
    whole_micro = req.batch_stats == "global" and req.microbatches != "auto" \
        and has_batch_statistics(g)
    out: list[LayoutChoice] = []
    for tp, totals in degrees.items():
        for dp in (divisors(req.devices) if req.search_layout else [req.dp]):
            if req.devices % (dp * tp * req.sp):
                continue
            stages = req.devices // (dp * tp * req.sp)
            for mode, R in _modes(req, stages):
                copies = dp * R
                if B % copies:
                    continue
                per_copy = B // copies
                counts = _microbatch_counts(req, per_copy, copies, whole_micro)
                for M in counts:
                    if per_copy % M:
                        continue
                    for depth in _depths(req, dp, mode):
                        out.append(_choice(dp, mode, R, M, per_copy // M, req, totals,
                                           (per_copy // M) / B, depth, tp,
                                           work_s=totals.work_at(copies * M)))
    return out


def _microbatch_counts(req: PlanRequest, per_copy: int, copies: int,
                       whole_micro: bool) -> list[int]:
    """Micro-batches per copy a layout of ``copies`` model copies may run: any divisor of its
    samples (``auto``), the request's count, or, when that counts the micro-batches of the
    whole batch (``whole_micro``), its share of them: copies take whole micro-batches, so no
    batch statistic is split over copies (none when the count does not divide)."""
    if req.microbatches == "auto":
        return divisors(per_copy, at_most=MAX_MICROBATCHES)
    M = int(req.microbatches)
    if not whole_micro:
        return [M]
    return [M // copies] if M % copies == 0 else []


def _depths(req: PlanRequest, dp: int, mode: str) -> list[int]:
    """Sharding degrees of ``dp`` copies: the request's (where it divides), else every
    divisor of ``dp`` (none with GEMS replicas, which are not sharded)."""
    if req.depth is not None:
        return [req.depth] if dp % req.depth == 0 else []
    return divisors(dp) if mode == "mp" else [1]


def _choice(dp: int, mode: str, R: int, M: int, samples: int, req: PlanRequest,
            totals: Totals, scale: float, depth: int, tp: int, *,
            work_s: float) -> LayoutChoice:
    """One layout with its bounds; ``totals`` are one tensor-parallel rank's (of ``tp``),
    ``work_s`` that rank's work over the iteration, ``scale`` a micro-batch's share of the
    graph's batch."""
    stages = max(req.devices // (dp * tp * req.sp), 1)
    R = R if mode != "mp" else 1
    own = totals.params_bytes * R / (stages * req.sp * depth)
    # offloading a segment's parameters keeps its weights and gradients on the device
    # (outcore.search.memory_policy.options); on a host-is-device machine it frees nothing
    factor = state_factor(req.optimizer)
    kept = 1.0 if req.cluster.device.host_is_device else min(1.0, 2.0 / factor)
    return LayoutChoice(dp=dp, parallel=mode, replicas=R, microbatches=M, samples=samples,
                        tp=tp, sp=req.sp, depth=depth,
                        time_bound_s=max(work_s * tp / req.devices, totals.path_at(scale)),
                        params_floor_bytes=own, offload_floor_bytes=own * kept,
                        memory_floor_bytes=own + totals.saved_bytes * scale / (stages * req.sp))


def no_layout_fits(req: PlanRequest, choices: list[LayoutChoice]) -> InfeasibleError:
    """The refusal when every layout's memory floor exceeds the limit, with estimates of the
    memory and the devices that would fit from the lowest floor (the search's caller checks
    them by planning: :func:`outcore.search.refusal.checked_refusal`)."""
    floor = min(c.floor(req.memory_policy) for c in choices)
    mem = req.memory_bytes
    devices = max(math.ceil(req.devices * floor / mem), req.devices + 1) if mem else None
    return InfeasibleError(f"no layout of {req.devices} devices fits {format_bytes(mem or 0)} "
                           "per device, even with more micro-batches: add devices or raise "
                           "--memory", min_devices=devices, min_memory_bytes=floor)


def fixed_s(req: PlanRequest) -> float:
    """What a node's time keeps at any micro-batch size: the device's launch cost."""
    return float(req.cluster.device.launch_s)
