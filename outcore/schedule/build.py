"""Schedule builders: GPipe and 1F1B over the pieces of any placed graph.

The builder list-schedules the tasks ``F(piece, mb)`` and ``B(piece, mb)`` in simulated time:
a task is ready when its inputs have arrived (forward: the producers' forwards; backward: the
piece's forward and the consumers' backwards), and each rank runs one task at a time, choosing
among its ready tasks by the policy:

* ``gpipe`` (Huang et al., 2019): every forward of a rank before any of its backwards; then
  backwards. All micro-batches' activations are alive at the peak.
* ``1f1b`` (PipeDream-flush, Narayanan et al., 2021, section 2.2): backward first whenever one is
  ready; a rank starts a new micro-batch only while fewer than ``limit`` are in flight on it,
  where ``limit`` = 1 + the largest number of device hops from its pieces to the end of the
  graph (for a chain of K stages: K - stage), which bounds activation memory.

The per-rank order comes from one consistent execution, so it cannot deadlock whatever the
real durations are. A lowering pass then inserts the sends and receives: a receive just before
the compute that needs it, a send right after the compute that produced it.
"""

from __future__ import annotations

import heapq
from typing import Callable

import numpy as np

from outcore.errors import ScheduleError, UsageError
from outcore.graph.jit import HAVE_NUMBA
from outcore.plan.pieces import Pieces
from outcore.schedule._list_kernel import list_schedule, sink_hops
from outcore.schedule.costs import PieceCosts
from outcore.schedule.ir import OP_INDEX, Action, ActionColumns, Schedule

KINDS = {"gpipe": "all forwards, then all backwards (GPipe)",
         "1f1b": "one forward, one backward; bounded micro-batches in flight (PipeDream-flush)"}

LinkTime = Callable[[int, int, float], float]  # (src rank, dst rank, bytes) -> seconds


def inflight_limits(pieces: Pieces, num_ranks: int) -> list[int]:
    """1F1B bound per rank: 1 + most device hops from any of its pieces to a sink piece
    (transfers go to higher piece ids, :func:`outcore.plan.pieces.cut`: one pass in reverse;
    compiled, :func:`outcore.schedule._list_kernel.sink_hops`)."""
    ptr, ids = pieces.outputs_csr
    return sink_hops(ptr, ids, pieces.transfer_dst, pieces.transfer_local, pieces.device_of,
                     num_ranks).tolist()


def build(pieces: Pieces, num_ranks: int, microbatches: int, kind: str, costs: PieceCosts,
          link_time: LinkTime, *, buckets: tuple[tuple[int, ...], ...] = (),
          step: bool = True) -> Schedule:
    """Build the ``kind`` schedule of ``microbatches`` micro-batches over ``pieces``.

    Args:
        pieces: the cut of the placed graph; ``piece.device`` is the rank that runs it.
        num_ranks: number of ranks (ranks without pieces get an empty list).
        microbatches: micro-batches per iteration (>= 1).
        kind: ``gpipe`` or ``1f1b``.
        costs: per-micro-batch costs (durations steer the order; any order built is valid).
        link_time: seconds to move a number of bytes between two ranks.
        buckets: rank groups that all-reduce gradients at the end (one ``AR`` each).
        step: end every rank's list with ``OPT``.
    """
    if kind not in KINDS:
        raise UsageError(f"unknown schedule {kind!r}; choose one of: {', '.join(KINDS)}")
    if microbatches < 1:
        raise UsageError(f"micro-batches must be at least 1, got {microbatches}")
    if pieces.num_pieces and (pieces.device_of.max() >= num_ranks or
                              pieces.device_of.min() < 0):
        raise ScheduleError(f"a piece is placed on a rank outside 0..{num_ranks - 1}")
    limits = inflight_limits(pieces, num_ranks)
    tasks = _tasks(pieces, num_ranks, microbatches, kind, costs, link_time, limits)
    columns = _message_columns(pieces, num_ranks, *tasks)
    full = tuple(_with_tail(columns[r], [b for b, group in enumerate(buckets) if r in group],
                            step) for r in range(num_ranks))
    return Schedule(kind, num_ranks, microbatches, pieces, full, tuple(buckets),
                    meta={"limits": limits if kind == "1f1b" else None})


def _with_tail(columns: tuple[np.ndarray, ...], buckets: list[int], step: bool
               ) -> ActionColumns:
    """A rank's actions and, after them, an ``AR`` of each of its ``buckets`` and (with
    ``step``, when it has any action) ``OPT``."""
    op, mb, piece, transfer = columns
    bucket = list(buckets) + ([-1] if step and (op.size or buckets) else [])
    tail = np.array([_AR] * len(buckets) + [_OPT] * (len(bucket) - len(buckets)), np.int64)
    none = np.full(len(bucket), -1, np.int64)
    return ActionColumns(np.concatenate([op, tail]), np.concatenate([mb, none]),
                         np.concatenate([piece, none]), np.concatenate([transfer, none]),
                         np.concatenate([np.full(op.size, -1, np.int64),
                                         np.array(bucket, np.int64)]))


_F, _B, _SF, _SB, _RF, _RB, _AR, _OPT = (  # op numbers of ActionColumns
    OP_INDEX[op] for op in ("F", "B", "SF", "SB", "RF", "RB", "AR", "OPT"))


def _tasks(pieces: Pieces, num_ranks: int, M: int, kind: str, costs: PieceCosts,
           link_time: LinkTime, limits: list[int]) -> tuple[np.ndarray, ...]:
    """The compute tasks ``(rank, op, piece, mb)`` (op 0: forward, 1: backward), each rank's in
    the order a simulation ran them (compiled when numba is installed:
    :mod:`outcore.schedule._list_kernel`)."""
    if HAVE_NUMBA and pieces.num_pieces:
        return _compiled_tasks(pieces, num_ranks, M, kind, costs, link_time, limits)
    state = _ListState(pieces, num_ranks, M, kind, costs, link_time)
    for _ in range(2 * pieces.num_pieces * M):
        state.run_next()
    return _task_arrays(state.order)


def _task_arrays(order: list[list[tuple[str, int, int]]]) -> tuple[np.ndarray, ...]:
    """Per-rank compute tasks ``(op, piece, mb)`` as the arrays ``(rank, op, piece, mb)`` (op 0:
    forward, 1: backward)."""
    rows = []
    for r, tasks in enumerate(order):
        for op, p, m in tasks:
            if op not in ("F", "B"):
                raise ScheduleError(f"unknown compute task {op!r}: expected F or B")
            rows.append((r, 0 if op == "F" else 1, p, m))
    if not rows:
        return tuple(np.zeros(0, np.int64) for _ in range(4))
    return tuple(np.array(c, np.int64) for c in zip(*rows))


def _compiled_list_schedule(pieces: Pieces, num_ranks: int, M: int, kind: str,
                            costs: PieceCosts, link_time: LinkTime
                            ) -> list[list[tuple[str, int, int]]]:
    """Per rank, the compute tasks ``(op, piece, mb)`` the compiled kernel orders (the same
    order as :class:`_ListState`: the tests compare them)."""
    rank, op, piece, mb = _compiled_tasks(pieces, num_ranks, M, kind, costs, link_time,
                                          inflight_limits(pieces, num_ranks))
    order: list[list[tuple[str, int, int]]] = [[] for _ in range(num_ranks)]
    names = ("F", "B")
    for r, o, p, m in zip(rank.tolist(), op.tolist(), piece.tolist(), mb.tolist()):
        order[r].append((names[o], p, m))
    return order


def _compiled_tasks(pieces: Pieces, num_ranks: int, M: int, kind: str,
                    costs: PieceCosts, link_time: LinkTime, limits: list[int]
                    ) -> tuple[np.ndarray, ...]:
    """:func:`_tasks` by the compiled kernel."""
    P, T = pieces.num_pieces, pieces.num_transfers
    src, dst = pieces.transfer_pieces
    nbytes = costs.transfer_bytes
    delay_f, delay_b = np.zeros(T), np.zeros(T)
    if isinstance(link_time, ClusterLinkTime):  # every remote transfer at once
        a, b = pieces.device_of[src], pieces.device_of[dst]
        remote = np.flatnonzero(a != b)
        nb = np.asarray(nbytes, np.float64)[remote]
        delay_f[remote] = link_time.many(a[remote], b[remote], nb)
        delay_b[remote] = link_time.many(b[remote], a[remote], nb)
    else:
        for t, ((a, b), local) in enumerate(zip(pieces.transfer_devices,
                                                 pieces.transfer_local.tolist())):
            if not local:
                delay_f[t] = link_time(a, b, nbytes[t])
                delay_b[t] = link_time(b, a, nbytes[t])
    in_ptr, in_tr = pieces.inputs_csr
    out_ptr, out_tr = pieces.outputs_csr
    rank, op, piece, mb = list_schedule(
        P, M, num_ranks, kind == "gpipe", pieces.device_of, in_ptr, in_tr, out_ptr, out_tr,
        src, dst, delay_f, delay_b, np.asarray(costs.fwd_s, np.float64),
        np.asarray(costs.bwd_s, np.float64),
        np.asarray(limits, np.int64))
    if rank.size < 2 * P * M:
        raise ScheduleError("the schedule builder is stuck: no rank has a runnable task "
                            "(the piece graph is inconsistent)")
    return (np.asarray(rank, np.int64), np.asarray(op, np.int64), np.asarray(piece, np.int64),
            np.asarray(mb, np.int64))


class _ListState:
    """The list scheduler's state: remaining dependencies and ready times of every task
    ``(op, piece, mb)``, each rank's ready pool and in-flight micro-batches."""

    def __init__(self, pieces: Pieces, num_ranks: int, M: int, kind: str, costs: PieceCosts,
                 link_time: LinkTime):
        P = len(pieces.pieces)
        self.pieces, self.R, self.kind, self.costs, self.link_time = \
            pieces, num_ranks, kind, costs, link_time
        self.dev = [p.device for p in pieces.pieces]
        self.deps_f = [[len(pieces.inputs_of[p])] * M for p in range(P)]
        self.deps_b = [[len(pieces.outputs_of[p]) + 1] * M for p in range(P)]
        self.ready_f = [[0.0] * M for _ in range(P)]
        self.ready_b = [[0.0] * M for _ in range(P)]
        self.limits = inflight_limits(pieces, num_ranks)
        self.f_left = [0] * num_ranks
        self.b_left = [[0] * M for _ in range(num_ranks)]  # backward tasks of mb m left on r
        for p in range(P):
            self.f_left[self.dev[p]] += M
            for m in range(M):
                self.b_left[self.dev[p]][m] += 1
        self.f_started = [[False] * M for _ in range(num_ranks)]
        self.inflight = [0] * num_ranks
        self.free_at = [0.0] * num_ranks
        # ready pools per rank (:class:`_Pool`); each rank's next task is picked again only
        # when its pool or its own state changed (a 300-node random DAG's refusal spent 66 of
        # its 88 s picking the same tasks again)
        self.pool = [_Pool(kind) for _ in range(num_ranks)]
        self.dirty = [True] * num_ranks
        self.order: list[list[tuple[str, int, int]]] = [[] for _ in range(num_ranks)]
        for p in range(P):
            if not pieces.inputs_of[p]:
                for m in range(M):
                    self.push(self.dev[p], "F", p, m, 0.0)

    def push(self, r: int, op: str, p: int, m: int, t: float) -> None:
        if self.kind == "1f1b":
            prio = (0, m, -p) if op == "B" else (1, m, p)
        else:
            prio = (1, m, -p) if op == "B" else (0, m, p)
        self.pool[r].add((prio, t, op, p, m))
        self.dirty[r] = True

    def run_next(self) -> None:
        """Run the task that can start earliest (ties: lowest rank)."""
        best = None  # (start, rank, entry)
        for r in range(self.R):
            if self.dirty[r]:
                self.pool[r].pick(self.free_at[r], self._gate(r))
                self.dirty[r] = False
            entry = self.pool[r].held
            if entry is not None:
                start = max(self.free_at[r], entry[1])
                if best is None or (start, r) < (best[0], best[1]):
                    best = (start, r, entry)
        if best is None:
            raise ScheduleError("the schedule builder is stuck: no rank has a runnable task "
                                "(the piece graph is inconsistent)")
        start, r, entry = best
        self.pool[r].held = None  # taken
        self.dirty[r] = True
        _, _, op, p, m = entry
        end = start + (self.costs.fwd_s[p] if op == "F" else self.costs.bwd_s[p])
        self.free_at[r] = end
        self.order[r].append((op, p, m))
        if op == "F":
            self._forward_done(r, p, m, end)
        else:
            self._backward_done(r, p, m, end)

    def _gate(self, r: int) -> Callable[[tuple], bool]:
        """Whether rank ``r`` may run a task of the gated kind now (the other kind always
        may): under GPipe a backward once every forward has run, under 1F1B the forward of
        a micro-batch already started, or of a new one while fewer than the limit are."""
        if self.kind == "gpipe":
            done = self.f_left[r] == 0
            return lambda entry: done
        started, room = self.f_started[r], self.inflight[r] < self.limits[r]
        return lambda entry: room or started[entry[4]]

    def _arrival(self, r: int, t: int, q: int, end: float) -> float:
        tr = self.pieces.transfers[t]
        return end + (0.0 if tr.local else
                      self.link_time(r, self.dev[q], self.costs.transfer_bytes[t]))

    def _forward_done(self, r: int, p: int, m: int, end: float) -> None:
        self.f_left[r] -= 1
        if not self.f_started[r][m]:
            self.f_started[r][m] = True
            self.inflight[r] += 1
        for t in self.pieces.outputs_of[p]:
            q = self.pieces.transfers[t].dst
            self._release("F", q, m, self._arrival(r, t, q, end))
        self._release("B", p, m, end)

    def _backward_done(self, r: int, p: int, m: int, end: float) -> None:
        self.b_left[r][m] -= 1
        if self.b_left[r][m] == 0:
            self.inflight[r] -= 1
        for t in self.pieces.inputs_of[p]:
            q = self.pieces.transfers[t].src
            self._release("B", q, m, self._arrival(r, t, q, end))

    def _release(self, kind: str, q: int, m: int, at: float) -> None:
        """One dependency of task ``kind`` (piece ``q``, micro-batch ``m``) is met at ``at``;
        the task is queued on its rank once all are."""
        ready, deps = (self.ready_f, self.deps_f) if kind == "F" else (self.ready_b, self.deps_b)
        ready[q][m] = max(ready[q][m], at)
        deps[q][m] -= 1
        if deps[q][m] == 0:
            self.push(self.dev[q], kind, q, m, ready[q][m])


class _Pool:
    """One rank's ready tasks ``(priority, ready_time, op, piece, mb)``: those not ready by
    the time the rank is free (a heap by ready time, then priority), and those ready (a heap
    by priority per op: the op that sorts first, 1F1B's backwards and GPipe's forwards, may
    always run; the other is gated, :meth:`_ListState._gate`).

    :meth:`pick` holds the task the rank runs next: the best-priority runnable task ready by
    the time the earliest runnable one could start (as a scan of every task would)."""

    def __init__(self, kind: str):
        self.free_op = "B" if kind == "1f1b" else "F"
        self.pending: list[tuple[float, tuple, tuple]] = []
        self.ready: dict[str, list[tuple[tuple, tuple]]] = {"F": [], "B": []}
        self.held: tuple | None = None

    def add(self, entry: tuple) -> None:
        heapq.heappush(self.pending, (entry[1], entry[0], entry))

    def pick(self, free: float, runnable: Callable[[tuple], bool]) -> None:
        """Hold the task to run next on a rank free at ``free`` (None: nothing runnable)."""
        if self.held is not None:  # picked before the pool or the rank changed: pick again
            self.add(self.held)
            self.held = None
        pending, ready = self.pending, self.ready
        while pending and pending[0][0] <= free:
            _, prio, entry = heapq.heappop(pending)
            heapq.heappush(ready[entry[2]], (prio, entry))
        free_op = ready[self.free_op]
        gated = ready["F" if self.free_op == "B" else "B"]
        if free_op:
            self.held = heapq.heappop(free_op)[1]
            return
        self.held = _first(gated, runnable, 1)
        if self.held is None:  # nothing ready yet: the runnable task ready first
            self.held = _first(pending, lambda entry: entry[2] == self.free_op or
                               runnable(entry), 2)


def _first(heap: list, runnable: Callable[[tuple], bool], at: int) -> tuple | None:
    """Pop and return the first runnable entry of ``heap`` in heap order (its task is item
    ``at`` of each heap item), leaving the others."""
    skipped = []
    found = None
    while heap:
        item = heapq.heappop(heap)
        if runnable(item[at]):
            found = item[at]
            break
        skipped.append(item)
    for item in skipped:
        heapq.heappush(heap, item)
    return found


def with_messages(pieces: Pieces, order: list[list[tuple[str, int, int]]]) -> list[list[Action]]:
    """Insert sends and receives around each rank's compute tasks ``(op, piece, mb)``
    (:func:`_message_columns`, as actions)."""
    return [list(_with_tail(c, [], False))
            for c in _message_columns(pieces, len(order), *_task_arrays(order))]


def _message_columns(pieces: Pieces, num_ranks: int, rank: np.ndarray, op: np.ndarray,
                     piece: np.ndarray, mb: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """Per rank, ``(op, mb, piece, transfer)`` columns of its compute tasks (``op`` 0:
    forward, 1: backward; each rank's in order) with their messages around them.

    Before ``F(p, m)``: receive every remote input transfer of ``p``; after it, send every
    remote output transfer. Before ``B(p, m)``: receive the gradients of every remote output
    transfer; after it, send the gradients of every remote input transfer (transfer ids
    ascending in each, but the gradients' descending: the latest producer, whose backward
    runs first, first; a peer reads a same-host link's messages in their order, so one
    it needs later, sent earlier, is held from the first one's receive).
    """
    o = np.argsort(rank, kind="stable")
    rank, op, piece, mb = rank[o], op[o], piece[o], mb[o]
    remote = ~pieces.transfer_local
    in_ptr, ins = _kept(*pieces.inputs_csr, remote)
    out_ptr, outs = _kept(*pieces.outputs_csr, remote)
    ids = np.concatenate([ins, outs])  # one table: outputs after the inputs
    fwd = op == 0
    n_in, n_out = np.diff(in_ptr)[piece], np.diff(out_ptr)[piece]
    before = np.where(fwd, n_in, n_out)
    after = np.where(fwd, n_out, n_in)
    size = before + 1 + after
    start = np.zeros(size.size + 1, np.int64)
    np.cumsum(size, out=start[1:])
    total = int(start[-1])
    a_op, a_tr = np.empty(total, np.int64), np.full(total, -1, np.int64)
    a_piece, a_mb = np.full(total, -1, np.int64), np.repeat(mb, size)
    at = start[:-1] + before
    a_op[at], a_piece[at] = np.where(fwd, _F, _B), piece
    in_base, out_base = in_ptr[piece], ins.size + out_ptr[piece]
    for n, first, base, codes, down in (
            (before, start[:-1], np.where(fwd, in_base, out_base), np.where(fwd, _RF, _RB),
             np.zeros_like(fwd)),
            (after, at + 1, np.where(fwd, out_base, in_base), np.where(fwd, _SF, _SB), ~fwd)):
        task = np.repeat(np.arange(n.size), n)
        k = np.arange(task.size) - np.repeat(np.cumsum(n) - n, n)
        a_op[first[task] + k] = codes[task]
        k_id = np.where(down[task], n[task] - 1 - k, k)
        a_tr[first[task] + k] = ids[base[task] + k_id]
    bounds = start[np.searchsorted(rank, np.arange(num_ranks + 1))]
    return [(a_op[i:j], a_mb[i:j], a_piece[i:j], a_tr[i:j])
            for i, j in zip(bounds[:-1].tolist(), bounds[1:].tolist())]


def _kept(ptr: np.ndarray, ids: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, ...]:
    """A CSR table (``ptr``, ``ids``) with only the ids where ``keep``."""
    mask = keep[ids]
    row = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
    new = np.zeros(ptr.size, np.int64)
    np.cumsum(np.bincount(row[mask], minlength=ptr.size - 1), out=new[1:])
    return new, ids[mask]


class ClusterLinkTime:
    """A :data:`LinkTime` over a cluster's links (nothing within a rank), which the compiled
    builder also asks for many transfers at once (:meth:`many`)."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster

    def __call__(self, a: int, b: int, nbytes: float) -> float:
        return self.cluster.link(a, b).time(nbytes) if a != b else 0.0

    def many(self, a: np.ndarray, b: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        return np.where(a != b, self.cluster.link_times(a, b, nbytes), 0.0)


def simple_link(bandwidth: float, latency_s: float) -> LinkTime:
    """Alpha-beta link time, the same for every pair of ranks."""
    return lambda a, b, nbytes: latency_s + nbytes / bandwidth if nbytes > 0 else latency_s


def summary(s: Schedule) -> dict[str, float]:
    """Counts of each op in the schedule (for reports and tests)."""
    counts: dict[str, float] = {}
    for acts in s.actions:
        for a in acts:
            counts[a.op] = counts.get(a.op, 0) + 1
    counts["ranks"] = float(np.sum([bool(a) for a in s.actions]))
    return counts
