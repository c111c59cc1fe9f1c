"""Point-to-point messages between ranks over torch.distributed (gloo or NCCL).

A message is the tensors of one transfer for one micro-batch, forward (activations) or backward
(gradients). Receivers know every message's shapes from the value metas, so buffers are
preallocated and nothing but tensor data crosses the wire. Every send and receive is
asynchronous (``isend``/``irecv``); a receive is waited on only when its data is needed, and
every wait has a timeout.

Messages between a pair of ranks are received in the order the sender sends them (the receiver
posts receives ahead, in the sender's order), which NCCL requires and gloo tolerates; gloo also
gets a distinct tag per message.

A message of several small tensors, and a run of consecutive sends of one rank to one peer,
travel as one flat byte buffer (``PACK_MAX_BYTES``): each point-to-point operation costs a
fixed host time (gloo: a lock, a socket write, a thread wake-up at the receiver; measured in
BENCHMARKS.md) that dwarfs copying a few KiB. Everything a message needs (metas,
tags, pack layout, grouping) is computed once per schedule.

Between two CPU ranks on one host (gloo backend) messages skip gloo altogether and travel over
a Unix-domain socket (:mod:`outcore.core.samehost`: ~6 us one way against gloo's ~75-140 us
here); ``OUTCORE_P2P=gloo`` turns that off. Collectives stay on the process groups.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from outcore.core.samehost import SameHostLinks, connect_same_host
from outcore.core.values import LeafMeta
from outcore.errors import RuntimeFailure
from outcore.hardware.spec import SAME_HOST_SUM_MAX_RANKS
from outcore.schedule.ir import Schedule

log = logging.getLogger(__name__)

MsgKey = tuple[int, str, int]  # (transfer, "F" | "B", micro-batch)

# a message of several tensors whose total is at most this travels as one packed buffer
PACK_MAX_BYTES = 1 << 18
_ALIGN_BYTES = 16  # packed tensors start at multiples of this (any dtype can view its slice)


def allreduce_into(tensors: list[torch.Tensor], group: Any, divide_by: int = 1) -> None:
    """Sum ``tensors`` over ``group`` in place (divided by ``divide_by``: an average), as one
    flat all-reduce instead of one per tensor."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    if divide_by != 1:
        flat /= divide_by
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


# gloo's worker thread marks a collective done, which wakes the waiting rank, and only then drops
# its own references to the collective's tensors: on a busy core the rank runs on while that
# thread waits for the core, so a buffer the program has finished with stays allocated for a
# while (measured: a spatial stage's peak once 7.7 % over the model's, two scatter parts and the
# received tile; a tile rank's 4.3 %, the received tile). Settling waits at most this long: with
# two other busy processes on the 2 cores, 20 ms left a sharded rank's reduce-scatter buffer
# alive into its next piece, 0.6 % over its limit.
_SETTLE_S = 0.2


@contextlib.contextmanager
def settled(*tensors: torch.Tensor):
    """Run a blocking CPU collective over ``tensors`` inside; on leaving, wait (yielding the
    core, at most ``_SETTLE_S``) until the communication library holds none of them any more, so
    their memory is freed where the program drops them (and a measured peak is the program's).
    No effect on CUDA tensors."""
    cpu = [t for t in tensors if t.device.type == "cpu"]
    held = [t._use_count() for t in cpu]
    yield
    pending = [(t, n) for t, n in zip(cpu, held) if t._use_count() > n]
    deadline = time.perf_counter() + _SETTLE_S
    while pending and time.perf_counter() < deadline:
        os.sched_yield()
        pending = [(t, n) for t, n in pending if t._use_count() > n]


class _Layout:
    """How one message travels: its tensor metas, and whether and where they sit packed."""

    __slots__ = ("has_bool", "metas", "offsets", "packed", "total_bytes", "wire_dtypes")

    def __init__(self, metas: list[LeafMeta]):
        self.metas = metas
        self.wire_dtypes = [torch.uint8 if m.dtype == torch.bool else m.dtype for m in metas]
        self.has_bool = any(m.dtype == torch.bool for m in metas)
        offsets, total = [], 0
        for m, dt in zip(metas, self.wire_dtypes):
            total = -(-total // _ALIGN_BYTES) * _ALIGN_BYTES
            offsets.append(total)
            n = 1
            for d in m.shape:
                n *= d
            total += n * dt.itemsize
        self.offsets, self.total_bytes = offsets, total
        self.packed = len(metas) > 1 and total <= PACK_MAX_BYTES

    def pack(self, tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        buf = torch.empty(self.total_bytes, dtype=torch.uint8, device=device)
        for t, off, dt in zip(tensors, self.offsets, self.wire_dtypes):
            n = t.numel() * dt.itemsize
            if n:
                buf[off:off + n].view(dt).view(t.shape).copy_(t.detach())
        return buf

    def unpack(self, buf: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for m, off, dt in zip(self.metas, self.offsets, self.wire_dtypes):
            n = 1
            for d in m.shape:
                n *= d
            out.append(buf[off:off + n * dt.itemsize].view(dt).view(m.shape).detach())
        return out

    def empty(self, device: torch.device) -> list[torch.Tensor]:
        if self.packed:
            return [torch.empty(self.total_bytes, dtype=torch.uint8, device=device)]
        return [torch.empty(m.shape, dtype=dt, device=device)
                for m, dt in zip(self.metas, self.wire_dtypes)]


def _wire_messages(schedule: Schedule, sender: int, layouts: dict[tuple[int, str], _Layout],
                   where: dict[MsgKey, int]) -> dict[int, list[tuple[MsgKey, ...]]]:
    """Per destination, the messages ``sender`` puts on the wire, in its order.

    A run of consecutive send actions of ``sender`` to one peer (no other action between them,
    so nothing waits for the earlier ones) whose receives are consecutive actions of the peer
    too (a part received early is memory held early, which the plan does not count: a tied
    weight's gradient packed with the first gradients a stage takes put it 13 % over its
    prediction) travels as one packed message when it fits in ``PACK_MAX_BYTES``; otherwise
    each send is its own message. Sender and receiver derive the same grouping from the
    schedule, so nothing but tensor data crosses the wire. ``where``: every receive's place
    among its receiver's actions (:func:`_receive_positions`).
    """
    out: dict[int, list[tuple[MsgKey, ...]]] = {}
    runs: list[tuple[int, list[MsgKey]]] = []
    for a in schedule.actions[sender]:
        if a.op not in ("SF", "SB"):
            runs.append((-1, []))
            continue
        dst, key = schedule.peer(sender, a), (a.transfer, a.op[1], a.mb)
        if runs and runs[-1][0] == dst and where.get(key) == where.get(runs[-1][1][-1], -2) + 1:
            runs[-1][1].append(key)
        else:
            runs.append((dst, [key]))
    for dst, keys in runs:
        if not keys:
            continue
        metas = [m for k in keys for m in layouts[(k[0], k[1])].metas]
        together = len(keys) > 1 and _Layout(metas).packed
        out.setdefault(dst, []).extend([tuple(keys)] if together else [(k,) for k in keys])
    return out


def _receive_positions(schedule: Schedule) -> dict[MsgKey, int]:
    """Per message key, the place of its receive among its receiver's actions."""
    return {(a.transfer, a.op[1], a.mb): k for acts in schedule.actions
            for k, a in enumerate(acts) if a.op in ("RF", "RB")}


# the tag of the per-step sums on same-host links (read after every data message of the step:
# a peer's messages arrive in its order)
_SUM_TAG = 0x7FFFFFFF
# the tags of a gradient bucket's sum between two linked processes (plus the bucket's number;
# only those sums and the per-step sums travel on such a link: Messenger.pair_peer)
_PAIR_SUM_TAG = 0x7FF00000


class PairSum:
    """A gradient bucket's all-reduce between two processes over their same-host link
    (:meth:`Messenger.start_pair_sum`). gloo's all-reduce between two CPU workers here took
    0.37-3.3 ms (median of 20) for 16 KiB-1 MiB, erratically (its I/O threads wait to be
    woken), 10-12 ms for 16 MiB; the exchange over the link 0.07-0.39 ms and 7.3-7.7 ms
    (``benchmarks/dp_pair_sum.py``)."""

    def __init__(self, links: SameHostLinks, peer: int, flat: torch.Tensor, tag: int,
                 what: str):
        self.links, self.peer, self.flat, self.tag, self.what = links, peer, flat, tag, what

    @classmethod
    def start(cls, links: SameHostLinks, peer: int, flat: torch.Tensor, tag: int,
              what: str) -> PairSum:
        """Send ``flat`` (contiguous, CPU) to ``peer`` at once; :meth:`wait` reads the
        peer's and adds."""
        links.send(peer, [flat], tag)
        return cls(links, peer, flat, tag, what)

    def wait(self) -> torch.Tensor:
        """The sum, in ``flat`` (as gloo's all-reduce leaves it): the peer's part read into
        a buffer and added once the kernel holds all of this one's (a sum of two is the same
        bits in either order, so both processes hold equal gradients; ``flat`` changes only
        once the link no longer reads from it)."""
        other = torch.empty_like(self.flat)
        self.links.recv_into(self.peer, [other], self.tag, self.what)
        self.links.flush(self.what)
        return self.flat.add_(other)


class Messenger:
    """Sends and receives one rank's messages for one schedule.

    Args:
        rank: this rank.
        schedule: the schedule (all ranks' action lists: send orders are read from it).
        leaf_metas: per message direction and transfer, the tensor metas of the message.
        device: where buffers live.
        timeout_s: longest wait for any message.
        use_tags: give each message its own tag (gloo); NCCL ignores tags.
        process_of: the process of a schedule rank (tensor parallelism: shard ``t`` of slot
            ``s`` talks to shard ``t`` of its peer slots); default: the same number.
        same_host: carry messages to peers on this host over Unix-domain sockets
            (:mod:`outcore.core.samehost`) instead of gloo; None (default): whenever the
            backend is gloo and the device the CPU. Collective: every rank constructs its
            Messenger at the same point.
    """

    def __init__(self, rank: int, schedule: Schedule,
                 leaf_metas: Callable[[int, str], list[LeafMeta]], device: torch.device,
                 timeout_s: float, use_tags: bool = True, step_of: Callable[[], int] = lambda: 0,
                 process_of: Callable[[int], int] = lambda r: r,
                 same_host: bool | None = None):
        self.rank = rank
        self.process_of = process_of
        self.s = schedule
        self.leaf_metas = leaf_metas
        self.device = device
        self.timeout = timedelta(seconds=timeout_s)
        self.use_tags = use_tags
        self.step_of = step_of
        # sends not yet waited on, as [work, tensor, key, dst]; by each key of their message
        self.pending_sends: list[list[Any]] = []
        self.sent_entries: dict[MsgKey, list[list[Any]]] = {}
        self.layouts = {(t.id, d): _Layout(list(leaf_metas(t.id, d)))
                        for t in schedule.pieces.transfers for d in ("F", "B")}
        max_leaves = max((len(lay.metas) for lay in self.layouts.values()), default=1)
        self.leaf_slots = max(max_leaves, 1)
        self.wire_layout: dict[tuple[MsgKey, ...], _Layout] = {}
        # sends: the wire message each of this rank's sends belongs to
        self.wire_of_send: dict[MsgKey, tuple[MsgKey, ...]] = {}
        where = _receive_positions(schedule)
        sends = _wire_messages(schedule, rank, self.layouts, where)
        for wires in sends.values():
            for w in wires:
                self._add_wire(w)
                self.wire_of_send.update((k, w) for k in w)
        self.stash: list[torch.Tensor] = []  # tensors of a wire message still being gathered
        # receives: per sending peer, the wire messages it sends us, in its order
        self.order: dict[int, list[tuple[MsgKey, ...]]] = {}
        for peer in range(len(schedule.actions)):
            if peer != rank:
                wires = _wire_messages(schedule, peer, self.layouts, where).get(rank)
                if wires:
                    self.order[peer] = wires
                    for w in wires:
                        self._add_wire(w)
        self.next_post = {peer: 0 for peer in self.order}
        self.index = {key: (peer, i) for peer, wires in self.order.items()
                      for i, w in enumerate(wires) for key in w}
        self.posted: dict[tuple[MsgKey, ...], tuple[list[Any], list[torch.Tensor]]] = {}
        self.ready: dict[MsgKey, list[torch.Tensor]] = {}  # arrived with an earlier key
        self.links: SameHostLinks | None = None
        if same_host is None:
            same_host = device.type == "cpu"
        world = dist.get_world_size() if dist.is_initialized() else 1
        # the processes this rank exchanges schedule messages with
        wired = {process_of(p) for p in self.order} | {process_of(d) for d in sends}
        if same_host:
            peers = set(wired)
            if world <= SAME_HOST_SUM_MAX_RANKS:  # every rank, for the per-step sums
                peers |= set(range(world))
            self.links = connect_same_host(peers, timeout_s)
        # the per-step sums go over the links when they reach every other process of the job
        self.sum_on_links = self.links is not None and len(self.links.socks) == world - 1
        # schedule rank -> its process, for the peers a same-host link reaches
        self.linked: dict[int, int] = {} if self.links is None else {
            r: process_of(r) for r in range(len(schedule.actions))
            if r != rank and self.links.has(process_of(r))}

        def plain(w: tuple[MsgKey, ...], peer: int) -> bool:  # one tensor, same host
            lay = self.wire_layout[w]
            return peer in self.linked and len(w) == 1 and len(lay.metas) == 1 \
                and not lay.has_bool

        # such messages skip the general bookkeeping, decided here: sends (peer process,
        # tag), receives (peer, its wire index, peer process, tag)
        self.direct = {w[0]: (self.linked[dst], self._tag(w[0], 0))
                       for dst, wires in sends.items() for w in wires if plain(w, dst)}
        self.direct_recv = {w[0]: (peer, i, self.linked[peer], self._tag(w[0], 0))
                            for peer, wires in self.order.items()
                            for i, w in enumerate(wires) if plain(w, peer)}
        self.read_next = {peer: 0 for peer in self.order}  # same-host: next wire to read

    def pair_peer(self, bucket: int) -> int | None:
        """The process to sum ``bucket`` with over the same-host link, or None (the
        backend's all-reduce): the schedule's pair for it (:meth:`Schedule.pair_partner`),
        when a link reaches that slot's process. Both processes decide alike."""
        other = self.s.pair_partner(bucket, self.rank) if self.links is not None else None
        if other is None:
            return None
        peer = self.process_of(other)
        return peer if self.links.has(peer) else None

    def start_pair_sum(self, peer: int, flat: torch.Tensor, bucket: int) -> PairSum:
        """Start summing ``flat`` (contiguous, CPU) with ``peer``'s over the same-host link
        (``peer`` from :meth:`pair_peer`)."""
        assert self.links is not None
        return PairSum.start(self.links, peer, flat, _PAIR_SUM_TAG + bucket,
                             f"all-reducing the gradients of bucket {bucket} with rank {peer} "
                             "(same-host link)")

    def sum_over_ranks(self, values: list[float],
                       what: str = "summing the step's checks") -> list[float]:
        """``values`` summed over every process of the job (a collective: each calls it once,
        after its step's last receive): over the same-host links when they reach every other
        process (:meth:`SameHostLinks.sum_all`), else the backend's all-reduce."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return list(values)
        if self.sum_on_links:
            assert self.links is not None
            return self.links.sum_all(torch.tensor(values, dtype=torch.float64), _SUM_TAG,
                                      what).tolist()
        summed = self._collective_tensor(values)
        dist.all_reduce(summed)
        return summed.tolist()

    def gather_over_ranks(self, values: list[float]) -> list[list[float]]:
        """Every process's ``values`` (the same length on each), in rank order (a collective,
        as :meth:`sum_over_ranks`; on the links, the sum of each rank's values placed in its
        own slot of zeros, which adds nothing to them)."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return [list(values)]
        world, rank, n = dist.get_world_size(), dist.get_rank(), len(values)
        if self.sum_on_links:
            slots = [0.0] * (world * n)
            slots[rank * n:(rank + 1) * n] = values
            summed = self.sum_over_ranks(slots, "gathering the step's figures")
            return [summed[r * n:(r + 1) * n] for r in range(world)]
        mine = self._collective_tensor(values)
        gathered = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
        return [g.tolist() for g in gathered]

    def _collective_tensor(self, values: list[float]) -> torch.Tensor:
        """``values`` as a tensor the backend's collectives take (NCCL: on this rank's GPU)."""
        return torch.tensor(values, dtype=torch.float64,
                            device=self.device if self.device.type == "cuda" else "cpu")

    def _add_wire(self, w: tuple[MsgKey, ...]) -> None:
        if len(w) == 1:
            self.wire_layout[w] = self.layouts[(w[0][0], w[0][1])]
        else:
            self.wire_layout[w] = _Layout([m for k in w for m in self.layouts[(k[0], k[1])].metas])

    def start_step(self) -> None:
        """Reset the per-step receive bookkeeping (every step repeats the same messages)."""
        if self.posted or self.ready or self.stash:
            raise RuntimeFailure(f"rank {self.rank}: {len(self.posted) + len(self.ready)} "
                                 "messages of the last step were never consumed (or a packed "
                                 "message never completed); the schedule is inconsistent")
        self.next_post = {peer: 0 for peer in self.order}
        self.read_next = {peer: 0 for peer in self.order}

    def _tag(self, key: MsgKey, leaf: int) -> int:
        if not self.use_tags:
            return 0
        t, d, m = key
        return (((t * 2 + (d == "B")) * self.s.microbatches + m) * self.leaf_slots + leaf) \
            & 0x7FFFFFFF

    def send(self, key: MsgKey, dst: int, tensors: list[torch.Tensor]) -> None:
        """Start sending ``tensors`` as message ``key`` to ``dst`` (returns at once; a message
        that travels packed with the next sends goes when the last of them is given)."""
        direct = self.direct.get(key)
        if direct is not None and tensors[0].is_contiguous():  # one tensor, same host
            self.links.send(direct[0], [tensors[0].detach()], direct[1])
            return
        w = self.wire_of_send.get(key, (key,))
        if len(w) > 1:
            self.stash.extend(tensors)
            if key != w[-1]:
                return
            tensors, self.stash = self.stash, []
        lay = self.wire_layout.get(w) or self.layouts[(key[0], key[1])]
        if lay.packed:
            wire = [lay.pack(tensors, self.device)]
        else:
            wire = []
            for t in tensors:
                t = t.detach()
                if t.dtype == torch.bool:
                    t = t.to(torch.uint8)
                wire.append(t if t.is_contiguous() else t.contiguous())
        proc = self.linked.get(dst)
        if proc is not None:
            self.links.send(proc, wire, self._tag(w[0], 0))
            return
        for k, t in enumerate(wire):
            # the tensor stays referenced until the send completes
            work = dist.isend(t, self.process_of(dst), tag=self._tag(w[0], k))
            entry = [work, t, key, dst]
            self.pending_sends.append(entry)
            for k2 in w:
                self.sent_entries.setdefault(k2, []).append(entry)

    def _post(self, key: MsgKey) -> None:
        peer, i = self.index[key]
        wires = self.order[peer]
        while self.next_post[peer] <= i:
            w = wires[self.next_post[peer]]
            bufs = self.wire_layout[w].empty(self.device)
            if peer in self.linked:
                self.posted[w] = ([], bufs)  # read in order by recv (same-host link)
                self.next_post[peer] += 1
                continue
            src = self.process_of(peer)
            works = [dist.irecv(buf, src, tag=self._tag(w[0], j)) for j, buf in enumerate(bufs)]
            self.posted[w] = (works, bufs)
            self.next_post[peer] += 1

    def prepost(self, key: MsgKey) -> None:
        """Post the receive of ``key`` (and earlier messages from the same peer) now."""
        where = self.index.get(key)
        if where is not None and self.next_post[where[0]] <= where[1]:
            self._post(key)

    def recv(self, key: MsgKey, src: int) -> list[torch.Tensor]:
        """Wait for message ``key`` from ``src`` and return its tensors."""
        if key in self.ready:
            self._release_sent(key)
            return self.ready.pop(key)
        direct = self.direct_recv.get(key)
        if direct is not None and self.read_next[direct[0]] == direct[1]:
            # the next message on a same-host link, one tensor: read it straight in
            peer, _, proc, tag = direct
            w = (key,)
            if w not in self.posted:
                self._post(key)
            bufs = self.posted.pop(w)[1]
            self.links.recv_into(proc, bufs, tag, lambda: self._what(key, src))
            self.read_next[peer] += 1
            if key[1] == "B":
                self._release_sent(key)
            return bufs
        if key not in self.index:
            raise RuntimeFailure(f"rank {self.rank}: no rank sends message {key} here")
        peer, i = self.index[key]
        w = self.order[peer][i]
        if w not in self.posted:
            self._post(key)
        if peer in self.linked:
            self._read_through(peer, i, src)
        works, bufs = self.posted.pop(w)
        for work in works:
            self._wait(work, f"receiving {'activations' if key[1] == 'F' else 'gradients'} of "
                             f"transfer {key[0]} micro-batch {key[2]} from rank {src}")
        lay = self.wire_layout[w]
        if lay.packed:
            bufs = lay.unpack(bufs[0])
        if lay.has_bool:
            bufs = [b.to(torch.bool) if m.dtype == torch.bool else b
                    for b, m in zip(bufs, lay.metas)]
        self._release_sent(key)
        if len(w) == 1:
            return bufs
        offset = 0
        for k in w:
            n = len(self.layouts[(k[0], k[1])].metas)
            self.ready[k] = bufs[offset:offset + n]
            offset += n
        return self.ready.pop(key)

    def _read_through(self, peer: int, i: int, src: int) -> None:
        """Same-host link: read ``peer``'s wire messages up to its ``i``-th, in its order."""
        wires, proc = self.order[peer], self.linked[peer]
        while self.read_next[peer] <= i:
            w = wires[self.read_next[peer]]
            k = w[0]
            self.links.recv_into(proc, self.posted[w][1], self._tag(k, 0),
                                 lambda k=k: self._what(k, src))
            self.read_next[peer] += 1

    def _what(self, key: MsgKey, src: int) -> str:
        """Message ``key`` from ``src``, named for an error."""
        return (f"receiving {'activations' if key[1] == 'F' else 'gradients'} of transfer "
                f"{key[0]} micro-batch {key[2]} from rank {src} (step {self.step_of()})")

    def _wait(self, work: Any, what: str) -> None:
        try:
            ok = work.wait(self.timeout)
        except RuntimeError as e:
            raise RuntimeFailure(f"rank {self.rank} step {self.step_of()}: failed {what}: "
                                 f"{str(e).splitlines()[0] if str(e) else e}") from e
        if ok is False:
            raise RuntimeFailure(f"rank {self.rank} step {self.step_of()}: timed out after "
                                 f"{self.timeout.total_seconds():.0f} s {what}")

    def _release_sent(self, key: MsgKey) -> None:
        """The gradients ``key`` of a transfer have arrived, so its peer has long received the
        activations this rank sent for that micro-batch: wait on that send (it has completed)
        and drop its tensor now instead of at the end-of-step flush (gloo's
        ``is_completed()`` stays False until ``wait()``; holding every sent activation until
        the step ends costs up to twice the predicted peak)."""
        if key[1] != "B":
            return
        for entry in self.sent_entries.pop((key[0], "F", key[2]), ()):
            if entry[0] is not None:
                self._wait(entry[0], f"sending message {entry[2]} to rank {entry[3]}")
                entry[0] = entry[1] = None

    def flush(self) -> None:
        """Wait for every send started so far."""
        for work, _, key, dst in self.pending_sends:
            if work is not None:
                self._wait(work, f"sending message {key} to rank {dst}")
        self.pending_sends.clear()
        self.sent_entries.clear()
        if self.links is not None:
            self.links.flush(f"flushing sends at the end of step {self.step_of()}")
