"""Point-to-point messages between ranks over torch.distributed (gloo or NCCL).

A message is the tensors of one transfer for one micro-batch, forward (activations) or backward
(gradients). Receivers know every message's shapes from the value metas, so buffers are
preallocated and nothing but tensor data crosses the wire. Every send and receive is
asynchronous (``isend``/``irecv``); a receive is waited on only when its data is needed, and
every wait has a timeout.

Messages between a pair of ranks are received in the order the sender sends them (the receiver
posts receives ahead, in the sender's order), which NCCL requires and gloo tolerates; gloo also
gets a distinct tag per message.

A message of several small tensors travels as one flat byte buffer (``PACK_MAX_BYTES``): each
point-to-point operation costs a fixed host time (gloo: a lock, a socket write, a thread
wake-up at the receiver; measured in BENCHMARKS.md, issue 17) that dwarfs copying a few KiB.
Everything a message needs (metas, tags, pack layout) is computed once per schedule.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from outcore.errors import RuntimeFailure
from outcore.runtime.values import LeafMeta
from outcore.schedule.ir import Schedule

log = logging.getLogger(__name__)

MsgKey = tuple[int, str, int]  # (transfer, "F" | "B", micro-batch)

# a message of several tensors whose total is at most this travels as one packed buffer
PACK_MAX_BYTES = 1 << 18
_ALIGN_BYTES = 16  # packed tensors start at multiples of this (any dtype can view its slice)


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


class Messenger:
    """Sends and receives one rank's messages for one schedule.

    Args:
        rank: this rank.
        schedule: the schedule (all ranks' action lists: send orders are read from it).
        leaf_metas: per message direction and transfer, the tensor metas of the message.
        device: where buffers live.
        timeout_s: longest wait for any message.
        use_tags: give each message its own tag (gloo); NCCL ignores tags.
    """

    def __init__(self, rank: int, schedule: Schedule,
                 leaf_metas: Callable[[int, str], list[LeafMeta]], device: torch.device,
                 timeout_s: float, use_tags: bool = True, step_of: Callable[[], int] = lambda: 0):
        self.rank = rank
        self.s = schedule
        self.leaf_metas = leaf_metas
        self.device = device
        self.timeout = timedelta(seconds=timeout_s)
        self.use_tags = use_tags
        self.step_of = step_of
        self.pending_sends: list[tuple[Any, torch.Tensor, MsgKey, int]] = []
        self.posted: dict[MsgKey, tuple[list[Any], list[torch.Tensor]]] = {}
        # per sending peer: the keys it sends to us, in its order, and how many we have posted
        self.order: dict[int, list[MsgKey]] = {}
        for peer, acts in enumerate(schedule.actions):
            if peer == rank:
                continue
            keys = [(a.transfer, a.op[1], a.mb) for a in acts
                    if a.op in ("SF", "SB") and schedule.peer(peer, a) == rank]
            if keys:
                self.order[peer] = keys
        self.next_post = {peer: 0 for peer in self.order}
        self.index = {key: (peer, i) for peer, keys in self.order.items()
                      for i, key in enumerate(keys)}
        self.layouts = {(t.id, d): _Layout(list(leaf_metas(t.id, d)))
                        for t in schedule.pieces.transfers for d in ("F", "B")}
        max_leaves = max((len(lay.metas) for lay in self.layouts.values()), default=1)
        self.leaf_slots = max(max_leaves, 1)

    def start_step(self) -> None:
        """Reset the per-step receive bookkeeping (every step repeats the same messages)."""
        if self.posted:
            raise RuntimeFailure(f"rank {self.rank}: {len(self.posted)} messages of the last "
                                 "step were never consumed; the schedule is inconsistent")
        self.next_post = {peer: 0 for peer in self.order}

    def _tag(self, key: MsgKey, leaf: int) -> int:
        if not self.use_tags:
            return 0
        t, d, m = key
        return ((t * 2 + (d == "B")) * self.s.microbatches + m) * self.leaf_slots + leaf

    def send(self, key: MsgKey, dst: int, tensors: list[torch.Tensor]) -> None:
        """Start sending ``tensors`` as message ``key`` to ``dst`` (returns at once)."""
        lay = self.layouts[(key[0], key[1])]
        if lay.packed:
            wire = [lay.pack(tensors, self.device)]
        else:
            wire = []
            for t in tensors:
                t = t.detach()
                if t.dtype == torch.bool:
                    t = t.to(torch.uint8)
                wire.append(t if t.is_contiguous() else t.contiguous())
        for k, t in enumerate(wire):
            # the tensor stays referenced until the send completes
            self.pending_sends.append((dist.isend(t, dst, tag=self._tag(key, k)), t, key, dst))

    def _post(self, key: MsgKey) -> None:
        peer, i = self.index[key]
        keys = self.order[peer]
        while self.next_post[peer] <= i:
            k = keys[self.next_post[peer]]
            bufs = self.layouts[(k[0], k[1])].empty(self.device)
            works = [dist.irecv(buf, peer, tag=self._tag(k, j)) for j, buf in enumerate(bufs)]
            self.posted[k] = (works, bufs)
            self.next_post[peer] += 1

    def prepost(self, key: MsgKey) -> None:
        """Post the receive of ``key`` (and earlier messages from the same peer) now."""
        if key in self.index and key not in self.posted:
            self._post(key)

    def recv(self, key: MsgKey, src: int) -> list[torch.Tensor]:
        """Wait for message ``key`` from ``src`` and return its tensors."""
        if key not in self.index:
            raise RuntimeFailure(f"rank {self.rank}: no rank sends message {key} here")
        if key not in self.posted:
            self._post(key)
        works, bufs = self.posted.pop(key)
        for w in works:
            self._wait(w, f"receiving {'activations' if key[1] == 'F' else 'gradients'} of "
                          f"transfer {key[0]} micro-batch {key[2]} from rank {src}")
        lay = self.layouts[(key[0], key[1])]
        if lay.packed:
            bufs = lay.unpack(bufs[0])
        if not lay.has_bool:
            return bufs
        return [b.to(torch.bool) if m.dtype == torch.bool else b for b, m in zip(bufs, lay.metas)]

    def _wait(self, work: Any, what: str) -> None:
        try:
            ok = work.wait(self.timeout)
        except RuntimeError as e:
            raise RuntimeFailure(f"rank {self.rank} step {self.step_of()}: failed {what}: "
                                 f"{str(e).splitlines()[0] if str(e) else e}") from e
        if ok is False:
            raise RuntimeFailure(f"rank {self.rank} step {self.step_of()}: timed out after "
                                 f"{self.timeout.total_seconds():.0f} s {what}")

    def flush(self) -> None:
        """Wait for every send started so far."""
        for work, _, key, dst in self.pending_sends:
            self._wait(work, f"sending message {key} to rank {dst}")
        self.pending_sends.clear()
