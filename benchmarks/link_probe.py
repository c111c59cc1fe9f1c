"""Measure the link between two local workers over torch.distributed (gloo loopback here).

``python benchmarks/link_probe.py`` prints the latency and bandwidth of ping-pongs between
two spawned workers; ``outcore train`` on a CPU machine uses the stored figures of the
``gloo-loopback`` link preset, which came from this.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from outcore.runtime.launch import run_local


def _pingpong(ctx: Any, sizes: list[int], repeat: int) -> dict[int, float]:
    import torch
    import torch.distributed as dist

    out = {}
    for n in sizes:
        buf = torch.zeros(max(n // 4, 1))
        times = []
        dist.barrier()
        for k in range(repeat + 2):
            t0 = time.perf_counter()
            for _ in range(4):  # four round trips per sample
                if ctx.rank == 0:
                    dist.send(buf, 1)
                    dist.recv(buf, 1)
                else:
                    dist.recv(buf, 0)
                    dist.send(buf, 0)
            if k >= 2:
                times.append((time.perf_counter() - t0) / 8)
        out[n] = statistics.median(times)
    return out


def measure(sizes: tuple[int, ...] = (4, 1 << 16, 1 << 20, 1 << 22, 1 << 24),
            repeat: int = 10) -> tuple[float, float, dict[int, float]]:
    """(latency_s, bandwidth bytes/s, one-way seconds per size) of the loopback link."""
    res = run_local(_pingpong, 2, (list(sizes), repeat), timeout_s=60)[0]
    lat = res[sizes[0]]
    big = sizes[-1]
    bw = big / max(res[big] - lat, 1e-9)
    return lat, bw, res


if __name__ == "__main__":
    lat, bw, res = measure()
    for n, t in res.items():
        print(f"{n:>10} bytes: {t * 1e6:9.1f} us one way")
    print(f"latency {lat * 1e6:.1f} us, bandwidth {bw / 1e9:.2f} GB/s")
