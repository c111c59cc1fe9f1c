"""Device, link and cluster specifications (plain data; no torch).

A :class:`Cluster` is ``nodes`` machines of ``devices_per_node`` devices each. Devices in one
machine talk over the intra-node link, devices in different machines over the inter-node link
(each machine's NIC shared by its devices). Transfers cost ``latency_s + bytes / bandwidth``
(the alpha-beta model).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from outcore.errors import UsageError


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or CPU socket) as the cost model sees it.

    Attributes:
        name: preset name (``a100``).
        memory_bytes: device memory.
        peak_flops: dense fp32 FLOP/s (``peak_flops_tc`` for tensor-core / matrix units).
        mem_bandwidth: device memory bandwidth, bytes/s.
        launch_s: fixed cost per kernel (launch latency / framework overhead), seconds.
        efficiency: fraction of peak FLOP/s reached by large GEMM/convolutions.
        host_bandwidth: device <-> host copy bandwidth (offloading), bytes/s.
        host_is_device: the device *is* the host (CPU training): offloading moves nothing.
        fwd_overhead_s, bwd_overhead_s: fixed cost of running one piece's forward / backward
            for one micro-batch in outcore's runtime (Python, module call, the autograd
            call), on top of its layers' times (0 for a bare device; plans made by
            ``outcore.plan`` use the runtime's figures, ``RUNTIME_OVERHEAD_S``, or the
            probed ones of ``outcore.runtime.overhead``).
        host_overlap: the runtime's per-piece cost is host work that overlaps the device's
            execution (GPUs: the host queues the next kernels while the device runs): a piece
            takes the longer of its layers' time and its overhead, not their sum.
        send_overhead_s, recv_overhead_s: host time of one point-to-point message's send
            and receive calls in outcore's runtime (the sender's next action waits for it; the
            wire's own time is the link's), probed by ``outcore.runtime.overhead``.
        send_byte_s, recv_byte_s: host seconds per byte those calls add (CPU workers on
            same-host sockets: the kernel copies a message through the calling thread, about
            10 GB/s each way here; 0: the transport copies on its own, as GPUs' DMA does).
        cold_start_s: on a CPU worker, a forward, backward or optimizer step that starts after
            the rank waited (for a message, or for the step to begin) runs slower while the
            core's caches and predictors warm up again: up to this many seconds more, and at
            most ``COLD_START_FRACTION`` of the action's own time (probed by
            ``outcore.runtime.overhead.cold_start_s``; 0: not modelled).
    """

    name: str
    memory_bytes: float
    peak_flops: float
    mem_bandwidth: float
    peak_flops_tc: float = 0.0
    launch_s: float = 5e-6
    efficiency: float = 0.6
    host_bandwidth: float = 12e9  # device <-> host (PCIe) bytes/s, for offload
    host_is_device: bool = False
    fwd_overhead_s: float = 0.0
    bwd_overhead_s: float = 0.0
    host_overlap: bool = False
    send_overhead_s: float = 0.0
    recv_overhead_s: float = 0.0
    cold_start_s: float = 0.0
    send_byte_s: float = 0.0
    recv_byte_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


# outcore's runtime cost per piece and micro-batch (forward, backward): Python, the module call,
# the autograd call, on a host not probed (a local CPU cluster carries its own probe). The
# probe (`outcore.runtime.overhead.piece_overhead_s`) gives 3.1-3.2 us and 11.4-11.7 us on
# a 2-core VM; the default is about 3x that, for hosts busier than a tight loop.
RUNTIME_OVERHEAD_S = (10e-6, 30e-6)

# An action that starts after its worker waited runs at most this much slower than warm, and
# no more than ``DeviceSpec.cold_start_s`` (measured on a 2-core VM: the zoo MLP's
# first forward of a step 1.5x its later ones; the transformer's pieces after a receive
# 1.2-1.5x; half a ResNet's Adam step after 1 ms asleep 1.44x, +0.21 ms). A wait shorter
# than ``COLD_START_IDLE_S`` leaves it warm. A message call's own host time after a compute is
# about that long (18-26 us for a small one, probed), so a compute after a send
# or a receive is charged too, as measured: a pipeline piece's module call 1.15-1.40x after
# messages, the same call repeated at once 1.0x (the zoo ResNet, 2 workers).
COLD_START_FRACTION = 0.5
COLD_START_IDLE_S = 20e-6


# the runtime's per-step sums (the non-finite check with the loss) travel over same-host sockets,
# every rank to every other, when all of a job's ranks share one host and are at most this many
# (n (n - 1) small messages); otherwise over the backend's all-reduce
SAME_HOST_SUM_MAX_RANKS = 8


@dataclass(frozen=True)
class LinkSpec:
    """A communication link: ``time = latency_s + bytes / bandwidth``.

    ``collective_latency_s``: the latency collectives see when they travel another way than
    point-to-point messages (local CPU workers: messages over same-host sockets, collectives
    over gloo's loopback TCP); None: the same ``latency_s``.
    ``copy_on_send``: the transport copies a message out in the send call (same-host sockets
    with 4 MiB kernel buffers), so the sender holds none of it afterwards; otherwise (gloo,
    NCCL) the runtime keeps a sent tensor until its send completes at the step's end."""

    bandwidth: float  # bytes/s
    latency_s: float = 25e-6
    collective_latency_s: float | None = None
    copy_on_send: bool = False

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth if nbytes > 0 else 0.0

    @property
    def latency_for_collectives(self) -> float:
        """The per-message latency (alpha) of the collective cost models
        (:mod:`outcore.hardware.collectives`)."""
        return self.latency_s if self.collective_latency_s is None else self.collective_latency_s


@dataclass(frozen=True)
class Cluster:
    """``nodes`` × ``devices_per_node`` devices with intra- and inter-node links.

    ``host_cores``: when the "devices" are worker processes on one machine's CPU cores (local
    CPU training), the number of cores they share; more computing ranks than cores slow each
    other down (processor sharing). None: every device computes on its own.
    ``nics_per_node``: network ports per machine, each at ``inter``'s bandwidth, shared by
    consecutive devices (a DGX/HGX A100 has one per GPU: 8; default 1, one shared NIC).
    """

    device: DeviceSpec
    nodes: int = 1
    devices_per_node: int = 1
    intra: LinkSpec = LinkSpec(16e9, 25e-6)
    inter: LinkSpec = LinkSpec(12.5e9, 5e-6)
    host_cores: int | None = None  # all ranks share this many cores (local CPU workers)
    nics_per_node: int = 1

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.devices_per_node < 1:
            raise UsageError("a cluster needs at least one node with at least one device")
        if self.nics_per_node < 1:
            raise UsageError(f"a node needs at least one network port, got "
                             f"nics_per_node={self.nics_per_node}")

    def port_of(self, device: int) -> tuple[int, int]:
        """``(node, port)``: the network port ``device`` sends through (ports are shared by
        consecutive devices of a node)."""
        nics = min(self.nics_per_node, self.devices_per_node)
        return self.node_of(device), (device % self.devices_per_node) * nics // \
            self.devices_per_node

    @property
    def size(self) -> int:
        return self.nodes * self.devices_per_node

    def node_of(self, device: int) -> int:
        return device // self.devices_per_node

    def link(self, a: int, b: int) -> LinkSpec:
        """The link between devices ``a`` and ``b``."""
        return self.intra if self.node_of(a) == self.node_of(b) else self.inter

    def link_times(self, a, b, nbytes) -> np.ndarray:
        """``link(a[i], b[i]).time(nbytes[i])`` for every ``i`` at once (the same
        arithmetic)."""
        same = np.asarray(a) // self.devices_per_node == np.asarray(b) // self.devices_per_node
        latency = np.where(same, self.intra.latency_s, self.inter.latency_s)
        bandwidth = np.where(same, self.intra.bandwidth, self.inter.bandwidth)
        nbytes = np.asarray(nbytes, np.float64)
        return np.where(nbytes > 0, latency + nbytes / bandwidth, 0.0)

    def with_memory(self, memory_bytes: float) -> "Cluster":
        return replace(self, device=replace(self.device, memory_bytes=memory_bytes))

    def slots(self, width: int) -> "Cluster":
        """The cluster as a plan's device slots see it when every slot is ``width``
        consecutive ranks (a tensor-parallel group): slot ``s`` sits where rank
        ``s * width`` does, and ``width`` ranks share the host's cores."""
        if width == 1:
            return self
        per_node = self.devices_per_node // width
        if per_node >= 1:  # groups inside nodes (a slot's ports: its ranks' own, side by side)
            return replace(self, devices_per_node=per_node, host_cores=self._cores(width),
                           nics_per_node=max(self.nics_per_node // width, 1))
        # a group spans nodes: every slot is its own node, reached over the inter-node link
        return replace(self, nodes=max(self.size // width, 1), devices_per_node=1,
                       host_cores=self._cores(width), nics_per_node=1)

    def _cores(self, width: int) -> int | None:
        return None if self.host_cores is None else max(self.host_cores // width, 1)


def flat_cluster(devices: int, *, memory_bytes: float, bandwidth: float = 16e9,
                 latency_s: float = 25e-6, device: DeviceSpec | None = None,
                 host_cores: int | None = None,
                 collective_latency_s: float | None = None,
                 copy_on_send: bool = False) -> Cluster:
    """``devices`` devices on one flat network (every pair over the same kind of link);
    ``host_cores``: see :class:`Cluster`; ``collective_latency_s``, ``copy_on_send``: see
    :class:`LinkSpec`."""
    dev = device or DeviceSpec("generic", memory_bytes, 1e13, 1e12)
    dev = replace(dev, memory_bytes=memory_bytes)
    link = LinkSpec(bandwidth, latency_s, collective_latency_s, copy_on_send)
    return Cluster(dev, nodes=1, devices_per_node=max(devices, 1), intra=link, inter=link,
                   host_cores=host_cores or None)
