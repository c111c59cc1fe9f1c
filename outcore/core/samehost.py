"""Point-to-point messages between CPU workers on one host, over Unix-domain stream sockets.

gloo carries every point-to-point message over TCP loopback through its own I/O threads: the
sender's call takes a lock and writes the socket, the receiver's gloo thread reads it and wakes
the waiting Python thread. Measured on the 2-core machine of BENCHMARKS.md, a small
message then costs ~75-140 us one way, against ~6 us for a blocking Unix-domain socket read
in the receiving thread itself: one kernel copy and one wake-up, no helper thread. Intra-node
transports do the same for the same reason: NCCL's SHM transport and MPI's shared-memory
BTLs keep node-local traffic off the network stack; gloo's own ``transport/uv`` and
``transport/tcp`` keep one connected stream per pair. Here, a pair of ranks on one host gets
one connected ``AF_UNIX`` stream socket (Linux abstract namespace, so no file is left behind),
set up once per schedule by :func:`connect_same_host`; collectives stay on gloo, except the
runtime's one sum of a few numbers per step (:meth:`SameHostLinks.sum_all`), which gloo's
all-reduce took 0.33-0.49 ms to do between 2 ranks here.

Semantics match the gloo path the :class:`~outcore.core.comm.Messenger` uses: a send never
blocks (what the kernel does not take yet waits in a per-peer queue, pushed whenever this rank
sends, waits or flushes); messages between a pair are read in the sender's order, straight into
the receiver's preallocated buffers (scatter read, one system call for a small message); each
message carries an 8-byte header (tag, length) checked on arrival; every wait has a timeout,
and a peer that exits closes its socket, which the waiting rank reports at once instead of
hanging.
"""

from __future__ import annotations

import logging
import os
import secrets
import select
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable

import torch

from outcore.core.env import cores_to_spare
from outcore.errors import RuntimeFailure

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<II")  # tag, payload bytes
_SOCK_BUF_BYTES = 4 << 20  # kernel buffer per direction: sends rarely wait on the reader
_IOV_MAX = 512
_NOWAIT = socket.MSG_DONTWAIT

# ``OUTCORE_P2P=gloo`` keeps every message on gloo (for comparisons); default: same-host sockets
P2P_ENV = "OUTCORE_P2P"
# a receive polls this long (microseconds) before it blocks: ``OUTCORE_P2P_SPIN_US``, else
# SPIN_AUTO_US when every local worker has a core of its own (a blocked process pays a wake-up
# and cold caches: the 64-layer alternating chain on 2 quiet cores took 25.3 ms a step without
# spinning, 13.0-13.5 ms with 200-1000 us), and none on busy cores (spinning takes the core
# the peer needs: at load 5-6 a step takes 202 ms spinning, 92 ms not)
SPIN_ENV, SPIN_AUTO_US = "OUTCORE_P2P_SPIN_US", 200.0


def _name(what: str | Callable[[], str]) -> str:
    return what() if callable(what) else what


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of contiguous CPU tensor ``t`` (shares its memory)."""
    try:
        return memoryview(t.numpy()).cast("B")
    except (TypeError, ValueError):  # no numpy dtype (bfloat16), or a 0-d view
        return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")


class SameHostLinks:
    """Connected sockets to this rank's peers on the same host, and their send queues.

    Args:
        rank: this process's rank (for messages).
        socks: per peer process rank, a connected stream socket.
        timeout_s: longest wait for any message or send.
        spin_s: a receive polls its socket this long before it blocks (a blocked process
            waits for the scheduler to wake it: ~0.1-2 ms on loaded cores, BENCHMARKS.md);
            bounded, so an idle rank does not burn a core.
    """

    def __init__(self, rank: int, socks: dict[int, socket.socket], timeout_s: float,
                 spin_s: float = 0.0):
        self.rank = rank
        self.socks = socks
        self.timeout_s = timeout_s
        # blocking sockets: a blocked read is woken straight by the writer (a ping-pong here:
        # ~6-13 us one way, against ~80-110 us when waiting in select()); SO_RCVTIMEO bounds
        # it; sends and polls never block (MSG_DONTWAIT)
        tv = struct.pack("ll", int(timeout_s), int((timeout_s % 1) * 1e6))
        for s in socks.values():
            s.setblocking(True)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        self.out: dict[int, deque] = {p: deque() for p in socks}  # [memoryview, keep-alive]
        self.queued = dict.fromkeys(socks, 0)  # bytes in each peer's queue
        self.by_fd = {s.fileno(): p for p, s in socks.items()}
        self.spin_s = spin_s

    def has(self, peer: int) -> bool:
        return peer in self.socks

    def send(self, peer: int, tensors: list[torch.Tensor], tag: int) -> None:
        """Queue ``tensors`` (contiguous, CPU) as one message to ``peer`` and push what the
        kernel takes now; returns at once."""
        kept = [t for t in tensors if t.numel()]
        views = [_bytes_of(t) for t in kept]
        size = sum(len(v) for v in views)
        q = self.out[peer]
        q.append([memoryview(_HEADER.pack(tag, size)), None])
        q.extend([v, t] for v, t in zip(views, kept))
        self.queued[peer] += _HEADER.size + size
        self._push(peer)

    def _push(self, peer: int) -> bool:
        """Write as much of ``peer``'s queue as the kernel takes; True when it is empty."""
        q, s = self.out[peer], self.socks[peer]
        while q:
            try:
                n = s.sendmsg([e[0] for e in (q if len(q) <= _IOV_MAX
                                              else list(q)[:_IOV_MAX])], [], _NOWAIT)
            except BlockingIOError:
                return False
            except OSError as e:
                raise RuntimeFailure(f"rank {self.rank}: sending to rank {peer} over the "
                                     f"same-host link failed ({e}): the peer exited or failed; "
                                     "see its log") from e
            self.queued[peer] -= n
            if not self.queued[peer]:  # the usual case: the kernel took all of it
                q.clear()
                return True
            while n and q:
                head = q[0][0]
                if n >= len(head):
                    n -= len(head)
                    q.popleft()
                else:
                    q[0][0] = head[n:]
                    n = 0
        return True

    def _wait_io(self, read_peer: int | None, deadline: float,
                 what: str | Callable[[], str]) -> None:
        """Block until ``read_peer``'s socket is readable or a queued send can progress
        (pushing it), or fail at ``deadline``."""
        while True:
            waiting_out = [p for p, q in self.out.items() if q]
            if read_peer is None and not waiting_out:
                # every send is in the kernel: nothing to wait for (a select on no socket
                # would sleep to the deadline: a flush stalled for the whole timeout when
                # its last push here emptied the queue)
                return
            wlist = [self.socks[p] for p in waiting_out]
            rlist = [self.socks[read_peer]] if read_peer is not None else []
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeFailure(f"rank {self.rank}: timed out after {self.timeout_s:.0f} s "
                                     f"{_name(what)} (same-host link): the peer is stuck or too "
                                     "slow; raise the timeout or see the peer's log")
            r, w, _ = select.select(rlist, wlist, [], left)
            for s in w:
                self._push(self.by_fd[s.fileno()])
            if r or (read_peer is None and not w):
                return

    def recv_into(self, peer: int, bufs: list[torch.Tensor], tag: int,
                  what: str | Callable[[], str]) -> None:
        """Read ``peer``'s next message into ``bufs`` (contiguous, CPU, sized as sent).
        ``what`` names the message in errors (a callable: formatted only on an error)."""
        header = bytearray(_HEADER.size)
        views = [memoryview(header)] + [_bytes_of(b) for b in bufs if b.numel()]
        expected = sum(len(v) for v in views[1:])
        s, done = self.socks[peer], 0
        now = time.monotonic()
        deadline, spin_until = now + self.timeout_s, now + self.spin_s
        while views:
            poll = any(self.out.values()) or (self.spin_s and time.monotonic() < spin_until)
            try:
                n = s.recvmsg_into(views[:_IOV_MAX], 0, _NOWAIT if poll else 0)[0]
            except BlockingIOError:  # nothing yet (poll), or SO_RCVTIMEO expired
                if time.monotonic() < spin_until:  # the message is usually microseconds away
                    continue
                self._wait_io(peer, deadline, what)
                continue
            except OSError as e:
                raise RuntimeFailure(f"rank {self.rank}: {_name(what)} failed on the same-host "
                                     f"link ({e}): rank {peer} exited or failed; see its log"
                                     ) from e
            if n == 0:
                raise RuntimeFailure(f"rank {self.rank}: rank {peer} closed its same-host link "
                                     f"while {_name(what)}: it exited or failed; see its log")
            if done < _HEADER.size <= done + n:
                self._check(header, peer, tag, expected, what)
            done += n
            while n and views:
                if n >= len(views[0]):
                    n -= len(views.pop(0))
                else:
                    views[0] = views[0][n:]
                    n = 0

    def sum_all(self, values: torch.Tensor, tag: int, what: str) -> torch.Tensor:
        """``values`` (contiguous, CPU) summed over this rank and every peer: each rank sends
        its own to every peer and adds what it reads in rank order, so that every rank gets
        the same bits. The peers must be every other rank of the job, each calling it once
        with the same shape; a peer's earlier messages must all have been read (its
        messages arrive in its order)."""
        for p in self.socks:
            self.send(p, [values], tag)
        parts = {self.rank: values}
        for p in sorted(self.socks):
            parts[p] = torch.empty_like(values)
            self.recv_into(p, [parts[p]], tag, f"{what} (rank {p}'s part)")
        total = torch.zeros_like(values)
        for r in sorted(parts):
            total += parts[r]
        return total

    def _check(self, header: bytearray, peer: int, tag: int, expected: int,
               what: str | Callable[[], str]) -> None:
        got_tag, got_bytes = _HEADER.unpack(header)
        if (got_tag, got_bytes) != (tag, expected):
            raise RuntimeFailure(
                f"rank {self.rank}: {_name(what)}: rank {peer} sent message tag {got_tag} of "
                f"{got_bytes} bytes where tag {tag} of {expected} bytes was due; the two ranks "
                "run different schedules (plan or outcore version)")

    def flush(self, what: str = "flushing sends") -> None:
        """Wait until every queued send is in the kernel (the peer may not have read it)."""
        deadline = time.monotonic() + self.timeout_s
        while any(self.out.values()):
            for p in [p for p, q in self.out.items() if q]:
                self._push(p)
            if any(self.out.values()):
                self._wait_io(None, deadline, what)

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        self.socks.clear()


def _host_id() -> str:
    """This machine (and boot): ranks with the same id share a kernel."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def connect_same_host(peers: Iterable[int], timeout_s: float) -> SameHostLinks | None:
    """Connect this rank to its ``peers`` (process ranks it exchanges messages with) that run on
    the same host. Collective over the default process group (every rank calls it, with
    symmetric peer sets). None when not applicable: no process group, one process, a backend
    other than gloo (NCCL keeps its own transports), not Linux, or ``OUTCORE_P2P=gloo``."""
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    if dist.get_backend() != "gloo" or not sys.platform.startswith("linux") \
            or os.environ.get(P2P_ENV, "").lower() == "gloo":
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts: list = [None] * world
    dist.all_gather_object(hosts, _host_id())
    token = [secrets.token_hex(8) if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    local = sorted(p for p in set(peers) if p != rank and hosts[p] == hosts[rank])
    higher = [p for p in local if p > rank]
    addr = f"\0outcore-p2p-{token[0]}-{rank}"
    listener = None
    if higher:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(addr)
        listener.listen(len(higher))
    dist.barrier()  # every listener exists
    socks: dict[int, socket.socket] = {}
    try:
        for p in local:
            if p < rank:
                s = _configure(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
                s.settimeout(timeout_s)
                s.connect(f"\0outcore-p2p-{token[0]}-{p}")
                s.sendall(struct.pack("<16sI", token[0].encode(), rank))
                socks[p] = s
        if listener is not None:
            listener.settimeout(timeout_s)
            for _ in higher:
                s, _ = listener.accept()
                s = _configure(s)
                s.settimeout(timeout_s)
                hello = _read_exact(s, struct.calcsize("<16sI"))
                got, p = struct.unpack("<16sI", hello)
                if got != token[0].encode() or p not in higher or p in socks:
                    raise RuntimeFailure(f"rank {rank}: unexpected same-host connection "
                                         f"(rank {p}); another job uses the same address?")
                socks[p] = s
    except (TimeoutError, OSError) as e:
        for s in socks.values():
            s.close()
        raise RuntimeFailure(f"rank {rank}: connecting the same-host links to ranks {local} "
                             f"failed ({e}); set {P2P_ENV}=gloo to use gloo only") from e
    finally:
        if listener is not None:
            listener.close()
    if not socks:
        return None
    log.info("rank %d: same-host socket links to ranks %s", rank, sorted(socks))
    return SameHostLinks(rank, socks, timeout_s, spin_s=spin_s())


def spin_s() -> float:
    """How long this worker's receives poll before blocking (see ``SPIN_AUTO_US``)."""
    given = os.environ.get(SPIN_ENV)
    if given:
        return float(given) * 1e-6
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
    return auto_spin_us(local) * 1e-6


def auto_spin_us(local_ranks: int, spare: bool | None = None) -> float:
    """The poll for a job of ``local_ranks`` workers on this host: ``SPIN_AUTO_US`` when each
    has a core of its own (the other processes' load counted; ``spare``: that answer, when
    the caller has read the load already), else none."""
    if spare is None:
        spare = cores_to_spare(local_ranks)
    return SPIN_AUTO_US if spare else 0.0


def _configure(s: socket.socket) -> socket.socket:
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            s.setsockopt(socket.SOL_SOCKET, opt, _SOCK_BUF_BYTES)
        except OSError:  # a capped limit: keep the default
            pass
    return s


def _read_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise OSError("the peer closed the connection during the handshake")
        data += chunk
    return data
