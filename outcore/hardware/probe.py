"""Measure the live device: achievable matmul FLOP/s, memory bandwidth, per-op overhead.

The result is a :class:`DeviceSpec` the analytical cost model can use like a data-sheet preset.
Because the matmul rate is *measured*, ``peak_flops`` is the achievable large-GEMM rate and
``efficiency`` is 1.0 (DeviceSpec defines efficiency relative to large GEMMs). Measurements use
the current ``torch.get_num_threads()`` (pass ``threads`` to change it for the probe only); an
outcore CPU worker runs one thread, so the shipped ``cpu`` preset is a one-thread measurement.
``launch_s`` is the forward of a tiny layer (1-element ReLU: module call + dispatch + launch +
autograd bookkeeping), the fixed cost every node pays in eager PyTorch; a bare op, a tiny Linear
and one backward call are kept in ``extra`` (``op_s``, ``linear_layer_s``, ``backward_call_s``).

Write a preset for this machine::

    python -m outcore.hardware.probe --threads 1 --out ~/.outcore/presets/cpu.json
    export OUTCORE_PRESETS=~/.outcore/presets
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from outcore.hardware.allocator import keep_heap
from outcore.hardware.presets import save_device_preset, spec_to_dict
from outcore.hardware.spec import DeviceSpec

log = logging.getLogger(__name__)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_s(fn: Callable[[], Any], device: torch.device, *, repeat: int, inner: int = 1,
            warmup: int = 1) -> float:
    """Best (minimum) over ``repeat`` runs of the time of one call (``inner`` calls per run).

    The minimum, not the median: other processes on a shared machine only ever add time, and the
    probe asks what the device *can* do.
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        times.append((time.perf_counter() - t0) / inner)
    return min(times)


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch threads (None: as they are), then restore the count."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def matmul_flops(device: torch.device, sizes: tuple[int, ...] = (256, 512, 1024),
                 repeat: int = 5) -> float:
    """Best fp32 FLOP/s of square matmuls ``n×n @ n×n`` (2n³ FLOPs each) over ``sizes``."""
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        out = torch.empty(n, n, device=device)
        t = _best_s(lambda: torch.mm(a, b, out=out), device, repeat=repeat)
        best = max(best, 2.0 * n ** 3 / t)
    return best


def copy_bandwidth(device: torch.device, nbytes: int = 64 * 2**20, repeat: int = 7) -> float:
    """Bytes/s of a large device-to-device copy, counting read + write (2 × ``nbytes``).

    ``nbytes`` (64 MiB per buffer) exceeds the last-level cache of current CPUs, so the copy
    streams from memory (STREAM "copy" convention, McCalpin 1995).
    """
    n = nbytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty(n, device=device)
    t = _best_s(lambda: dst.copy_(src), device, repeat=repeat)
    return 2.0 * nbytes / t


def op_overhead_s(device: torch.device, repeat: int = 7, inner: int = 2000) -> float:
    """Seconds of one tiny element-wise op (1-element add): dispatch + kernel launch."""
    a = torch.ones(1, device=device)
    b = torch.ones(1, device=device)
    return _best_s(lambda: torch.add(a, b), device, repeat=repeat, inner=inner)


def layer_overhead_s(device: torch.device, repeat: int = 7,
                     inner: int = 500) -> tuple[float, float, float]:
    """(ReLU forward, Linear forward, backward call) seconds of tiny layers on 1-element inputs.

    A 1-element ``nn.ReLU`` forward on an input that requires grad is what any layer costs in
    eager PyTorch before it does work: module call, dispatch, kernel launch, autograd node.
    A 1×1 ``nn.Linear`` adds weight handling (transpose, addmm). The backward-call figure is one
    ``torch.autograd.backward`` through the tiny Linear: the fixed cost the profiler adds to every
    node's measured backward (in a whole training step the engine runs once, not per node).
    """
    with torch.enable_grad():
        relu = torch.nn.ReLU()
        layer = torch.nn.Linear(1, 1).to(device)
        x = torch.ones(1, 1, device=device, requires_grad=True)
        relu_s = _best_s(lambda: relu(x), device, repeat=repeat, inner=inner)
        linear_s = _best_s(lambda: layer(x), device, repeat=repeat, inner=inner)
        grad = torch.ones(1, 1, device=device)

        def both() -> None:
            torch.autograd.backward(layer(x), grad)

        both_s = _best_s(both, device, repeat=repeat, inner=max(inner // 5, 1))
        layer.zero_grad(set_to_none=True)
    return relu_s, linear_s, max(both_s - linear_s, 0.0)


def _memory_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0


def free_memory_bytes(device: torch.device) -> float:
    """Bytes a process could still allocate on ``device``: the GPU's free memory, the host's
    available memory (``MemAvailable``); 0 when unknown."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return _memory_bytes(device)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(device: str = "cpu", *, threads: int | None = None, name: str | None = None,
            quick: bool = False) -> DeviceSpec:
    """Measure ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``) and return its :class:`DeviceSpec`.

    Args:
        device: torch device string.
        threads: intra-op threads during the probe (None: keep the current setting).
        name: preset name to give the spec (default: ``cpu`` or ``cuda``).
        quick: smaller sizes and fewer repeats (about 1 s on one CPU thread).
    """
    dev = torch.device(device)
    keep_heap()  # measure as the workers run (outcore.hardware.allocator)
    with torch_threads(threads), torch.no_grad():
        n_threads = torch.get_num_threads()
        sizes = (256, 512) if quick else (256, 512, 1024)
        flops = matmul_flops(dev, sizes, repeat=3 if quick else 5)
        bandwidth = copy_bandwidth(dev, (32 if quick else 64) * 2**20, repeat=5 if quick else 7)
        op_s = op_overhead_s(dev, repeat=5 if quick else 7, inner=500 if quick else 2000)
        launch, linear_s, backward_call = layer_overhead_s(dev, repeat=5 if quick else 7,
                                                           inner=200 if quick else 500)
    label = _cpu_model() if dev.type == "cpu" else torch.cuda.get_device_name(dev)
    stamp = datetime.date.today().isoformat()
    source = (f"measured by outcore.hardware.probe on {label}, {n_threads} thread(s), torch "
              f"{torch.__version__}, {stamp}: best fp32 matmul {flops / 1e9:.1f} GFLOP/s "
              f"(sizes {', '.join(map(str, sizes))}), {2 * (32 if quick else 64)} MiB copy "
              f"{bandwidth / 1e9:.1f} GB/s (read+write), tiny-layer forward {launch * 1e6:.1f} us "
              f"(1-element ReLU; Linear {linear_s * 1e6:.1f} us, bare add {op_s * 1e6:.2f} us, "
              f"backward call {backward_call * 1e6:.0f} us)")
    spec = DeviceSpec(
        name=name or dev.type, memory_bytes=_memory_bytes(dev), peak_flops=flops,
        mem_bandwidth=bandwidth, peak_flops_tc=0.0, launch_s=launch, efficiency=1.0,
        host_bandwidth=bandwidth if dev.type == "cpu" else 12e9,
        host_is_device=dev.type == "cpu",
        extra={"measured": True, "threads": n_threads, "device_model": label, "date": stamp,
               "op_s": op_s, "linear_layer_s": linear_s,
               "backward_call_s": backward_call, "source": source},
    )
    log.info("probe: %s", source)
    return spec


def measure_cpu(threads: int | None = None, *, quick: bool = False) -> DeviceSpec:
    """Measure this machine's CPU with ``threads`` threads (None: current setting); takes a few
    seconds."""
    return measure("cpu", threads=threads, quick=quick)


def main(argv: list[str] | None = None) -> int:
    """``python -m outcore.hardware.probe [--device cpu] [--threads 1] [--out cpu.json]``."""
    p = argparse.ArgumentParser(prog="python -m outcore.hardware.probe", description=__doc__
                                .splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--name", default=None, help="preset name (default: cpu / cuda)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None, help="write the preset JSON here (default: print it)")
    args = p.parse_args(argv)
    spec = measure(args.device, threads=args.threads, name=args.name, quick=args.quick)
    if args.out:
        save_device_preset(spec, args.out)
    else:
        print(json.dumps(spec_to_dict(spec), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
