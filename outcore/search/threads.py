"""The placements a search compares within one layout: every placer's, made under the memory
budget (or a relaxed one that memory policies may close) on planner threads side by side, and
each one's emulation with port contention (:func:`outcore.search.placement.best_placement`
simulates the few that :mod:`outcore.search.prune` keeps)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from functools import cache

from outcore.errors import InfeasibleError, UsageError
from outcore.graph.ir import Graph
from outcore.placers import PartitionResult, placements
from outcore.placers.context import make_context
from outcore.placers.emulate import run
from outcore.placers.feasibility import infeasible, spread_floor_bytes
from outcore.plan.plan import colocated_params
from outcore.plan.request import PlanRequest

# the placements the simulator may judge: those of the few planners fastest by the emulator,
# and every contiguous split (the simple plans the search must never lose to); any of them the
# estimate puts past PRUNE_RATIO x the best simulated plan is still skipped
SIMULATED_PER_SEARCH = 2

# planners placing side by side; None: OUTCORE_PLANNER_THREADS, else two where there are two
# cores (OUTCORE_PLANNER_THREADS=1: one at a time)
PLANNER_THREADS: int | None = None


def planner_threads() -> int:
    """How many threads :func:`place` uses (see :data:`PLANNER_THREADS`)."""
    if PLANNER_THREADS is not None:
        return PLANNER_THREADS
    text = os.environ.get("OUTCORE_PLANNER_THREADS", "").strip()
    if not text:
        return min(2, os.cpu_count() or 1)
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise UsageError(f"OUTCORE_PLANNER_THREADS={text!r}: give a whole number of threads, at "
                     "least 1 (1: the planners place one at a time)")


def place(g: Graph, req: PlanRequest, budget: float | None, names: tuple[str, ...],
          check_fit: bool, *, contend: bool = False):
    """Every planner's placement(s) as ``(name, PartitionResult)``, emulated, not simulated.

    A planner that finds nothing under ``budget`` places under a relaxed limit
    (:data:`RELAXED`: the tightest of 1.5x, 2x, 4x, 8x, unlimited that it can meet when memory
    policies may close the gap; 1.5x without them), for the simulator to judge.
    The planners run side by side (:func:`planner_threads`) (their compiled loops
    release the interpreter); the results are listed in ``names`` order, as run one by one.
    ``contend``: also return each placement's :func:`contended_runs` emulation, each
    planner's queued as soon as it returns, so that they fill the threads while the slowest
    planner still places (the same emulations as :func:`contended_runs` after the planners).
    Within :func:`shared_threads` the planners run on its threads, and placements
    :func:`place_ahead` started with the same arguments are taken as they are.
    """
    shared = _SHARED.get()
    if shared is not None and shared.pool is not None:
        key = (g, req, budget, names, check_fit, contend)
        placing = shared.take(key) or _Placing(g, req, budget, names, check_fit, contend,
                                               shared.pool)
        return placing.result()
    threads = min(planner_threads(), len(names))
    pool = ThreadPoolExecutor(threads) if threads >= 2 else None
    try:
        return _Placing(g, req, budget, names, check_fit, contend, pool).result()
    finally:
        if pool is not None:
            pool.shutdown()


def place_ahead(g: Graph, req: PlanRequest, budget: float | None, names: tuple[str, ...],
                check_fit: bool, *, contend: bool = False) -> bool:
    """Start :func:`place` on :func:`shared_threads`' threads now, for a later call with the
    same arguments (the layout search: the next layout's planners run while this thread
    simulates the last layout's plans). Returns whether it started (not outside
    :func:`shared_threads`, nor with one planner thread)."""
    shared = _SHARED.get()
    if shared is None or shared.pool is None:
        return False
    key = (g, req, budget, names, check_fit, contend)
    if shared.find(key) is None:
        shared.ahead.append((key, _Placing(g, req, budget, names, check_fit, contend,
                                           shared.pool)))
    return True


class _Placing:
    """:func:`place`'s planners, started on ``pool`` (None: run at once, one by one)."""

    def __init__(self, g: Graph, req: PlanRequest, budget: float | None,
                 names: tuple[str, ...], check_fit: bool, contend: bool,
                 pool: ThreadPoolExecutor | None) -> None:
        floor = spread_floor(g, req, budget)
        relaxable = check_fit and budget is not None
        self.names = names
        self.runs = _Runs(g, req, pool) if contend else None

        def planner(name: str):
            out = _planner(g, req, budget, name, floor, relaxable)
            if self.runs is not None:
                self.runs.add(out[0])  # queued behind the planners not yet started
            return out

        self.futures = [pool.submit(planner, n) for n in names] if pool is not None else None
        self.done = [planner(n) for n in names] if pool is None else None

    def result(self):
        outcomes = self.done if self.futures is None else [f.result() for f in self.futures]
        placed: list[tuple[str, object]] = []
        notes: list[str] = []
        first_error: InfeasibleError | None = None
        for name, (results, error, note) in zip(self.names, outcomes):
            placed.extend((name, r) for r in results)
            first_error = first_error or error
            if note:
                notes.append(note)
        if self.runs is not None:
            return placed, notes, first_error, [self.runs.of(r) for _, r in placed]
        return placed, notes, first_error

    def cancel(self) -> None:
        for f in self.futures or ():
            f.cancel()


def placements_made() -> None:
    """A layout's placements are made (the search now simulates them): call the
    :class:`SharedThreads`' ``after_place``, if any."""
    shared = _SHARED.get()
    if shared is not None:
        shared.placed()


class SharedThreads:
    """The planner threads of one layout search (:func:`shared_threads`), the placements
    started ahead on them (:func:`place_ahead`), and ``after_place``: called once, at the next
    :func:`placements_made` (the layout search starts the next layout's placements there)."""

    def __init__(self, threads: int) -> None:
        self.pool = ThreadPoolExecutor(threads) if threads >= 2 else None
        self.ahead: list[tuple[tuple, _Placing]] = []
        self.after_place: Callable[[], None] | None = None

    def find(self, key: tuple) -> int | None:
        g, rest = key[0], key[1:]
        return next((i for i, (k, _) in enumerate(self.ahead) if k[0] is g and k[1:] == rest),
                    None)

    def take(self, key: tuple) -> _Placing | None:
        i = self.find(key)
        return None if i is None else self.ahead.pop(i)[1]

    def placed(self) -> None:
        hook, self.after_place = self.after_place, None
        if hook is not None:
            hook()

    def close(self) -> None:
        for _, placing in self.ahead:  # started for layouts the search did not reach
            placing.cancel()
        self.ahead.clear()
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


_SHARED: ContextVar[SharedThreads | None] = ContextVar("outcore_planner_threads", default=None)


def current_threads() -> SharedThreads | None:
    """The :func:`shared_threads` block this thread is in, if any."""
    return _SHARED.get()


@contextlib.contextmanager
def shared_threads() -> Iterator[SharedThreads]:
    """Within the block, :func:`place` runs the planners on one pool of
    :func:`planner_threads` threads (the calling thread's block only; nested blocks share the
    outer one's)."""
    outer = _SHARED.get()
    if outer is not None:
        yield outer
        return
    shared = SharedThreads(planner_threads())
    token = _SHARED.set(shared)
    try:
        yield shared
    finally:
        _SHARED.reset(token)
        shared.close()


# the limits (x the budget) a planner that places nothing under the budget tries next, the
# tightest it meets first; None: unlimited. The simulator then judges the fit: memory policies
# may close the gap, and without them the planners' memory model, which bounds the peak from
# above, can refuse a placement that fits (an RNN grid's contiguous split: 288 MiB by the
# planner, 230 MiB simulated, under a 272 MiB limit), so 1.5x is tried even then
RELAXED = (1.0, 1.5, 2.0, 4.0, 8.0, None)


def _planner(g: Graph, req: PlanRequest, budget: float | None, name: str, floor,
             relaxable: bool) -> tuple[list, InfeasibleError | None, str | None]:
    """One planner's placements under ``budget`` (relaxed as :func:`place` says): ``(results,
    the first refusal, a note when it placed nothing)``."""
    first_error: InfeasibleError | None = None
    error: InfeasibleError | None = None
    policies = req.memory_policy != "none"
    for relax in RELAXED if relaxable and policies else RELAXED[:2] if relaxable else (1.0,):
        limit = None if relax is None or budget is None else budget * relax
        if limit is not None and floor is not None and limit < floor[0]:
            error = floor[1]()  # every planner would fail under this limit
            first_error = first_error or error
            continue
        try:
            results = placer_results(g, req, limit, name)
        except InfeasibleError as e:
            if relax == 1.0:
                first_error = first_error or e
                error = e
            continue
        return results, first_error, None
    return [], first_error, f"{name}: {error}" + (
        "; memory policies cannot close the gap either" if relaxable and policies else "")


def spread_floor(g: Graph, req: PlanRequest, budget: float | None):
    """``(floor, refusal)``: the per-device limit below which every planner fails
    (:func:`outcore.placers.feasibility.spread_floor_bytes`), so the search does not ask
    them (0.5 s of a 50k-node search at exactly the fair share), and a function making their
    refusal at the requested budget; None without a budget."""
    if budget is None:
        return None
    ctx = make_context(g, req.model_parallel_devices, cluster=req.cluster.slots(req.fixed_tp),
                       optimizer=req.optimizer, microbatches=req.fixed_microbatches,
                       memory_bytes=budget)
    return spread_floor_bytes(ctx), cache(lambda: infeasible(ctx, "every planner"))


def placer_results(g: Graph, req: PlanRequest, budget: float | None,
                   name: str) -> list[PartitionResult]:
    """The placements placer ``name`` offers for the request's model-parallel devices under
    ``budget`` per device (:func:`outcore.placers.placements`)."""
    return placements(g, req.model_parallel_devices, memory_bytes=budget,
                      cluster=req.cluster.slots(req.fixed_tp), strategy=name,
                      optimizer=req.optimizer, microbatches=req.fixed_microbatches, seed=req.seed)


def contended(g: Graph, req: PlanRequest, placed: list) -> list[float]:
    """Per placement, the emulated iteration with port contention (as the simulator has;
    :func:`outcore.placers.emulate.run`), seconds, of the assignment its plan would run
    (weights moved to their users' device, :func:`outcore.plan.plan.colocated_params`)."""
    return [em.makespan_s for em in contended_runs(g, req, placed)]


def contended_runs(g: Graph, req: PlanRequest, placed: list) -> list:
    """:func:`contended`'s emulations (their ``busy_s``: each device's compute, the runtime's
    fixed cost per piece included); placements alike are emulated once."""
    threads = min(planner_threads(), len(placed))
    pool = ThreadPoolExecutor(threads) if threads >= 2 else None
    try:
        runs = _Runs(g, req, pool)
        runs.add([r for _, r in placed])
        return [runs.of(r) for _, r in placed]
    finally:
        if pool is not None:
            pool.shutdown()


class _Runs:
    """Contended emulations of placements (of the assignment each plan would run: weights
    moved to their users' device, :func:`outcore.plan.plan.colocated_params`), each run on
    ``pool`` (None: at once) and placements alike once (planners often agree: pardnn and
    pipeline on a chain)."""

    def __init__(self, g: Graph, req: PlanRequest, pool: ThreadPoolExecutor | None) -> None:
        self.g, self.pool = g, pool
        self.ctx = make_context(g, req.model_parallel_devices,
                                cluster=req.cluster.slots(req.fixed_tp), optimizer=req.optimizer,
                                microbatches=req.fixed_microbatches)
        self.lock = threading.Lock()
        self.by_bytes: dict[bytes, Future] = {}
        self.key_of: dict[int, bytes] = {}  # id of each result added -> its assignment's bytes

    def add(self, results: list) -> None:
        for r in results:
            a = colocated_params(self.g, r.assignment)
            key = a.tobytes()
            with self.lock:
                self.key_of[id(r)] = key
                if key in self.by_bytes:
                    continue
                if self.pool is not None:
                    self.by_bytes[key] = self.pool.submit(run, self.ctx, a, critical_path=False,
                                                          contend=True)
                    continue
                done: Future = Future()
                self.by_bytes[key] = done
            done.set_result(run(self.ctx, a, critical_path=False, contend=True))

    def of(self, result):
        """The emulation of an added ``result``."""
        return self.by_bytes[self.key_of[id(result)]].result()
