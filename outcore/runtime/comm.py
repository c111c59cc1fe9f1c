"""Point-to-point messages between ranks over torch.distributed (gloo or NCCL).

A message is the tensors of one transfer for one micro-batch, forward (activations) or backward
(gradients). Receivers know every message's shapes from the value metas, so buffers are
preallocated and nothing but tensor data crosses the wire. Every send and receive is
asynchronous (``isend``/``irecv``); a receive is waited on only when its data is needed, and
every wait has a timeout.

Messages between a pair of ranks are received in the order the sender sends them (the receiver
posts receives ahead, in the sender's order), which NCCL requires and gloo tolerates; gloo also
gets a distinct tag per message.
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
    """

    def __init__(self, rank: int, schedule: Schedule,
                 leaf_metas: Callable[[int, str], list[LeafMeta]], device: torch.device,
                 timeout_s: float, use_tags: bool = True, step_of: Callable[[], int] = lambda: 0,
                 process_of: Callable[[int], int] = lambda r: r):
        self.rank = rank
        self.process_of = process_of
        self.s = schedule
        self.leaf_metas = leaf_metas
        self.device = device
        self.timeout = timedelta(seconds=timeout_s)
        self.use_tags = use_tags
        self.step_of = step_of
        self.pending_sends: list[tuple[Any, MsgKey, int]] = []
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
        max_leaves = max((len(leaf_metas(t.id, d)) for t in schedule.pieces.transfers
                          for d in ("F", "B")), default=1)
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
        for k, t in enumerate(tensors):
            t = t.detach()
            if t.dtype == torch.bool:
                t = t.to(torch.uint8)
            t = t.contiguous()
            work = dist.isend(t, self.process_of(dst), tag=self._tag(key, k))
            self.pending_sends.append((work, key, dst))
            # keep the tensor alive until the send completes
            self.pending_sends.append((t, key, dst))

    def _post(self, key: MsgKey) -> None:
        peer, i = self.index[key]
        keys = self.order[peer]
        while self.next_post[peer] <= i:
            k = keys[self.next_post[peer]]
            metas = self.leaf_metas(k[0], k[1])
            bufs, works = [], []
            for j, meta in enumerate(metas):
                dtype = torch.uint8 if meta.dtype == torch.bool else meta.dtype
                buf = torch.empty(meta.shape, dtype=dtype, device=self.device)
                works.append(dist.irecv(buf, self.process_of(peer), tag=self._tag(k, j)))
                bufs.append(buf)
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
        metas = self.leaf_metas(key[0], key[1])
        return [b.to(torch.bool) if m.dtype == torch.bool else b for b, m in zip(bufs, metas)]

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
        for item, key, dst in self.pending_sends:
            if isinstance(item, torch.Tensor):
                continue
            self._wait(item, f"sending message {key} to rank {dst}")
        self.pending_sends.clear()
