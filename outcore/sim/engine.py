"""Discrete-event simulation of a schedule on a cluster.

Each rank runs its action list in order on one compute stream. Sends are asynchronous: a message
leaves when its send is reached, queues for the sender's and receiver's ports (one transfer at a
time per port and direction: per-link contention) and arrives ``latency + bytes / bandwidth``
later; a receive blocks the rank until its message has arrived. ``AR`` is a collective: it starts
when every member has reached it. Data-parallel replicas (``dp > 1``) are not simulated one by
one: each piece's gradients are all-reduced on a separate stream as soon as its last backward
ends (overlapped, as DDP's buckets are), and the optimizer step waits for them. On a cluster
that holds every copy, the cost follows where the peers sit (``outcore.hardware.collectives``:
two-level by default) and the inter-node phases of a node's ranks take turns on its network
port (pipeline sends are not slowed by them); otherwise it is a flat ring over one link.

Memory per rank: parameters and optimizer state throughout; a piece's saved activations from its
forward until its backward of the same micro-batch; received activations and gradients from
their receive's post (``RECV_POST_AHEAD`` actions before it, or with an earlier message of
the same peer: :func:`~outcore.sim.model.post_positions`, as the runtime posts them) until
the gradients of those activations are sent / the consuming backward ends; one working buffer
during each compute; the gradients of a piece's received inputs from its backward until they
are sent (same-host sockets copy them out in the send call), or until the step ends (the
runtime waits on gloo and NCCL sends at the end of the step, and they free nothing before).
"""

from __future__ import annotations

import heapq

import numpy as np

from outcore.errors import ScheduleError
from outcore.graph.jit import HAVE_NUMBA
from outcore.hardware.collectives import dp_allreduce as dp_phases, ring_allreduce_s
from outcore.hardware.spec import COLD_START_FRACTION, COLD_START_IDLE_S, Cluster, LinkSpec
from outcore.schedule.costs import PieceCosts
from outcore.schedule.ir import Action, Schedule
from outcore.sim.compiled import simulate_compiled
from outcore.sim.model import (
    SimOptions,
    ar_buffer_bytes,
    grad_bytes,
    held_at_start,
    link_ports,
    pair_recv_bytes,
    paired_buckets,
    post_positions,
)
from outcore.trace import Event, Timeline


def simulate_schedule(s: Schedule, costs: PieceCosts, cluster: Cluster,
                      options: SimOptions = SimOptions()) -> Timeline:
    """Run ``s`` in simulated time and return its :class:`Timeline` (on the compiled loop,
    :mod:`outcore.sim.compiled`, when numba is installed; :class:`_Engine` is the reference)."""
    if HAVE_NUMBA:
        tl = simulate_compiled(s, costs, cluster, options)
        if tl is not None:
            return tl
    return _Engine(s, costs, cluster, options).run()


class _Engine:
    def __init__(self, s: Schedule, costs: PieceCosts, cluster: Cluster, opt: SimOptions):
        self.s, self.c, self.cluster, self.opt = s, costs, cluster, opt
        R = s.num_ranks
        self.pc = [0] * R
        self.reached: list[list[float]] = [[] for _ in range(R)]  # when each action was reached
        self.events: list[Event] = []
        # gradients: made by each piece's first backward of the step, freed once the
        # optimizer has stepped (the rest of the static state stays)
        self.grads = grad_bytes(s, costs)
        self.post = post_positions(s)
        self.grads_live = [0.0] * R
        self.grads_made: set[int] = set()
        self.mem: list[list[tuple[float, float]]] = [
            [(0.0, held)] for held in held_at_start(s, costs, self.grads)]
        self.arrival: dict[tuple[int, str, int], float] = {}
        self.waiting: dict[tuple[int, str, int], int] = {}
        self.blocked_since: dict[int, float] = {}
        self.port_out: dict[object, float] = {}
        self.port_in: dict[object, float] = {}
        self.ar_arrived: dict[int, dict[int, float]] = {}
        self.paired = paired_buckets(s, cluster, opt)
        self.pair_recv = pair_recv_bytes(s, self.paired, opt)
        self.ar_end: dict[int, float] = {}
        self.ar_free = [0.0] * R
        self.ar_waiters: dict[int, list[int]] = {}
        # received bytes to free: ("F", transfer, mb) at the gradients' send; gradients
        # received or handed on by a piece of the same rank, (piece, mb) at the piece's backward
        self.held: dict[tuple, float] = {}
        # per piece, the gradients of its inputs from other pieces (made by its backward, then
        # sent, or held for a piece of its own rank)
        # per piece and transfer, as Python numbers (the main loop reads them per action)
        self.fwd, self.bwd = costs.fwd_s.tolist(), costs.bwd_s.tolist()
        self.work_f, self.work_b = costs.transient_bytes.tolist(), costs.bwd_transient.tolist()
        self.saved = costs.saved_bytes.tolist()
        self.fwd_held = costs.fwd_held.tolist() if costs.fwd_held is not None \
            else [0.0] * len(self.saved)
        self.tbytes = np.asarray(costs.transfer_bytes, np.float64).tolist()
        self.last_b = {}
        for r, acts in enumerate(s.actions):
            for a in acts:
                if a.op == "B":
                    self.last_b[a.piece] = a.mb  # last backward of each piece in rank order
        self.in_grad = [0.0] * len(s.pieces.pieces)
        # per piece, the gradients it hands to pieces of its own rank (that have a backward),
        # held until their backward: (source piece, bytes)
        self.local_grads: list[list[tuple[int, float]]] = [[] for _ in s.pieces.pieces]
        for tr in s.pieces.transfers:
            if not tr.local:
                self.in_grad[tr.dst] += self.tbytes[tr.id]
            elif tr.src in self.last_b:
                self.local_grads[tr.dst].append((tr.src, self.tbytes[tr.id]))
        # summed into one gradient per tensor: at most the piece's outputs others take
        self.grad_cap = (costs.out_grad_cap.tolist() if costs.out_grad_cap is not None
                         else [np.inf] * len(s.pieces.pieces))
        self.grad_held: dict[tuple[int, int], float] = {}
        self._ports: dict[tuple[int, int], tuple[object, object, LinkSpec]] = {}
        self.dp_free = [0.0] * R
        # (node, port) -> when the data-parallel traffic through that network port ends
        self.dp_port: dict[tuple[int, int], float] = {}
        self.pieces_left = [0] * R  # per rank: pieces whose last backward is still to run
        for piece in self.last_b:
            self.pieces_left[s.pieces.pieces[piece].device] += 1
        self.queue: list[tuple[float, int, int, int]] = []
        # ranks sharing ``cores`` host cores (local CPU workers): computes share them equally
        self.cores = cluster.host_cores
        self.active: dict[int, list] = {}  # rank -> [action, start, remaining work, version]
        # per rank, the version of its last queued end: a rank's next compute continues the
        # count, so an end its previous compute left queued can never pass for the new one's
        self.version = [0] * R
        self.last_change = 0.0
        self.seq = 0
        self.finish = [0.0] * R
        self.sent_grads = [0.0] * R  # gradient bytes a rank has sent, held until its step ends
        # the step's synchronisation at OPT: when each rank reached it, and when it ends
        self.sync_ranks = sum(any(a.op == "OPT" for a in acts) for acts in s.actions)
        self.sync_at: dict[int, float] = {}
        self.sync_end: float | None = None
        # when each rank's last compute ended (a compute after a wait starts cold)
        self.warm_until = [-np.inf] * R
        self.cold_s = cluster.device.cold_start_s if cluster.device.host_is_device else 0.0

    # ------------------------------------------------------------------ helpers
    def wake(self, r: int, t: float) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (t, self.seq, r, -1))

    def ports(self, a: int, b: int) -> tuple[object, object, LinkSpec]:
        found = self._ports.get((a, b))
        if found is None:
            found = self._ports[a, b] = link_ports(self.cluster, a, b)
        return found

    def cold(self, r: int, t: float, dur: float) -> float:
        """Extra seconds of a compute of ``dur`` starting at ``t`` on rank ``r``: re-warming
        the core after a wait (``DeviceSpec.cold_start_s``; the step's first compute follows
        the step's start, which the runtime's ranks wait for)."""
        if self.cold_s <= 0 or t - self.warm_until[r] <= COLD_START_IDLE_S:
            return 0.0
        return min(COLD_START_FRACTION * dur, self.cold_s)

    def add_mem(self, r: int, t: float, delta: float) -> None:
        if delta:
            self.mem[r].append((t, delta))

    # ------------------------------------------------------------------ main loop
    def run(self) -> Timeline:
        s = self.s
        for r in range(s.num_ranks):
            self.wake(r, self.opt.step_host_s)
        while self.queue:
            t, _, r, version = heapq.heappop(self.queue)
            if version >= 0:
                self._done_shared(r, version, t)
            else:
                self.step(r, t)
        unfinished = [f"rank {r} at {s.actions[r][self.pc[r]]}" for r in range(s.num_ranks)
                      if self.pc[r] < len(s.actions[r])]
        if unfinished:
            raise ScheduleError("the schedule deadlocks in simulation: " +
                                "; ".join(unfinished[:6]))
        iteration = max([self.finish[r] for r in range(s.num_ranks)] + [0.0])
        for r in range(s.num_ranks):
            self.add_mem(r, self.finish[r], -self.sent_grads[r])
        memory = []
        for r in range(s.num_ranks):
            deltas = sorted(self.mem[r], key=lambda x: x[0])
            times = np.array([d[0] for d in deltas])
            values = np.cumsum([d[1] for d in deltas])
            memory.append((times, values))
        events = tuple(sorted(self.events, key=lambda e: (e.start_s, e.rank, e.stream)))
        limit = self.cluster.device.memory_bytes
        return Timeline(s.num_ranks, events, iteration, tuple(memory),
                        limit if np.isfinite(limit) else None, "simulated",
                        {"schedule": s.kind, "microbatches": s.microbatches, "dp": self.opt.dp})

    def step(self, r: int, t: float) -> None:
        """Run rank ``r``'s actions from time ``t`` until it blocks or finishes."""
        acts = self.s.actions[r]
        reached = self.reached[r]
        while self.pc[r] < len(acts):
            a = acts[self.pc[r]]
            if len(reached) == self.pc[r]:
                reached.append(t)
            nxt = self.execute(r, a, t)
            if nxt is None:  # blocked; someone will wake us
                return
            if nxt > t:
                self.pc[r] += 1
                self.finish[r] = nxt
                self.wake(r, nxt)
                return
            self.pc[r] += 1
            self.finish[r] = max(self.finish[r], t)

    def execute(self, r: int, a: Action, t: float) -> float | None:
        """Perform ``a`` at ``t``; return when the rank is free again, or None if blocked."""
        if a.op in ("F", "B"):
            dur = self.fwd[a.piece] if a.op == "F" else self.bwd[a.piece]
            dur += self.cold(r, t, dur)
            if self.cores is not None:  # ranks share host cores: the end depends on others
                self._start_shared(r, a, t, dur)
                return None
            return self._finish_compute(r, a, t, t + dur)
        return self._execute_other(r, a, t)

    def _finish_compute(self, r: int, a: Action, t: float, end: float) -> float:
        """Account a forward or backward that ran from ``t`` to ``end``."""
        self.warm_until[r] = end
        self.events.append(Event(r, a.op, str(a), t, end, "compute", a.mb, a.piece))
        work = self.work_f[a.piece] if a.op == "F" else self.work_b[a.piece]
        if a.op == "B" and a.piece not in self.grads_made and self.c.first_bwd_extra is not None:
            work += float(self.c.first_bwd_extra[a.piece])  # the .grad tensors made so far
        self.add_mem(r, t, work)
        self.add_mem(r, end, -work)
        if a.op == "F":  # what it saves, and its outputs waiting for later pieces
            self.add_mem(r, end, self.saved[a.piece] + self.fwd_held[a.piece])
        else:  # the gradients of its received inputs stay until they are sent
            self.add_mem(r, end, self.in_grad[a.piece] - self.saved[a.piece]
                         - self.held.pop((a.piece, a.mb), 0.0))
            self.grad_held.pop((a.piece, a.mb), None)
            handed = 0.0
            for src, nbytes in self.local_grads[a.piece]:
                key = (src, a.mb)
                now = self.grad_held.get(key, 0.0)
                add = min(nbytes, self.grad_cap[src] - now)
                if add > 0:
                    self.grad_held[key] = now + add
                    self.held[key] = self.held.get(key, 0.0) + add
                    handed += add
            if handed:
                self.add_mem(r, end, handed)
            if a.piece not in self.grads_made:  # its parameters' .grad, until the step
                self.grads_made.add(a.piece)
                self.add_mem(r, end, float(self.grads[a.piece]))
                self.grads_live[r] += float(self.grads[a.piece])
            if self.opt.dp > 1 and self.last_b.get(a.piece) == a.mb:
                self.pieces_left[r] -= 1
                if not self.opt.dp_fused:
                    self.dp_allreduce(r, a.piece, end, t)
                elif self.pieces_left[r] == 0:
                    self.dp_allreduce(r, None, end, end)
        return end

    # ------------------------------------------------------------------ shared host cores
    def _rate(self, n_active: int) -> float:
        assert self.cores is not None  # only ranks that share host cores have a rate
        return min(1.0, self.cores / n_active) if n_active else 1.0

    def _advance(self, t: float) -> None:
        """Progress every running compute from the last change to ``t`` at the shared rate."""
        rate = self._rate(len(self.active))
        dt = t - self.last_change
        for job in self.active.values():
            job[2] = max(job[2] - dt * rate, 0.0)
        self.last_change = t

    def _reschedule(self, t: float) -> None:
        rate = self._rate(len(self.active))
        for r, job in self.active.items():
            job[3] += 1
            self.version[r] = job[3]
            self.seq += 1
            heapq.heappush(self.queue, (t + job[2] / rate, self.seq, r, job[3]))

    def _start_shared(self, r: int, a: Action, t: float, dur: float) -> None:
        self._advance(t)
        self.active[r] = [a, t, dur, self.version[r]]
        self._reschedule(t)

    def _done_shared(self, r: int, version: int, t: float) -> None:
        job = self.active.get(r)
        if job is None or job[3] != version:
            return  # superseded by a later rate change
        self._advance(t)
        del self.active[r]
        self._finish_compute(r, job[0], job[1], t)
        self._reschedule(t)
        self.pc[r] += 1
        self.finish[r] = t
        self.step(r, t)

    def _execute_other(self, r: int, a: Action, t: float) -> float | None:
        c, s = self.c, self.s
        dev = self.cluster.device
        if a.op in ("SF", "SB"):  # the send call's host time, then the message leaves
            t += dev.send_overhead_s + dev.send_byte_s * self.tbytes[a.transfer]
            self.send(r, a, t)
            return t
        if a.op in ("RF", "RB"):
            key: tuple = (a.transfer, a.op[1], a.mb)
            arrive = self.arrival.get(key)
            if arrive is None:
                self.waiting[key] = r
                self.blocked_since.setdefault(r, t)
                return None
            tr = s.pieces.transfers[a.transfer]
            nbytes = self.tbytes[a.transfer]
            since = self.blocked_since.pop(r, t)
            if arrive > since:  # the rank waits for this message
                self.events.append(Event(r, "recv", str(a), since, arrive, "comm", a.mb, -1,
                                         int(nbytes), s.peer(r, a)))
            # the buffer exists from the receive's post (model.post_positions)
            self.add_mem(r, self.reached[r][int(self.post[r][self.pc[r]])], nbytes)
            # activations are dropped when their gradients are sent; gradients after the
            # backward that consumes them
            done = max(t, arrive) + dev.recv_overhead_s + dev.recv_byte_s * nbytes
            if a.op == "RF":
                key = ("F", a.transfer, a.mb)
                self.held[key] = self.held.get(key, 0.0) + nbytes
                return done
            # gradients: summed into the one held per tensor of the producing piece (at most
            # its outputs others take); the rest of the buffer goes once read
            key = (tr.src, a.mb)
            now = self.grad_held.get(key, 0.0)
            keep = max(min(nbytes, self.grad_cap[tr.src] - now), 0.0)
            self.grad_held[key] = now + keep
            self.held[key] = self.held.get(key, 0.0) + keep
            if nbytes > keep:
                self.add_mem(r, done, keep - nbytes)
            return done
        if a.op == "AR":
            return self.collective(r, a, t)
        # OPT: wait for this rank's all-reduces (shared parameters, replicas, data parallel)
        pending = [b for b, grp in enumerate(s.buckets) if r in grp and b not in self.ar_end]
        if pending:
            self.ar_waiters.setdefault(pending[0], []).append(r)
            return None
        done = [self.ar_end[b] for b, grp in enumerate(s.buckets) if r in grp]
        start = max([t, self.dp_free[r]] + done)
        if self.opt.step_sync_s > 0 and self.sync_ranks > 1:
            if self.sync_end is None:
                self.sync_at[r] = start
                if len(self.sync_at) < self.sync_ranks:
                    return None  # the last rank to arrive wakes the others
                self.sync_end = max(self.sync_at.values()) + self.opt.step_sync_s
                for w in self.sync_at:
                    if w != r:
                        self.wake(w, self.sync_end)
            start = max(start, self.sync_end)
        if self.pair_recv[r]:  # waiting for the sums: a peer's half read, added, freed
            self.add_mem(r, start, self.pair_recv[r])
            self.add_mem(r, start, -self.pair_recv[r])
        work = float(c.param_bytes[r]) * self.opt.optimizer_transient
        if work:
            self.add_mem(r, start, work)
        tensors = float(c.param_tensors[r]) if c.param_tensors is not None else 0.0
        dur = self.opt.optimizer_s(float(c.param_bytes[r]), tensors,
                                   self.cluster.device.mem_bandwidth)
        dur += self.cold(r, start, dur)
        self.warm_until[r] = start + dur
        self.events.append(Event(r, "optim", "OPT", start, start + dur, "compute"))
        if work:
            self.add_mem(r, start + dur, -work)
        if self.grads_live[r]:  # zero_grad(set_to_none=True)
            self.add_mem(r, start + dur, -self.grads_live[r])
            self.grads_live[r] = 0.0
        return start + dur if start + dur > t else t

    def send(self, r: int, a: Action, t: float) -> None:
        dst = self.s.peer(r, a)
        nbytes = self.tbytes[a.transfer]
        out_port, in_port, link = self.ports(r, dst)
        start = max(t, self.port_out.get(out_port, 0.0), self.port_in.get(in_port, 0.0))
        busy = nbytes / link.bandwidth
        self.port_out[out_port] = start + busy
        self.port_in[in_port] = start + busy
        arrive = start + link.latency_s + busy
        if a.op == "SB":  # the activations received for these gradients go
            self.add_mem(r, t, -self.held.pop(("F", a.transfer, a.mb), 0.0))
            if link.copy_on_send:  # the gradients too: copied out in the send call
                self.add_mem(r, t, -nbytes)
            else:  # the runtime keeps a sent gradient until its end-of-step flush
                self.sent_grads[r] += nbytes
        self.events.append(Event(r, "send", str(a), start, arrive, "comm", a.mb, -1, int(nbytes),
                                 dst))
        key = (a.transfer, a.op[1], a.mb)
        self.arrival[key] = arrive
        waiter = self.waiting.pop(key, None)
        if waiter is not None:
            self.wake(waiter, arrive)

    def collective(self, r: int, a: Action, t: float) -> float:
        """Launch an all-reduce; it runs on the comm streams once every member launched it."""
        group = self.s.buckets[a.bucket] if a.bucket < len(self.s.buckets) else (r,)
        arrived = self.ar_arrived.setdefault(a.bucket, {})
        arrived[r] = t
        held = ar_buffer_bytes(self.opt, a.bucket)
        if held:  # the gradients copied into the flat bucket, then dropped: the sums come
            self.add_mem(r, t, held)  # back as views of it
            self.add_mem(r, t, -held)
        if len(arrived) == len(group):
            # one collective stream per rank: shared-parameter and data-parallel all-reduces
            # take turns (the data-parallel sum must include the replicas' anyway)
            start = max(max(arrived.values()),
                        max(max(self.ar_free[m], self.dp_free[m]) for m in group))
            nbytes = self.opt.bucket_bytes[a.bucket] if a.bucket < len(self.opt.bucket_bytes) \
                else 0.0
            link = self.cluster.link(min(group), max(group))
            ring = self.opt.bucket_ring[a.bucket] if a.bucket < len(self.opt.bucket_ring) \
                else 0  # a sharded bucket: its shards, over the groups that hold copies
            if a.bucket in self.paired:  # one message each way over the pair's own link
                dev = self.cluster.device
                end = start + link.latency_s + dev.send_overhead_s + dev.recv_overhead_s + \
                    nbytes / link.bandwidth
            else:
                end = start + ring_allreduce_s(nbytes, ring or len(group), link)
            self.ar_end[a.bucket] = end
            for member in group:
                self.ar_free[member] = end
                self.dp_free[member] = max(self.dp_free[member], end)
                self.events.append(Event(member, "allreduce", str(a), start, end, "comm",
                                         bytes=int(nbytes)))
            for w in self.ar_waiters.pop(a.bucket, []):
                self.wake(w, end)
        return t

    def dp_allreduce(self, r: int, piece: int | None, t: float, b_start: float) -> None:
        """Overlapped data-parallel all-reduce of one piece's gradients (``None``: all of the
        rank's) over ``dp`` copies (its last backward ran from ``b_start`` to ``t``)."""
        share = float(self.c.param_bytes[r] if piece is None else
                      self.c.piece_param_bytes[piece])
        ph = dp_phases(self.cluster, self.s.num_ranks, self.opt.dp, r, share,
                       self.opt.dp_collective, self.opt.dp_link)
        bucket = self.opt.dp_bucket_bytes
        ready = t
        if 0 < bucket < share:  # the first bucket is ready part-way through the backward
            ready = t - (1 - bucket / share) * (t - b_start)
        start = max(ready, self.dp_free[r], self.ar_free[r])
        end = start + ph.intra_s
        if ph.node is not None:  # all-reduces through one network port take turns on it
            port = self.cluster.port_of(r)
            end = max(end, self.dp_port.get(port, 0.0))
            self.dp_port[port] = end + ph.inter_s
        end += ph.inter_s + ph.after_s
        if 0 < bucket < share:  # the last bucket leaves after the backward
            end = max(end, t + dp_phases(self.cluster, self.s.num_ranks, self.opt.dp, r,
                                         bucket, self.opt.dp_collective,
                                         self.opt.dp_link).total_s)
        self.dp_free[r] = self.ar_free[r] = end
        if end > start:
            self.events.append(Event(r, "allreduce", f"DP{'' if piece is None else piece}",
                                     start, end, "comm", piece=-1 if piece is None else piece,
                                     bytes=int(share)))
