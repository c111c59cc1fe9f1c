"""Probe the runtime's fixed cost per piece on the live machine.

What one more piece costs the executor, beyond its layers' own times (which the graph's costs
already hold): its forward detaches its input into a fresh autograd leaf, calls the piece's
``fx.GraphModule`` and books the output; its backward is one more
``torch.autograd.backward`` call (engine start-up, gradient checks) and reads the input's
gradient. The probe times exactly these calls on a tiny piece against the bare layer, as
:mod:`outcore.hardware.probe` times the device and the link probe the link, and returns the
``(fwd_overhead_s, bwd_overhead_s)`` that :class:`~outcore.hardware.spec.DeviceSpec` carries.

The per-message cost is the link's ``latency_s`` (one-way time of a small torch.distributed
message between two workers, host work included): see ``benchmarks/link_probe.py``.
On GPUs the host work of a piece overlaps the device's execution of the previous one; the
probe measures CPU workers (one thread, as outcore runs them).
"""

from __future__ import annotations

import logging
import time

import torch
from torch import fx
from torch.utils._pytree import tree_flatten

from outcore.core.boundary import entry_tree
from outcore.core.randomness import set_context as set_random_context
from outcore.core.values import LeafMeta, ValueMeta
from outcore.hardware.probe import torch_threads

log = logging.getLogger(__name__)


def _best_s(fn, repeat: int, inner: int) -> float:
    """Minimum over ``repeat`` runs of the mean time of ``inner`` calls (load only adds)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def piece_overhead_s(*, repeat: int = 5, inner: int = 200,
                     threads: int | None = 1) -> tuple[float, float]:
    """``(forward, backward)`` seconds one piece adds per micro-batch on this CPU.

    Forward: a one-layer piece run as the executor runs it (input detached into a leaf, the
    ``GraphModule`` called, the output booked) minus the bare layer call. Backward: one
    ``torch.autograd.backward`` over the piece's output with its incoming gradient, plus
    reading its input's gradient, minus the bare layer's backward inside a larger graph.
    """
    with torch_threads(threads), torch.enable_grad():
        return _measure(repeat, inner)


def _measure(repeat: int, inner: int) -> tuple[float, float]:
    layer = torch.nn.Linear(4, 4)
    gm = fx.symbolic_trace(torch.nn.Sequential(layer))
    x = torch.randn(2, 4, requires_grad=True)
    meta = ValueMeta(tree_flatten(x)[1], (LeafMeta(tuple(x.shape), x.dtype, True),))
    booked: dict[tuple[str, int], torch.Tensor] = {}
    anchor = torch.zeros((), requires_grad=True)
    seed = torch.initial_seed()

    def piece_fwd() -> torch.Tensor:
        set_random_context(seed, 0, 0)
        leaf, _ = entry_tree(x, meta, anchor)
        out = gm(leaf)
        booked[("out", 0)] = out
        return out

    bare_fwd_s = _best_s(lambda: layer(x), repeat, inner)
    piece_fwd_s = _best_s(piece_fwd, repeat, inner)
    grad = torch.ones(2, 4)

    def piece_both() -> None:
        set_random_context(seed, 0, 0)
        leaf, holders = entry_tree(x, meta, anchor)
        out = gm(leaf)
        torch.autograd.backward([out], [grad])
        _ = holders[0].grad

    def chained() -> None:  # the same layer inside a larger backward: no extra engine call
        torch.autograd.backward([layer(layer(x))], [grad])

    both_s = _best_s(piece_both, repeat, max(inner // 2, 1))
    chain_s = _best_s(chained, repeat, max(inner // 2, 1))
    one_call_s = _best_s(lambda: torch.autograd.backward([layer(x)], [grad]), repeat,
                         max(inner // 2, 1))
    layer.zero_grad(set_to_none=True)
    fwd = max(piece_fwd_s - bare_fwd_s, 0.0)
    # chain = 2 layer forwards + 2 layer backwards + one engine call; one_call = 1 + 1 + one
    layer_bwd_s = max(chain_s - one_call_s - bare_fwd_s, 0.0)
    bwd = max(both_s - piece_fwd_s - layer_bwd_s, 0.0)
    log.info("runtime probe: piece forward +%.1f us, backward +%.1f us", fwd * 1e6, bwd * 1e6)
    return fwd, bwd


def cold_start_s(*, rounds: int = 30, idle_s: float = 2e-3,
                 threads: int | None = 1) -> float:
    """Seconds a ~1 ms training step on this CPU takes longer right after its process slept
    ``idle_s`` (waiting for a message, as pipelined workers do) than right after another step:
    the caches and branch predictors the wait let go cold (``DeviceSpec.cold_start_s``).

    The step is a small convolution + linear network's forward, backward and multi-tensor
    Adam step (the runtime's three kinds of compute); medians of ``rounds`` pairs, under the
    allocator setting workers run with. Measured on the project's 2-core VM: 0.06-0.12 ms
    (after 1 ms asleep ~0.06 ms, after 3 ms 0.13-0.20 ms: the figure grows with the wait).
    """
    import statistics

    from outcore.hardware.allocator import keep_heap
    keep_heap()
    with torch_threads(threads):
        gen = torch.Generator().manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Flatten(),
            torch.nn.Linear(8 * 16 * 16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        x = torch.randn(4, 8, 16, 16, generator=gen)
        opt = torch.optim.Adam(net.parameters(), lr=0.0, foreach=True)

        def step() -> float:
            t0 = time.perf_counter()
            with torch.enable_grad():
                net(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return time.perf_counter() - t0

        for _ in range(5):
            step()
        warm, cold = [], []
        for _ in range(rounds):
            step()
            warm.append(step())
            time.sleep(idle_s)
            cold.append(step())
    extra = max(statistics.median(cold) - statistics.median(warm), 0.0)
    log.info("runtime probe: a step after %.1f ms asleep +%.1f us", idle_s * 1e3, extra * 1e6)
    return extra


_ECHO = ("import socket, sys, time\n"
         "s = socket.socket(fileno=int(sys.argv[1]))\n"
         "spin = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0\n"
         "while True:\n"
         "    until = time.monotonic() + spin\n"
         "    while True:\n"
         "        try:\n"
         "            d = s.recv(1 << 16, socket.MSG_DONTWAIT if spin else 0)\n"
         "            break\n"
         "        except BlockingIOError:\n"
         "            if time.monotonic() > until:\n"
         "                d = s.recv(1 << 16)\n"
         "                break\n"
         "    if not d:\n"
         "        break\n"
         "    s.sendall(d)\n")


def _echo_child(spin_s: float = 0.0):
    """A socket to a tiny process that echoes what it reads (stands in for a peer worker;
    polling ``spin_s`` before it blocks, as a worker's receive does)."""
    import socket
    import subprocess
    import sys
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = subprocess.Popen([sys.executable, "-c", _ECHO, str(b.fileno()), str(spin_s)],
                             pass_fds=[b.fileno()])
    b.close()
    a.settimeout(10.0)
    return a, child


def message_overhead_s(*, repeat: int = 2, inner: int = 60, nbytes: int = 512,
                       spin_s: float = 0.0) -> tuple[float, float]:
    """``(send, receive)`` host seconds of one message of ``nbytes`` on the same-host transport
    (:mod:`outcore.core.samehost`), the data already there: the calls' Python, system calls
    and copies, which the sender (receiver) pays before its next action. The message goes to
    another process (:func:`_echo_child`, polling ``spin_s`` as a worker does) and comes back:
    its send wakes that process, its bytes come from another core. Each call is timed alone
    after computes that touch about an L2 cache's worth of data (a 256-wide layer pair on 64
    rows, forward and backward: what a pipeline piece leaves behind), as the runtime's
    messages sit between pieces (the median of ``repeat * inner``). Here: about 18 / 20 us for
    a small message (7 us to a peer in the same process, 4 us in a tight loop), 9 / 13 us more
    for 128 KiB. The time on the wire (the receiver's wake-up) is the link latency:
    :func:`samehost_latency_s`."""
    import statistics

    from outcore.core.samehost import SameHostLinks
    sock, child = _echo_child(spin_s)
    link = SameHostLinks(0, {1: sock}, 10.0)
    t, buf = torch.randn(max(nbytes // 4, 1)), torch.empty(max(nbytes // 4, 1))
    net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 256))
    x = torch.randn(64, 256)

    def compute() -> None:
        with torch.enable_grad():
            net(x).sum().backward()

    sends, recvs = [], []
    try:
        with torch_threads(1):  # as the workers run (idle helper threads would spin meanwhile)
            for k in range(repeat * inner + 10):
                compute()
                t0 = time.perf_counter()
                link.send(1, [t], k)
                t1 = time.perf_counter()
                compute()  # the echo is back meanwhile
                compute()
                t2 = time.perf_counter()
                link.recv_into(1, [buf], k, "probing")
                t3 = time.perf_counter()
                if k >= 10:
                    sends.append(t1 - t0)
                    recvs.append(t3 - t2)
    finally:
        link.close()
        child.kill()
        child.wait()
    send_s, recv_s = statistics.median(sends), statistics.median(recvs)
    log.info("runtime probe: message of %d bytes: send %.1f us, receive %.1f us", nbytes,
             send_s * 1e6, recv_s * 1e6)
    return send_s, recv_s


def samehost_latency_s(spin_s: float = 0.0, *, rounds: int = 200, nbytes: int = 520) -> float:
    """Mean one-way time of a small message between two processes on the same-host transport
    (half a ping-pong through the runtime's own :class:`~outcore.core.samehost.SameHostLinks`
    with a tiny echo process that returns each message as it came): the send and receive
    calls' host time and the receiver's wake-up. ``spin_s``: both ends poll that long before
    blocking, as workers' receives do when every worker has a core
    (``outcore.core.samehost.spin_s``). The mean, not the median: on loaded cores most
    hand-offs take ~6 us and a few wait milliseconds for a core (measured: median 5-8 us, mean
    45-145 us at load 5 on 2 cores), and a chain of messages pays their sum."""
    import statistics

    from outcore.core.samehost import SameHostLinks
    sock, child = _echo_child(spin_s)
    link = SameHostLinks(0, {1: sock}, 10.0, spin_s=spin_s)
    msg, buf = torch.zeros(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    times = []
    try:
        for k in range(rounds + 10):
            t0 = time.perf_counter()
            link.send(1, [msg], k)
            link.recv_into(1, [buf], k, "probing the same-host latency (the echo: our message)")
            if k >= 10:
                times.append((time.perf_counter() - t0) / 2)
    finally:
        link.close()
        child.wait(timeout=10)
    return statistics.fmean(times)
