"""The cluster local worker processes train on, as the simulator prices it: CPU workers on
one host talk over Unix-domain sockets (their latency, per-message and per-piece host times
probed once per process) or, with ``OUTCORE_P2P=gloo``, over gloo's loopback TCP (a measured
preset), and share this machine's cores; GPUs get a generic link."""

from __future__ import annotations

import functools

from outcore.core.env import cores_to_spare, local_cores
from outcore.hardware.cluster import make_cluster
from outcore.hardware.spec import Cluster

__all__ = ["OVERSUBSCRIBED_LATENCY_S", "local_cluster", "same_host_transport"]

# a message's latency when workers outnumber free cores: it waits for its receiver to be
# scheduled (measured on 2 cores with a third busy process: 1.6-2 ms)
OVERSUBSCRIBED_LATENCY_S = 1.5e-3


def local_cluster(devices: int, local: bool) -> Cluster:
    """The cluster a job of ``devices`` workers trains on (``local``: worker processes on this
    machine, sharing its cores): local CPU workers talk over same-host sockets (latency
    and per-message host time probed) or, with ``OUTCORE_P2P=gloo``, gloo on loopback
    (measured preset), and share this machine's cores; GPUs: a generic link."""
    import torch

    from outcore.hardware.presets import link_preset
    if torch.cuda.is_available():
        return make_cluster(devices)
    from outcore.core.samehost import auto_spin_us
    link = link_preset("gloo-loopback")
    cores = local_cores() if local else None
    latency = link.latency_s
    messages = collective = per_byte = None
    samehost = False
    spare = not (cores and devices > 1) or cores_to_spare(devices)  # the load, read once
    if local and devices > 1 and same_host_transport():
        # CPU workers on one host exchange messages over Unix-domain sockets, two
        # ranks sum a bucket they alone hold so too (the simulator prices those sums as the
        # link's messages), other collectives stay on gloo's loopback TCP; their receives
        # poll as the workers' will
        spin_us = auto_spin_us(devices, spare)
        (latency, messages, per_byte), collective = _samehost_costs_s(spin_us), link.latency_s
        samehost = True
    if local and devices > 1 and spare:  # gloo's collectives as they run here (tp's)
        collective = max(latency if collective is None else collective,
                         _gloo_collective_latency_s())
    if not spare:
        # more workers than free cores (other processes' load counts): a message waits for
        # its receiver to be scheduled (measured on 2 cores with a third busy process: 1.6-2 ms)
        latency = collective = OVERSUBSCRIBED_LATENCY_S
    return make_cluster(devices, None, link.bandwidth, latency, device="cpu", host_cores=cores,
                        overhead_s=_runtime_overhead_s(), message_overhead_s=messages,
                        collective_latency=collective, copy_on_send=samehost,
                        cold_start_s=_cold_start_s(), message_byte_s=per_byte)


def same_host_transport() -> bool:
    import os
    import sys

    from outcore.core.samehost import P2P_ENV
    return sys.platform.startswith("linux") and os.environ.get(P2P_ENV, "").lower() != "gloo"


@functools.lru_cache(maxsize=2)
def _samehost_costs_s(spin_us: float
                      ) -> tuple[float, tuple[float, float], tuple[float, float]]:
    """The same-host link's latency, the runtime's (send, receive) host time per message and
    what each byte adds to them, probed once per process and poll (about 0.3 s), the receives
    polling ``spin_us`` as the workers' will (``samehost.auto_spin_us``): a small message and
    one of ``SAMEHOST_PROBE_BYTES``. The latency is the probed one-way time less the two host
    times (which the simulator charges on their own); times to 1 us."""
    from outcore.runtime.overhead import message_overhead_s, samehost_latency_s
    spin = spin_us * 1e-6
    send, recv = message_overhead_s(spin_s=spin)
    big_send, big_recv = message_overhead_s(spin_s=spin, nbytes=SAMEHOST_PROBE_BYTES)
    extra = SAMEHOST_PROBE_BYTES - 512
    per_byte = (max(big_send - send, 0.0) / extra, max(big_recv - recv, 0.0) / extra)
    oneway = samehost_latency_s(spin)
    return (round(max(oneway - send - recv, 1e-6), 6), (round(send, 6), round(recv, 6)),
            (float(f"{per_byte[0]:.3g}"), float(f"{per_byte[1]:.3g}")))


@functools.lru_cache(maxsize=1)
def _gloo_collective_latency_s(calls: int = 64, floats: int = 512) -> float:
    """The latency per message (alpha) of gloo's collectives between two local ranks, probed
    once per process (about 0.15 s): the mean time of a small all-reduce between two gloo
    groups of this process, each in a thread, over the two messages a two-rank all-reduce
    takes. The mean, not the median: gloo's own threads on a busy few cores give it a long
    tail (on 2 cores, 16 KiB all-reduces between two worker processes took 0.41 ms at the
    median and 1.6 ms on average; two threads of one process 0.45 and 1.9), and a step pays
    every call. 0 where gloo cannot run."""
    import datetime
    import threading
    import time

    import torch
    import torch.distributed as dist

    times: list[float] = []
    failed: list[BaseException] = []

    def rank(r: int, store: object) -> None:
        try:
            options = dist.ProcessGroupGloo._Options()  # on the loopback interface only
            options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            options._timeout = datetime.timedelta(seconds=20)
            group = dist.ProcessGroupGloo(dist.PrefixStore("probe", store), r, 2, options)
            x = torch.ones(floats)
            for k in range(calls + 8):
                t = time.perf_counter()
                group.allreduce([x]).wait()
                if r == 0 and k >= 8:  # after a warm-up
                    times.append(time.perf_counter() - t)
        except Exception as e:  # noqa: BLE001 - no probe: the preset stands
            failed.append(e)

    try:
        store = dist.HashStore()
        threads = [threading.Thread(target=rank, args=(r, store), daemon=True) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    except Exception:  # noqa: BLE001
        return 0.0
    if failed or len(times) < calls:
        return 0.0
    return round(sum(times) / len(times) / 2, 6)


# the larger message of the same-host probe: well within a socket's buffer, large enough that
# its copies outweigh the calls' noise (128 KiB: 9-13 us more than a small one here)
SAMEHOST_PROBE_BYTES = 128 * 1024


@functools.lru_cache(maxsize=1)
def _runtime_overhead_s() -> tuple[float, float]:
    """The runtime's per-piece cost on this CPU, probed once per process (about 1 s), to 1 us
    (10 us made the forward's ~4 us nothing)."""
    from outcore.runtime.overhead import piece_overhead_s
    fwd, bwd = piece_overhead_s()
    return round(fwd, 6), round(bwd, 6)


@functools.lru_cache(maxsize=1)
def _cold_start_s() -> float:
    """A CPU worker's re-warming after a wait, probed once per process, to 1 us (about 0.15 s;
    0.8 s when nothing in the process has stepped an optimizer yet: its one-time imports)."""
    from outcore.runtime.overhead import cold_start_s
    return round(cold_start_s(), 6)
