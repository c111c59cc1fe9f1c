"""A refusal that names what would fit: when no plan fits the request, the device count and the
memory per device it suggests are ones the search itself has planned and found to fit, never
unchecked estimates. The search is passed in (``fits_request``), so this module knows nothing
of how it plans."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace

from outcore.errors import InfeasibleError
from outcore.graph.ir import Graph
from outcore.hardware.spec import Cluster
from outcore.plan.request import PlanRequest
from outcore.units import format_bytes

__all__ = ["checked_refusal"]


def checked_refusal(g: Graph, req: PlanRequest, error: InfeasibleError,
                    fits_request: Callable[[Graph, PlanRequest], bool], *,
                    budget_s: float = 30.0,
                    progress: Callable[[str, int, int], None] | None = None
                    ) -> InfeasibleError:
    """``error`` with its suggestions replaced by checked ones: the fewest devices (from the
    planners' estimate upward) and the least memory per device (from the estimate upward, then
    narrowed by bisection while ``budget_s`` lasts: a suggestion is always one that fits, less
    tight when the budget ran out) for which ``fits_request(g, request)`` is true (the search
    finds a plan that fits: :func:`outcore.search.loop.fits_request`).
    ``progress(phase, seconds spent, budget)`` follows the checks."""
    if error.min_devices is None and error.min_memory_bytes is None and \
            error.need_bytes is None:
        return error  # it suggests no number: its own advice stands
    start = time.monotonic()
    slowest = [0.0]  # the longest check so far: none starts that would end past the budget

    def fits(r: PlanRequest) -> bool:
        if progress:
            progress("nothing fits: checking what would", min(int(time.monotonic() - start),
                                                             int(budget_s)), int(budget_s))
        began = time.monotonic()
        try:
            return fits_request(g, r)
        finally:
            slowest[0] = max(slowest[0], time.monotonic() - began)

    def over() -> bool:
        return time.monotonic() + slowest[0] > start + budget_s

    # an error that suggested numbers gives way to checked ones; one that gave only advice
    # (allow memory policies, add devices) keeps it, and the checked fixes follow
    first = str(error).split("; ")[0] \
        if error.min_devices is not None or error.min_memory_bytes is not None else str(error)
    # a node too big for any count without memory policies (min_devices None) may fit with
    # them: the zoo MLP at 15 KiB per device, one layer needing 16.75 KiB, fits on 3 devices
    devices = error.min_devices or (req.model_parallel_devices + 1
                                    if req.memory_policy != "none" else None)
    m = _most_microbatches(fits, g, req, over)
    k = _fewest_devices(fits, req, devices, over)
    # a placement's memory policies ran out: what its fullest device needed is where the
    # least memory starts
    mem = _least_memory(fits, req, error.min_memory_bytes or error.need_bytes, over)
    if progress:
        progress("nothing fits: checking what would", int(budget_s), int(budget_s))
    fixes = []
    if m is not None:
        fixes.append(f"--microbatches {m} fits (checked)")
    if k is not None:
        fixes.append(f"{k} devices fit (checked)")
    if mem is not None:
        fixes.append(f"{format_bytes(mem)} per device fits on {req.devices} (checked)")
    fix = " or ".join(fixes) if fixes else "no device count or memory that was tried fits"
    return InfeasibleError(f"{first}; {fix}", min_devices=k, min_memory_bytes=mem)


def _most_microbatches(fits_request: Callable[[PlanRequest], bool], g: Graph,
                       req: PlanRequest, over: Callable[[], bool]) -> int | None:
    """The most micro-batches below the request's fixed count that fit: a pipeline keeps up
    to a micro-batch per stage in flight, so fewer can fit where more do not. Counts that
    split the batch when the graph holds the whole batch (the search splits it over the
    copies); any fewer otherwise (the graph is one micro-batch). None when the count is open
    (the search tried them) or 1."""
    if not isinstance(req.microbatches, int) or req.microbatches <= 1:
        return None
    batch = int(g.batch_size or 1)
    counts = [m for m in range(req.microbatches - 1, 0, -1)
              if not req.whole_batch or batch % m == 0]
    for m in counts:
        if over():
            return None
        if fits_request(req.replace(microbatches=m)):
            return m
    return None


# a device count estimated above this (or 4x the request) is not checked: planning on that
# many devices takes minutes (the RNN generator's 3k nodes at 8 micro-batches: 990 estimated,
# 195 s to check) and is not what a user of a few devices asked about
MAX_CHECKED_DEVICES = 16


def _fewest_devices(fits_request: Callable[[PlanRequest], bool], req: PlanRequest,
                    estimate: int | None, over: Callable[[], bool]) -> int | None:
    """The fewest model-parallel devices (x dp) that fit: the first from ``estimate`` up, then
    fewer while they fit too (memory policies can fit counts that the estimate, a floor
    without them, rules out); none once ``over()``: the time is spent, or when the estimate
    is past :data:`MAX_CHECKED_DEVICES` and 4x the request."""
    if not estimate or estimate > max(MAX_CHECKED_DEVICES, 4 * req.model_parallel_devices):
        return None
    lowest = req.model_parallel_devices + 1

    def fit(k: int) -> bool:
        devices = k * req.dp * (req.tp or 1)
        return fits_request(req.replace(devices=devices, cluster=_grown(req.cluster, devices)))

    start = max(estimate, lowest)
    found = None
    for k in range(start, 2 * estimate + 3):
        if over():
            return None
        if fit(k):
            found = k
            break
    if found is None:
        return None
    if found == start:  # fewer than the estimate may fit too
        while found > lowest and not over() and fit(found - 1):
            found -= 1
    return found * req.dp * (req.tp or 1)


def _least_memory(fits_request: Callable[[PlanRequest], bool], req: PlanRequest,
                  estimate: float | None, over: Callable[[], bool]) -> float | None:
    """The least per-device memory from ``estimate`` up that fits (to about 2 %, or less
    tight once ``over()``)."""
    if not estimate or req.memory_bytes is None:
        return None

    def ok(mem: float) -> bool:
        return fits_request(req.replace(memory_bytes=mem, cluster=req.cluster.with_memory(mem)))

    low, high = float(req.memory_bytes), max(float(estimate), float(req.memory_bytes))
    while not ok(high):
        if over():
            return None
        low, high = high, high * 1.25
    while high - low > 0.02 * high and not over():
        mid = (low + high) / 2
        low, high = (low, mid) if ok(mid) else (mid, high)
    shown = _round_up(high)  # what the message prints must fit too
    if shown == high or (not over() and ok(shown)):
        return shown
    return math.ceil(high)


def _round_up(nbytes: float) -> float:
    """``nbytes`` rounded up to what :func:`format_bytes` prints (two decimals of its unit)."""
    unit = 1.0
    while nbytes >= unit * 1024 and unit < 1024.0 ** 4:
        unit *= 1024
    return math.ceil(nbytes / unit * 100 - 1e-9) / 100 * unit


def _grown(cluster: Cluster, devices: int) -> Cluster:
    """``cluster`` with at least ``devices`` devices (more of the same nodes)."""
    if cluster.size >= devices:
        return cluster
    if cluster.nodes == 1:
        return replace(cluster, devices_per_node=devices)
    return replace(cluster, nodes=-(-devices // cluster.devices_per_node))
