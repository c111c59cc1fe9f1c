"""Choose per-piece memory policies that make a plan fit (no torch).

When a placement does not fit its memory limit, the planner first tries to make it fit with
policies before asking for more devices. It splits every piece of an overflowing device into
about sqrt(nodes) segments of consecutive nodes with equal saved bytes (Chen et al. 2016,
section 4.1: sqrt(n) segments bound checkpointed memory), prices every (segment, policy) option
by the time it adds per byte it frees, and applies the cheapest options on the worst device until
the simulator — which executes the same schedule as the runtime — says every device fits.
Options:

* ``checkpoint``: frees the segment's saved activations minus the inputs it keeps; costs one
  extra forward of the segment (recompute);
* ``offload-activations``: frees the segment's saved activations; costs the part of the copies
  to and from the host that its compute does not hide;
* ``offload-params``: frees the segment's parameters and optimizer state (minus the
  parameters fetched while it computes); costs the part of the fetches its compute does not
  hide.

On a host-is-device machine (CPU training) offloading frees nothing and is never chosen; only
checkpointing makes such a run fit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from outcore.cost.memory import state_factor
from outcore.errors import InfeasibleError, UsageError
from outcore.graph.ir import Graph
from outcore.hardware.spec import Cluster
from outcore.plan.pieces import cut
from outcore.plan.pieces_kernel import segment_bounds
from outcore.plan.plan import Plan
from outcore.plan.policies import CHOICES, MemoryPolicies
from outcore.sim.simulate import simulate
from outcore.units import format_bytes

# what a placement turned down for want of a memory policy says (the layout search looks for it)
NO_POLICY = "no memory policy was allowed"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Option:
    device: int
    nodes: np.ndarray
    policy: str
    freed_bytes: float  # per micro-batch in flight (activations) or once (parameters)
    cost_s: float
    key: int  # tie-break: first node index


def options(g: Graph, assignment: np.ndarray, devices: list[int], mode: str,
            cluster: Cluster, optimizer: str) -> list[_Option]:
    """Every (segment, policy) option on ``devices``, priced."""
    dev = cluster.device
    host = dev.host_is_device
    bw = dev.host_bandwidth
    factor = state_factor(optimizer)
    P = cut(g, assignment)
    seg_of = np.full(g.num_nodes, -1, dtype=np.int64)
    # each piece in about sqrt(its size) segments of near-equal saved bytes (plan.policies.
    # segments, for all pieces at once)
    counts = np.maximum(1, np.rint(np.sqrt(np.diff(P.node_ptr)))).astype(np.int64)
    rows = np.flatnonzero(np.isin(P.device_of, devices))
    start, row = segment_bounds(P.node_ptr, rows, g.saved_bytes[P.node_idx].astype(np.float64),
                                counts)
    end, last = np.empty_like(start), np.ones(start.size, bool)
    end[:-1], last[:-1] = start[1:], row[1:] != row[:-1]
    end[last] = P.node_ptr[row[last] + 1]  # a piece's last segment ends with it
    segs = [P.node_idx[a:b] for a, b in zip(start.tolist(), end.tolist())]
    length = end - start
    at = np.repeat(start - (np.cumsum(length) - length), length) + np.arange(int(length.sum()))
    seg_of[P.node_idx[at]] = np.repeat(np.arange(len(segs)), length)
    n_seg = len(segs)
    inputs = _segment_inputs(g, seg_of, n_seg)
    placed = seg_of >= 0

    def per_segment(values: np.ndarray) -> np.ndarray:
        return np.bincount(seg_of[placed], weights=np.asarray(values, dtype=np.float64)[placed],
                           minlength=n_seg)

    saved_s, fwd_s, bwd_s = per_segment(g.saved_bytes), per_segment(g.fwd_s), per_segment(g.bwd_s)
    params_s = per_segment(g.param_bytes)
    out: list[_Option] = []
    for k, nodes in enumerate(segs):
        d = int(assignment[nodes[0]])
        saved, fwd, bwd = float(saved_s[k]), float(fwd_s[k]), float(bwd_s[k])
        params, inp, key = float(params_s[k]), float(inputs[k]), int(nodes[0])
        if mode in ("auto", "checkpoint") and saved - inp > 0:
            out.append(_Option(d, nodes, "checkpoint", saved - inp, fwd, key))
        if mode in ("auto", "offload") and not host:
            if saved > 0:
                cost = max(0.0, saved / bw - fwd) + max(0.0, saved / bw - bwd)
                out.append(_Option(d, nodes, "offload-activations", saved, cost, key))
            if params > 0:
                cost = max(0.0, params / bw - fwd) + max(0.0, 2 * params / bw - bwd)
                out.append(_Option(d, nodes, "offload-params", params * (factor - 2), cost,
                                   key))
    return out


def _segment_inputs(g: Graph, seg_of: np.ndarray, n_seg: int) -> np.ndarray:
    """Bytes each segment keeps when checkpointed: what enters it from outside (one tensor
    per producer: the first edge of each producer into it) and the model inputs it holds."""
    k = seg_of[g.dst]
    cross = (k >= 0) & (seg_of[g.src] != k)
    src, k, nbytes = g.src[cross], k[cross], g.edge_bytes[cross].astype(np.float64)
    inputs = np.zeros(n_seg)
    if src.size:
        _, first = np.unique(src.astype(np.int64) * max(n_seg, 1) + k, return_index=True)
        inputs += np.bincount(k[first], weights=nbytes[first], minlength=n_seg)
    held = g.nodes_with_op("input")
    held = held[seg_of[held] >= 0]
    inputs += np.bincount(seg_of[held], weights=g.out_bytes[held].astype(np.float64),
                          minlength=n_seg)
    return inputs


def choose(g: Graph, plan: Plan, *, mode: str = "auto", cluster: Cluster,
           max_rounds: int = 60) -> Plan:
    """``plan`` with per-segment memory policies so that it fits ``plan.memory_bytes``.

    Returns ``plan`` unchanged when it fits already. Raises :class:`InfeasibleError` when no
    combination of the allowed policies makes it fit, and :class:`UsageError` for an unknown
    ``mode`` (see ``outcore.plan.policies.CHOICES``).
    """
    return choose_simulated(g, plan, mode=mode, cluster=cluster, max_rounds=max_rounds)[0]


def choose_simulated(g: Graph, plan: Plan, *, mode: str = "auto", cluster: Cluster,
                     max_rounds: int = 60, margin: float = 0.005,
                     give_up_above_s: float | None = None, checked: bool = True):
    """:func:`choose`, also returning the simulation of the returned plan.

    Each round prices the options of every overflowing device once (they depend only on the
    placement, so they are cached across rounds), applies on every overflowing device the
    cheapest per byte it frees at that device's simulated peak (its piece's micro-batches held
    there: :func:`_held_at_peak`) until those bytes exceed its overflow by ``margin`` of the
    limit, and simulates once: a handful of simulations instead of one per device and round. The
    options a round took on a device whose simulated peak they did not lower are undone (and
    not tried again; checkpointing a segment whose recompute outweighs what it frees).

    With ``give_up_above_s``, a plan whose simulation without policies, or with the policies
    of a round, already takes that long is returned as it is (not fitting): policies only add
    time (recompute, copies), and each round keeps the last one's, so it cannot beat a plan of
    that time (branch and bound for the search). ``checked``: check each simulated schedule
    (:func:`outcore.sim.simulate.simulate`).
    """
    if mode not in CHOICES:
        raise UsageError(f"unknown memory policy {mode!r}: use {', '.join(CHOICES)}")
    limit = plan.memory_bytes
    sim = simulate(plan, g, cluster=cluster, checked=checked)
    if not limit or sim.fits:
        return plan, sim
    if give_up_above_s is not None and sim.iteration_s >= give_up_above_s:
        return plan, sim
    if mode == "none":
        raise _too_big(sim.peak_bytes, limit, f"{NO_POLICY} (--memory-policy "
                                              "none): allow auto, or add devices")
    group_of = np.full(g.num_nodes, -1, dtype=np.int64)
    policies: list[str] = []
    used = np.zeros(g.num_nodes, dtype=bool)
    priced: dict[int, _Priced] = {}
    kept: dict[int, list[tuple[np.ndarray, float]]] = {}  # per device, (segment, bytes freed)
    current = plan
    for _ in range(max_rounds):
        over = [int(d) for d in np.argsort(-sim.peak_bytes, kind="stable")
                if sim.peak_bytes[d] > limit]
        if not over:
            return _trimmed(g, plan, (current, sim), group_of, policies, kept,
                            limit * (1 - margin), cluster, checked)
        taken: dict[int, list[np.ndarray]] = {}  # per device, the segments this round takes
        held = _held_at_peak(sim)
        for d in over:
            if d not in priced:
                priced[d] = _Priced(options(g, plan.assignment, [d], mode, cluster,
                                            plan.optimizer))
            cands = priced[d].unused(used)
            if not cands.size:
                raise _too_big(sim.peak_bytes, limit, f"even with every allowed memory "
                                                      f"policy ({mode}) device {d} does not "
                                                      "fit: add devices or raise --memory")
            need = sim.peak_bytes[d] - limit + margin * limit
            for o, frees in _take(_by_price(priced[d], cands, held, sim, d,
                                            plan.microbatches), used, need):
                group_of[o.nodes] = len(policies)
                policies.append(o.policy)
                taken.setdefault(d, []).append(o.nodes)
                kept.setdefault(d, []).append((o.nodes, frees))
        trial = plan.replace(policies=_compact(group_of, policies))
        after = simulate(trial, g, cluster=cluster, checked=checked)
        worse = [d for d in taken if after.peak_bytes[d] >= sim.peak_bytes[d]]
        if worse:  # undone on a device whose peak they did not lower (not tried again)
            for d in worse:
                group_of[np.concatenate(taken[d])] = -1
                del kept[d][-len(taken[d]):]
            if len(worse) == len(taken):  # back where the round started: nothing to simulate
                continue
            trial = plan.replace(policies=_compact(group_of, policies))
            after = simulate(trial, g, cluster=cluster, checked=checked)
        current, sim = trial, after
        if give_up_above_s is not None and not sim.fits and sim.iteration_s >= give_up_above_s:
            return current, sim
    if sim.fits:
        return current, sim
    raise _too_big(sim.peak_bytes, limit, "memory policies did not converge: add devices")


def _take(ranked: list[tuple[_Option, float]], used: np.ndarray, need: float
          ) -> list[tuple[_Option, float]]:
    """``(option, bytes)`` from ``ranked`` in order until the bytes reach ``need``, one option
    per segment; their nodes are marked in ``used``."""
    out: list[tuple[_Option, float]] = []
    freed = 0.0
    for o, frees in ranked:
        if used[o.nodes].any():  # another option of the same segment was taken
            continue
        used[o.nodes] = True
        out.append((o, frees))
        freed += frees
        if freed >= need:
            break
    return out


def _trimmed(g: Graph, plan: Plan, fitted: tuple, group_of: np.ndarray, policies: list[str],
             kept: dict[int, list[tuple[np.ndarray, float]]], target: float, cluster: Cluster,
             checked: bool) -> tuple:
    """``fitted`` (plan, simulation), or that plan without the options last taken on each
    device that its room under ``target`` covers (their estimated bytes), when the simulator
    finds that it still fits and is faster: a round's options can free more than it needed
    (one more simulation)."""
    current, sim = fitted
    trial_groups = group_of.copy()
    dropped = 0
    for d, rows in kept.items():
        room = target - float(sim.peak_bytes[d])
        for nodes, frees in reversed(rows):
            if frees <= room:
                trial_groups[nodes] = -1
                room -= frees
                dropped += 1
    if not dropped:
        return current, sim
    trial = plan.replace(policies=_compact(trial_groups, policies))
    after = simulate(trial, g, cluster=cluster, checked=checked)
    if after.fits and after.iteration_s < sim.iteration_s:
        return trial, after
    return current, sim


def _held_at_peak(sim) -> tuple[np.ndarray, ...]:
    """Per rank of a simulation, per piece of its schedule: how many micro-batches' saved
    activations the rank holds at its peak (forward ended, backward not yet)."""
    n_pieces = sim.schedule.pieces.num_pieces
    c = sim.timeline.columns()
    sel = c["fb"] & (c["piece"] >= 0)
    rank, piece, end = c["rank"][sel], c["piece"][sel], c["end_s"][sel]
    step = np.where(c["forward"][sel], 1, -1)
    out = []
    for r, (times, values) in enumerate(sim.timeline.memory):
        held = np.zeros(n_pieces, dtype=np.int64)
        if len(values):
            t = float(np.asarray(times)[int(np.argmax(values))])
            sel = (rank == r) & (end <= t)
            np.add.at(held, piece[sel].astype(np.int64), step[sel].astype(np.int64))
        out.append(held)
    return tuple(out)


class _Priced:
    """One device's options that free bytes (of :func:`options`) and, as arrays, what ranking
    them reads: each one's first node, whether it offloads parameters, the bytes it frees, its
    cost, its key."""

    def __init__(self, opts: list[_Option]) -> None:
        self.opts = opts = [o for o in opts if o.freed_bytes > 0]
        self.first = np.array([int(o.nodes[0]) for o in opts], np.int64)
        self.params = np.array([o.policy == "offload-params" for o in opts], bool)
        self.freed = np.array([o.freed_bytes for o in opts], np.float64)
        self.cost = np.array([o.cost_s for o in opts], np.float64)
        self.key = np.array([o.key for o in opts], np.int64)

    def unused(self, used: np.ndarray) -> np.ndarray:
        """Indices of the options none of whose nodes is ``used`` (a segment's nodes are
        taken together: its first one tells)."""
        return np.flatnonzero(~used[self.first])


def _by_price(priced: _Priced, cands: np.ndarray, held: tuple[np.ndarray, ...], sim, d: int,
              microbatches: int) -> list[tuple[_Option, float]]:
    """``(option, bytes it frees at device d's simulated peak)`` of the options ``cands``
    (indices into ``priced``), cheapest per byte first (ties: the first node, then the order
    of the options).

    An activation option frees its bytes once per micro-batch whose activations its piece
    holds at the peak (none: it does not lower this peak); a parameter option frees its bytes
    once. Options that free nothing at the peak come last, counted at every micro-batch in
    flight (the peak may move to where they do)."""
    live = held[d] if d < len(held) else np.zeros(0, np.int64)
    piece = sim.schedule.pieces.piece_of[priced.first[cands]]
    count = np.zeros(cands.size, np.int64)
    inside = piece < live.size
    count[inside] = np.maximum(0, live[piece[inside]])
    freed = priced.freed[cands]
    frees = np.where(priced.params[cands], freed, freed * count)
    per = np.where(frees != 0, frees, freed)  # what the price divides by
    order = np.lexsort((priced.key[cands], priced.cost[cands] / per, frees <= 0))
    last = np.where(frees != 0, frees, freed * max(1, microbatches))
    return [(priced.opts[k], v) for k, v in zip(cands[order].tolist(), last[order].tolist())]


def _compact(group_of: np.ndarray, policies: list[str]) -> MemoryPolicies:
    """The policies of the groups that still have nodes, renumbered in order."""
    kept = np.unique(group_of[group_of >= 0])
    renumber = np.full(len(policies) + 1, -1, dtype=np.int64)
    renumber[kept] = np.arange(kept.size)
    return MemoryPolicies(renumber[group_of], tuple(policies[k] for k in kept.tolist()))


def _too_big(peaks: np.ndarray, limit: float, fix: str) -> InfeasibleError:
    d = int(np.argmax(peaks))
    return InfeasibleError(f"device {d} needs {format_bytes(peaks[d])}, limit "
                           f"{format_bytes(limit)}; {fix}", need_bytes=float(peaks[d]))
