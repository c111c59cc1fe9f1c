"""What every planner needs to know about a graph on a cluster: times, links, memory.

A :class:`Context` is built once per (graph, cluster, devices, optimizer, micro-batches, limit)
and shared by the planners, the emulator and the memory checks, so that topological orders and
link matrices are computed once.

Memory model (docs/design.md, "The memory model"), per device ``d`` for an assignment:

    static(d)    = state_factor(optimizer) * sum of param_bytes of the nodes on d
    saved(d)     = sum of saved_bytes of the nodes on d                       (one micro-batch)
    received(d)  = sum over producers u on another device with a consumer on d of the largest
                   edge u -> d (a tensor crosses to a device once, whatever its consumer count)
    transient(d) = largest out_bytes of a node on d                            (one working buffer)
    peak(d)      = static(d) + inflight(d) * (saved(d) + received(d)) + transient(d)

Saved activations live from a node's forward until its backward, received tensors until their last
consumer's backward. The backward starts only once the whole forward has run (``loss.backward()``
after the loss), so every saved and received tensor of every micro-batch in flight is alive at the
end of the forward: the memory over time peaks there, and the peak is the closed form above. The
emulator's memory timeline (:func:`outcore.placers.emulate.memory_timeline`) reaches exactly this
peak; planners use the closed form. ``inflight`` is ``M`` for ParDNN and the baselines (GPipe-like:
all micro-batches' forwards, then all backwards) and ``min(M, S - s)`` for stage ``s`` of an
``S``-stage 1F1B pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from outcore.cost.memory import state_factor
from outcore.errors import UsageError
from outcore.graph.algorithms import topological_order
from outcore.graph.ir import Graph
from outcore.graph.level_kernel import bottom_levels
from outcore.hardware.spec import Cluster, flat_cluster
from outcore.placers._jit import njit


def link_matrices(cluster: Cluster, devices: int) -> tuple[np.ndarray, np.ndarray]:
    """``(latency_s, seconds_per_byte)``, each ``float64[devices, devices]``, zero diagonal."""
    if cluster.size < devices:
        raise UsageError(f"the cluster has {cluster.size} devices but {devices} were asked for: "
                         "pass a larger cluster or fewer devices")
    lat = np.zeros((devices, devices))
    inv = np.zeros((devices, devices))
    for a in range(devices):
        for b in range(devices):
            if a != b:
                link = cluster.link(a, b)
                lat[a, b] = float(link.latency_s)
                inv[a, b] = 1.0 / float(link.bandwidth)
    return lat, inv


# what a context keeps (cached properties) that does not depend on its devices: a planner's
# contexts of fewer devices (:meth:`Context.with_devices`) take them as made
_SHARED = frozenset({"order", "rank", "work_s", "edge_bytes", "critical_path_s", "_node_bytes"})


@dataclass(frozen=True, eq=False)
class Context:
    """A graph prepared for planning on ``devices`` devices of ``cluster``.

    Attributes:
        g: the graph.
        devices: number of devices planned for (K).
        cluster: the cluster (a flat 16 GB/s, 25 us network when the caller gave none).
        factor: parameter copies kept for training (4 for Adam).
        microbatches: micro-batches per iteration (M).
        memory_bytes: per-device limit, or None for unlimited.
        lat_s, inv_bw: link latency (s) and seconds per byte, ``[K, K]``.
    """

    g: Graph
    devices: int
    cluster: Cluster
    factor: float
    microbatches: int
    memory_bytes: float | None
    lat_s: np.ndarray = field(repr=False)
    inv_bw: np.ndarray = field(repr=False)

    @cached_property
    def order(self) -> np.ndarray:
        """A topological order of the nodes (index order when that is one)."""
        return topological_order(self.g)

    @cached_property
    def rank(self) -> np.ndarray:
        """Position of each node in :attr:`order` (program order of the forward)."""
        r = np.empty(self.g.num_nodes, dtype=np.int64)
        r[self.order] = np.arange(self.g.num_nodes, dtype=np.int64)
        return r

    @cached_property
    def work_s(self) -> np.ndarray:
        """Node weight: forward + backward seconds (a node and its backward are one unit)."""
        return np.ascontiguousarray(self.g.fwd_s + self.g.bwd_s, dtype=np.float64)

    @cached_property
    def comm_s(self) -> np.ndarray:
        """Per edge, seconds one iteration spends on it when cut: forward tensor + its gradient.

        Uses the mean link over device pairs (exact for a flat cluster); 0 for 0-byte edges.
        """
        k = self.devices
        if k < 2:
            return np.zeros(self.g.num_edges)
        off = ~np.eye(k, dtype=bool)
        lat = float(self.lat_s[off].mean())
        inv = float(self.inv_bw[off].mean())
        eb = self.g.edge_bytes.astype(np.float64)
        return np.where(eb > 0, 2.0 * (lat + eb * inv), 0.0)

    @cached_property
    def edge_bytes(self) -> np.ndarray:
        return np.ascontiguousarray(self.g.edge_bytes, dtype=np.int64)

    @cached_property
    def critical_path_s(self) -> float:
        """Longest source-to-sink path of forward + backward time (no communication)."""
        g = self.g
        if g.num_nodes == 0:
            return 0.0
        bl = bottom_levels(self.order, g.succ_ptr, g.succ_idx, g.succ_edge, self.work_s,
                           np.zeros(g.num_edges), np.full(g.num_nodes, -1, np.int64),
                           np.ones(g.num_nodes, np.bool_))
        return float(bl.max())

    def lower_bound_s(self, devices: int | None = None) -> float:
        """max(critical path of forward + backward, total work x M / devices), seconds."""
        k = self.devices if devices is None else devices
        total = float(self.work_s.sum()) * self.microbatches
        return max(self.critical_path_s, total / max(k, 1))

    def without_limit(self) -> "Context":
        """The same problem with no memory limit (what does not depend on it, shared)."""
        return self._sharing(replace(self, memory_bytes=None))

    def _sharing(self, sub: "Context") -> "Context":
        """``sub`` with this context's :data:`_SHARED` caches (made once)."""
        sub.__dict__.update({k: v for k, v in self.__dict__.items() if k in _SHARED})
        return sub

    def with_devices(self, devices: int) -> "Context":
        """The same problem on the first ``devices`` devices of the cluster (what does not
        depend on the devices, made once: :data:`_SHARED`)."""
        return self._sharing(Context(self.g, devices, self.cluster, self.factor,
                                     self.microbatches, self.memory_bytes,
                                     self.lat_s[:devices, :devices],
                                     self.inv_bw[:devices, :devices]))

    # ------------------------------------------------------------------ memory model
    def memory_parts(self, assignment: np.ndarray, devices: int | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(static, activations of one micro-batch (saved + received), transient)`` per device."""
        g = self.g
        k = self.devices if devices is None else devices
        a = np.ascontiguousarray(assignment, dtype=np.int64)
        state, saved, out = self._node_bytes
        if a.size and not 0 <= int(a.min()) <= int(a.max()) < k:
            raise UsageError(f"assignment uses devices {int(a.min())}..{int(a.max())}, the "
                             f"memory model counts {k}")
        return _memory_parts_kernel(a, state, saved, out, g.succ_ptr, g.succ_idx, g.succ_edge,
                                    self.edge_bytes, k)

    @cached_property
    def _node_bytes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per node, as floats: parameter state (x the optimizer's factor), saved
        activations, output (what :meth:`memory_parts` sums; made once per context)."""
        g = self.g
        return (g.param_bytes * self.factor, g.saved_bytes.astype(np.float64),
                np.asarray(g.out_bytes, np.float64))

    def memory(self, assignment: np.ndarray, inflight: np.ndarray | float | None = None,
               devices: int | None = None) -> np.ndarray:
        """Peak bytes per device (module docstring); ``inflight`` defaults to M."""
        return self.peak(self.memory_parts(assignment, devices), inflight)

    def peak(self, parts: tuple[np.ndarray, np.ndarray, np.ndarray],
             inflight: np.ndarray | float | None = None) -> np.ndarray:
        """:meth:`memory` from the assignment's :meth:`memory_parts`, when they are known."""
        static, act, trans = parts
        m = float(self.microbatches) if inflight is None else np.asarray(inflight, np.float64)
        return static + m * act + trans

    def fits(self, peak_bytes: np.ndarray) -> bool:
        return self.memory_bytes is None or bool((peak_bytes <= self.memory_bytes).all())


def received_bytes(g: Graph, assignment: np.ndarray, devices: int) -> np.ndarray:
    """Bytes of boundary tensors each device receives (one micro-batch; each tensor once, at
    its largest edge to that device). Compiled (:func:`_received_kernel`, which
    :meth:`Context.memory_parts` calls within its own pass)."""
    if g.num_edges == 0:
        return np.zeros(devices)
    return _received_kernel(g.num_nodes, g.succ_ptr, g.succ_idx, g.succ_edge,
                            np.asarray(g.edge_bytes, np.int64),
                            np.ascontiguousarray(assignment, dtype=np.int64), devices)


@njit
def max_by_device(a, values, devices):
    """Largest value per device (0 where a device holds nothing)."""
    out = np.zeros(devices, np.float64)
    for v in range(a.shape[0]):
        if values[v] > out[a[v]]:
            out[a[v]] = values[v]
    return out


@njit
def _memory_parts_kernel(a, state, saved, out_bytes, succ_ptr, succ_idx, succ_edge,
                         edge_bytes, devices):
    """:meth:`Context.memory_parts` in one call: per device the parameter state and the saved
    activations summed in node order (as ``np.bincount`` sums them), plus the received bytes
    (:func:`_received_kernel`), and the largest output."""
    static = np.zeros(devices, np.float64)
    act = np.zeros(devices, np.float64)
    for v in range(a.shape[0]):
        static[a[v]] += state[v]
        act[a[v]] += saved[v]
    if succ_idx.shape[0]:
        act += _received_kernel(a.shape[0], succ_ptr, succ_idx, succ_edge, edge_bytes, a,
                                devices)
    return static, act, max_by_device(a, out_bytes, devices)


@njit
def _received_kernel(n, succ_ptr, succ_idx, succ_edge, edge_bytes, a, devices):
    out = np.zeros(devices, np.float64)
    best = np.zeros(devices, np.float64)  # largest edge of this producer to each device
    for v in range(n):
        dv = a[v]
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            d = a[succ_idx[k]]
            eb = float(edge_bytes[succ_edge[k]])
            if d != dv and eb > best[d]:
                best[d] = eb
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            d = a[succ_idx[k]]
            if best[d] > 0.0:
                out[d] += best[d]
                best[d] = 0.0
    return out


def make_context(g: Graph, devices: int, *, cluster: Cluster | None = None,
                 optimizer: str = "adam", microbatches: int = 1,
                 memory_bytes: float | None = None) -> Context:
    """Check the arguments and prepare ``g`` for planning (see :class:`Context`)."""
    if not isinstance(devices, (int, np.integer)) or isinstance(devices, bool) or devices < 1:
        raise UsageError(f"devices must be a whole number >= 1, got {devices!r}: "
                         "pass e.g. devices=4")
    if not isinstance(microbatches, (int, np.integer)) or microbatches < 1:
        raise UsageError(f"microbatches must be a whole number >= 1, got {microbatches!r}")
    if memory_bytes is not None:
        if not np.isfinite(float(memory_bytes)) or float(memory_bytes) < 0:
            raise UsageError(f"memory_bytes must be a non-negative number of bytes, got "
                             f"{memory_bytes!r}: pass e.g. memory_bytes=16 * 2**30, or None "
                             "for no limit")
        memory_bytes = float(memory_bytes)
    devices = int(devices)
    if cluster is None:
        cluster = flat_cluster(devices, memory_bytes=memory_bytes or float("inf"))
    lat, inv = link_matrices(cluster, devices)
    # a cut starts a new piece on the receiving device, whose forward and backward each pay the
    # runtime's fixed per-piece cost: planners see it as link latency (half each way), so they
    # do not cut the graph into pieces smaller than that cost; the send and receive calls' host
    # time (a fixed part and one per byte, CPU workers) delays a message as the link does, and
    # planners see it as link latency and bandwidth too
    d = cluster.device
    piece_cost = 0.5 * (d.fwd_overhead_s + d.bwd_overhead_s)
    host = piece_cost + d.send_overhead_s + d.recv_overhead_s
    off = ~np.eye(devices, dtype=bool)
    if host > 0:
        lat = np.where(off, lat + host, lat)
    if d.send_byte_s + d.recv_byte_s > 0:
        inv = np.where(off, inv + d.send_byte_s + d.recv_byte_s, inv)
    return Context(g, devices, cluster, state_factor(optimizer), int(microbatches),
                   memory_bytes, lat, inv)
