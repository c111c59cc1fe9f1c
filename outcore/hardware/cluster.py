"""Clusters from user-facing units, and their one JSON form (no torch).

A plan records the cluster it was made for (``Plan.cluster``); :func:`to_dict` and
:func:`from_dict` are the only serialisation of a :class:`Cluster`, so the simulator, the runtime
and the pictures all read back exactly the devices and links the planner saw.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from outcore.errors import FormatError, UsageError
from outcore.hardware.presets import device_preset, spec_from_dict
from outcore.hardware.spec import RUNTIME_OVERHEAD_S, Cluster, DeviceSpec, LinkSpec, flat_cluster
from outcore.units import parse_bandwidth, parse_bytes, parse_seconds

__all__ = ["from_dict", "make_cluster", "to_dict"]


def make_cluster(devices: int, memory: str | float | None = None,
                 bandwidth: str | float = "16GB/s", latency: str | float = "25us",
                 device: str | DeviceSpec | None = None,
                 host_cores: int | None = None,
                 overhead_s: tuple[float, float] | None = None,
                 message_overhead_s: tuple[float, float] | None = None,
                 collective_latency: str | float | None = None,
                 copy_on_send: bool = False, cold_start_s: float = 0.0,
                 message_byte_s: tuple[float, float] | None = None) -> Cluster:
    """A flat cluster of ``devices`` devices from user-facing units.

    Args:
        memory: per-device memory limit (``16GiB``; None: unlimited).
        bandwidth, latency: the link between any two devices (``16GB/s``, ``25us``).
        device: a device preset name or spec (default: a generic accelerator).
        host_cores: the devices are worker processes sharing this many CPU cores.

    The device carries outcore's runtime cost per piece: ``overhead_s`` (forward, backward;
    measured by :func:`outcore.runtime.overhead.piece_overhead_s`), else ``RUNTIME_OVERHEAD_S``;
    on an accelerator preset it overlaps the device's work (``DeviceSpec.host_overlap``).
    ``message_overhead_s``: the runtime's host time per message (send, receive; measured by
    :func:`outcore.runtime.overhead.message_overhead_s`), default none; ``message_byte_s``:
    what each byte of a message adds to them (send, receive), default none.
    ``collective_latency``: the link's latency for collectives when they travel another way
    than point-to-point messages (default: ``latency``); ``copy_on_send``: the transport copies
    a message out in the send call (see :class:`~outcore.hardware.spec.LinkSpec`);
    ``cold_start_s``: a CPU worker's re-warming after a wait (``DeviceSpec.cold_start_s``,
    measured by :func:`outcore.runtime.overhead.cold_start_s`), default none.
    """
    mem = float(parse_bytes(memory)) if memory is not None else math.inf
    if mem <= 0:
        raise UsageError(f"memory must be positive, got {memory!r}")
    spec = device if isinstance(device, DeviceSpec) else \
        device_preset(device) if device is not None else None
    fwd_o, bwd_o = overhead_s or RUNTIME_OVERHEAD_S
    # an accelerator preset's host work overlaps its device work (a CPU's is its compute)
    overlap = spec is not None and not spec.host_is_device
    spec = replace(spec or DeviceSpec("generic", mem, 1e13, 1e12),
                   fwd_overhead_s=fwd_o, bwd_overhead_s=bwd_o, host_overlap=overlap,
                   cold_start_s=float(cold_start_s))
    if message_overhead_s:
        spec = replace(spec, send_overhead_s=message_overhead_s[0],
                       recv_overhead_s=message_overhead_s[1])
    if message_byte_s:
        spec = replace(spec, send_byte_s=message_byte_s[0], recv_byte_s=message_byte_s[1])
    return flat_cluster(devices, memory_bytes=mem, bandwidth=parse_bandwidth(bandwidth),
                        latency_s=parse_seconds(latency), device=spec, host_cores=host_cores,
                        collective_latency_s=None if collective_latency is None
                        else parse_seconds(collective_latency), copy_on_send=copy_on_send)


def _device_dict(d: DeviceSpec) -> dict[str, Any]:
    return {"name": d.name, "memory_bytes": None if math.isinf(d.memory_bytes)
            else d.memory_bytes, "peak_flops": d.peak_flops, "mem_bandwidth": d.mem_bandwidth,
            "peak_flops_tc": d.peak_flops_tc, "launch_s": d.launch_s,
            "efficiency": d.efficiency, "host_bandwidth": d.host_bandwidth,
            "host_is_device": d.host_is_device, "fwd_overhead_s": d.fwd_overhead_s,
            "bwd_overhead_s": d.bwd_overhead_s, "host_overlap": d.host_overlap,
            "send_overhead_s": d.send_overhead_s, "recv_overhead_s": d.recv_overhead_s,
            "cold_start_s": d.cold_start_s, "send_byte_s": d.send_byte_s,
            "recv_byte_s": d.recv_byte_s, "extra": dict(d.extra)}


def to_dict(c: Cluster) -> dict[str, Any]:
    """The JSON form of a cluster (inverse of :func:`from_dict`)."""
    return {"device": _device_dict(c.device), "nodes": c.nodes,
            "devices_per_node": c.devices_per_node,
            "intra": _link_dict(c.intra), "inter": _link_dict(c.inter),
            "host_cores": c.host_cores, "nics_per_node": c.nics_per_node}


def _link_dict(link: LinkSpec) -> dict[str, Any]:
    doc = {"bandwidth": link.bandwidth, "latency_s": link.latency_s}
    if link.collective_latency_s is not None:
        doc["collective_latency_s"] = link.collective_latency_s
    if link.copy_on_send:
        doc["copy_on_send"] = True
    return doc


def _link(doc: Any, where: str) -> LinkSpec:
    try:
        coll = doc.get("collective_latency_s")
        return LinkSpec(float(doc["bandwidth"]), float(doc.get("latency_s", 25e-6)),
                        None if coll is None else float(coll),
                        bool(doc.get("copy_on_send", False)))
    except (KeyError, TypeError, ValueError):
        raise FormatError(f"{where}: a link needs a numeric 'bandwidth' (bytes/s) and "
                          "'latency_s'") from None


def from_dict(doc: Any, *, devices: int, memory_bytes: float | None,
              source: str = "cluster") -> Cluster:
    """A :class:`Cluster` from :func:`to_dict`'s form, or from the flat form of
    ``outcore-plan/1`` files (``bandwidth``, ``latency_s``, ``device``, ``peak_flops``, ...).

    ``devices`` sizes a flat cluster whose record says nothing of nodes; ``memory_bytes`` (the
    plan's limit; None: unlimited) is the device memory the simulator checks against.
    """
    mem = math.inf if not memory_bytes else float(memory_bytes)
    if not isinstance(doc, dict):
        raise FormatError(f"{source}: the cluster must be a JSON object")
    if isinstance(doc.get("device"), dict):
        dev = dict(doc["device"], memory_bytes=mem)
        spec = spec_from_dict(dev, where=source)
        cores = doc.get("host_cores")
        return Cluster(spec, nodes=int(doc.get("nodes", 1)),
                       devices_per_node=int(doc.get("devices_per_node", max(devices, 1))),
                       intra=_link(doc.get("intra", {}), source + ".intra"),
                       inter=_link(doc.get("inter", {}), source + ".inter"),
                       host_cores=int(cores) if cores else None,
                       nics_per_node=int(doc.get("nics_per_node", 1)))
    return _from_flat(doc, devices, mem)


def _from_flat(c: dict[str, Any], devices: int, mem: float) -> Cluster:
    """``outcore-plan/1``'s flat cluster record (every field optional)."""
    cores = c.get("host_cores")
    spec = DeviceSpec(str(c.get("device", "generic")), mem, float(c.get("peak_flops", 1e13)),
                      float(c.get("mem_bandwidth", 1e12)),
                      host_bandwidth=float(c.get("host_bandwidth", 12e9)),
                      host_is_device=bool(c.get("host_is_device", False)),
                      fwd_overhead_s=float(c.get("fwd_overhead_s", 0.0)),
                      bwd_overhead_s=float(c.get("bwd_overhead_s", 0.0)),
                      send_overhead_s=float(c.get("send_overhead_s", 0.0)),
                      recv_overhead_s=float(c.get("recv_overhead_s", 0.0)),
                      cold_start_s=float(c.get("cold_start_s", 0.0)),
                      send_byte_s=float(c.get("send_byte_s", 0.0)),
                      recv_byte_s=float(c.get("recv_byte_s", 0.0)))
    return flat_cluster(devices, memory_bytes=mem, bandwidth=float(c.get("bandwidth", 16e9)),
                        latency_s=float(c.get("latency_s", 25e-6)), device=spec,
                        host_cores=int(cores) if cores else None)
