"""What both event loops of the simulator share (the reference :mod:`outcore.sim.engine` and
the compiled :mod:`outcore.sim.compiled`): the options, the bytes a rank holds when the step
starts, the ports a message queues on, and the buckets two ranks sum over their own link."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from outcore.hardware.spec import Cluster, LinkSpec
from outcore.schedule.costs import PieceCosts
from outcore.schedule.ir import OP_INDEX, RECV_POST_AHEAD, Schedule, action_columns

__all__ = ["SimOptions", "ar_buffer_bytes", "grad_bytes", "held_at_start", "link_ports",
           "post_positions",
           "pair_recv_bytes", "paired_buckets"]


@dataclass(frozen=True)
class SimOptions:
    """Knobs of the simulation.

    Attributes:
        dp: data-parallel replicas of the whole schedule (>= 1).
        dp_link: link the data-parallel all-reduce runs over (default: the cluster's inter-node
            link when there are several nodes, else its intra-node link).
        optimizer_bytes_per_param_byte: memory traffic of the optimizer step per parameter byte
            (Adam reads weight, gradient, two moments and writes three: about 7).
        bucket_bytes: all-reduce bucket bytes for ``AR`` actions, per bucket.
        dp_collective: data-parallel all-reduce model on a cluster holding every copy
            (``outcore.hardware.collectives.COLLECTIVES``: ``auto``, ``hierarchical``,
            ``hierarchical-rhd``, ``ring``).
        dp_bucket_bytes: 0: a piece's gradients are all-reduced after its last backward ends.
            Else DDP-style buckets of this size: gradients become ready evenly during that
            backward and the all-reduce streams behind them (it starts when the first bucket
            is ready and ends no earlier than one bucket's all-reduce after the backward).
        dp_fused: one all-reduce of all of a rank's gradients after its last backward (no
            overlap with the backward; as GEMS' torchgems does) instead of one per piece.
        bucket_ring: per bucket, the ranks its all-reduce runs over when not the whole group
            (0: the group): a sharded bucket all-reduces its shards over ``dp / depth`` groups.
        step_sync_s: the runtime's one small all-reduce per step (the non-finite check, which
            carries the loss): every rank's ``OPT`` waits until all ranks reach theirs, then
            this long. 0: no such synchronisation (one process).
        step_host_s: the runtime's host work around a rank's actions each step (splitting the
            batch into micro-batches, setting up the step, reading the loss), charged before
            the rank's first action.
    """

    dp: int = 1
    dp_link: LinkSpec | None = None
    optimizer_bytes_per_param_byte: float = 7.0
    optimizer_transient: float = 0.0  # working memory of the step, x the rank's parameters
    optimizer_per_tensor_s: float = 0.0  # fixed cost per parameter tensor
    optimizer_per_step_s: float = 0.0  # fixed cost of a rank's step (one with parameters)
    bucket_bytes: tuple[float, ...] = ()
    dp_collective: str = "auto"
    dp_bucket_bytes: float = 0.0
    bucket_ring: tuple[int, ...] = ()
    dp_fused: bool = False
    step_sync_s: float = 0.0
    step_host_s: float = 0.0

    def optimizer_s(self, param_bytes: float, tensors: float, mem_bandwidth: float) -> float:
        """Seconds of a rank's optimizer action: its parameters' memory traffic and, when it
        has parameter tensors, the fixed cost per tensor and per step."""
        dur = param_bytes * self.optimizer_bytes_per_param_byte / mem_bandwidth
        if tensors > 0:
            dur += tensors * self.optimizer_per_tensor_s + self.optimizer_per_step_s
        return dur


def grad_bytes(s: Schedule, costs: PieceCosts) -> np.ndarray:
    """Per piece, the gradient bytes its first backward of the step makes."""
    return costs.grad_bytes if costs.grad_bytes is not None else np.zeros(s.pieces.num_pieces)


def held_at_start(s: Schedule, costs: PieceCosts, grads: np.ndarray) -> list[float]:
    """Per rank, the bytes held when the step starts: the static state less the gradients
    the step makes (they exist from each piece's first backward until the optimizer step)."""
    R = s.num_ranks
    later = np.bincount(np.asarray(s.pieces.device_of, np.int64), weights=grads,
                        minlength=R) if len(grads) else np.zeros(R)
    return [float(costs.static_bytes[r] - later[r]) for r in range(R)]


def link_ports(cluster: Cluster, a: int, b: int) -> tuple[object, object, LinkSpec]:
    """``(out port, in port, link)`` of a message from rank ``a`` to ``b``: the nodes' network
    ports across nodes of the cluster, else the ranks' own ports (one transfer at a time per
    port and direction)."""
    if cluster.size >= max(a, b) + 1 and cluster.node_of(a) != cluster.node_of(b):
        return ("nic", cluster.node_of(a)), ("nic", cluster.node_of(b)), cluster.inter
    return ("dev", a), ("dev", b), cluster.intra


def ar_buffer_bytes(opt: SimOptions, bucket: int) -> float:
    """Bytes of the flat buffer a rank all-reduces ``bucket`` in (none for a bucket whose
    shards nobody else holds)."""
    ring = opt.bucket_ring[bucket] if bucket < len(opt.bucket_ring) else 0
    if ring == 1 or bucket >= len(opt.bucket_bytes):
        return 0.0
    return float(opt.bucket_bytes[bucket])


def paired_buckets(s: Schedule, cluster: Cluster, opt: SimOptions) -> frozenset[int]:
    """The buckets two ranks sum over their own same-host link (a link that copies on send),
    as the runtime chooses them (:meth:`~outcore.schedule.ir.Schedule.pair_partner`): each
    sends its whole bucket to the other at once and adds what it reads, one message each way,
    where the others go through the backend's all-reduce."""
    out = set()
    for b, group in enumerate(s.buckets):
        if len(group) != 2 or b >= len(opt.bucket_bytes) or \
                (b < len(opt.bucket_ring) and opt.bucket_ring[b] == 1):
            continue
        x, y = sorted(group)
        if cluster.link(x, y).copy_on_send and s.pair_partner(b, x) == y:
            out.add(b)
    return frozenset(out)


def pair_recv_bytes(s: Schedule, paired: frozenset[int], opt: SimOptions) -> list[float]:
    """Per rank, the largest of the ``paired`` buckets it sums: the step reads the peer's
    half of such a bucket into a buffer of its size, adds it and frees it, one bucket at a
    time."""
    out = [0.0] * s.num_ranks
    for b in paired:
        for r in s.buckets[b]:
            out[r] = max(out[r], float(opt.bucket_bytes[b]))
    return out



def post_positions(s: Schedule) -> list[np.ndarray]:
    """Per rank, per action: the place among the rank's actions where a receive is posted
    and its buffer allocated (other actions: their own place). The runtime posts a receive
    ``RECV_POST_AHEAD`` places before it, and a peer's messages in the order the peer sends
    them (a link is read in its order; NCCL matches in order): posting one posts every
    message the peer sent before it, so a message is posted at the earliest post of itself
    and of the ones sent after it (a tied weight's gradient that its stage sends first and
    takes last is held from the first gradient's post: 13 % of a GPT-2 stage).
    Consecutive sends whose receives are consecutive travel as one message
    (``outcore.core.comm``): each is posted with the first of them."""
    R = s.num_ranks
    cols = [action_columns(s.actions[r]) for r in range(R)]
    out = [np.arange(len(c[0]), dtype=np.int64) for c in cols]
    nmb = max((int(c[1].max()) + 1 for c in cols if len(c[1])), default=1)
    rf, rb = OP_INDEX["RF"], OP_INDEX["RB"]
    sf, sb = OP_INDEX["SF"], OP_INDEX["SB"]
    recv_at: dict[int, tuple[int, int]] = {}  # message key -> (receiver, place)
    for r, (op, mb, _, tr, _) in enumerate(cols):
        for k in np.flatnonzero((op == rf) | (op == rb)).tolist():
            recv_at[(int(tr[k]) * 2 + int(op[k] == rb)) * nmb + int(mb[k])] = (r, k)
    if not recv_at:
        return out
    for (op, mb, _, tr, _) in cols:
        sends = np.flatnonzero((op == sf) | (op == sb))
        by_peer: dict[int, list[tuple[int, int]]] = {}  # receiver -> (send place, its place)
        for k in sends.tolist():
            got = recv_at.get((int(tr[k]) * 2 + int(op[k] == sb)) * nmb + int(mb[k]))
            if got is not None:
                by_peer.setdefault(got[0], []).append((k, got[1]))
        for peer, msgs in by_peer.items():
            post = out[peer]
            earliest = len(post)
            for j in range(len(msgs) - 1, -1, -1):
                send, place = msgs[j]
                earliest = min(earliest, max(place - RECV_POST_AHEAD, 0))
                if j and msgs[j - 1][0] == send - 1 and msgs[j - 1][1] == place - 1:
                    continue  # packed with the one before: posted with it
                post[place] = earliest
                for i in range(j + 1, len(msgs)):  # the rest of its message
                    if msgs[i][0] != msgs[i - 1][0] + 1 or msgs[i][1] != msgs[i - 1][1] + 1:
                        break
                    post[msgs[i][1]] = earliest
    return out
