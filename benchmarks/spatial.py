"""Spatial parallelism on this machine: peak tensor memory per rank and time per image against
the tile count (1, 2, 4), for a small conv net on large images, beside the tile memory predicted
by the pure cost functions (outcore/cost/spatial.py).

Each configuration runs on its own set of local gloo workers (one thread each); every rank
generates only its own tile of a synthetic image, trains ``--steps`` SGD steps after one warm-up,
and measures one step's peak with the CPU tensor tracker (outcore/hardware/memtrack.py: every
tensor an operator makes, parameters included; a lower bound of RSS). 1 tile is the plain model,
no outcore code. This machine has 2 cores: 4 ranks oversubscribe it, so time per image at 4 tiles
shows the halo/collective overhead plus contention, not a speed-up.

    .venv/bin/python benchmarks/spatial.py [--sizes 1024,2048] [--tiles 1,2,4] [--steps 2]

Writes ``benchmarks/results/spatial.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GRIDS = {1: "1x1", 2: "2x1", 4: "2x2"}
WIDTH = 8


def build_net():
    """Conv net for large images: 3x3 convs, BN, ReLU, two 2x2 max pools, a stride-2 conv,
    global average pool, classifier (the layers before ``fc`` run on tiles)."""
    import torch
    from torch import nn
    w = WIDTH
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
        nn.Conv2d(w, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(w, 2 * w, 3, padding=1, bias=False), nn.BatchNorm2d(2 * w), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * w, 2 * w, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * w, 10))


def predicted(size: int, tiles: int) -> dict:
    """Largest tile's saved activations and halo bytes received per forward, from
    outcore.cost.spatial.chain_costs: the input tile, every layer's output tile and, for the
    windowed layers on tiles, the border strips (halo + padding) they keep beside the tile
    (outcore.parallel.spatial.comm.lean_region)."""
    from outcore.cost.spatial import LayerGeometry, chain_costs, tile_activation_bytes
    from outcore.cost.spatial_geometry import TileGrid
    grid = TileGrid.parse(GRIDS[tiles])
    w = WIDTH
    conv = LayerGeometry(kind="conv", kernel=(3, 3), padding=(1, 1))
    conv2 = LayerGeometry(kind="conv", kernel=(3, 3), stride=(2, 2), padding=(1, 1))
    pool = LayerGeometry(kind="conv", kernel=(2, 2), stride=(2, 2))
    pw = LayerGeometry(kind="pointwise")
    layers = [(conv, 3, w), (pw, w, w), (pw, w, w), (conv, w, w), (pw, w, w), (pw, w, w),
              (pool, w, w), (conv, w, 2 * w), (pw, 2 * w, 2 * w), (pw, 2 * w, 2 * w),
              (pool, 2 * w, 2 * w), (conv2, 2 * w, 2 * w), (pw, 2 * w, 2 * w)]
    costs = chain_costs(layers, 1, (size, size), grid)
    act = max(tile_activation_bytes(1, 3, (size, size), grid))
    hw = (size, size)
    for (layer, cin, _), c in zip(layers, costs):
        act += c.out_bytes
        if tiles > 1 and c.region_bytes:
            act += max(0, c.region_bytes - max(tile_activation_bytes(1, cin, hw, grid)))
        hw = c.out_hw
    return {"activation_bytes": act, "halo_bytes": sum(c.halo_bytes for c in costs)}


def worker(ctx, size: int, tiles: int, steps: int):
    import torch
    import torch.nn.functional as F

    from outcore.hardware.memtrack import MemoryTracker
    from outcore.parallel.spatial import TileGrid, spatialize
    model = build_net()
    shape = (1, 3, size, size)
    grid = TileGrid.parse(GRIDS[tiles])
    if tiles > 1:
        model = spatialize(model, grid, example=torch.empty(shape), join="14")
        tile_shape = model.tile_shape()
    else:
        tile_shape = shape
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn(tile_shape, generator=gen)
    y = torch.tensor([3])

    def step():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if tiles > 1:
            model.reduce_gradients()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    base = list(model.parameters()) + [x]
    with MemoryTracker(torch.device("cpu"), baseline=base) as mt:
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"rank": ctx.rank, "peak_bytes": mt.peak_bytes, "step_s": statistics.median(times)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1024,2048")
    ap.add_argument("--tiles", default="1,2,4")
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args(argv)
    from outcore.runtime.launch import run_local
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        for tiles in [int(t) for t in args.tiles.split(",")]:
            t0 = time.perf_counter()
            res = run_local(worker, tiles, (size, tiles, args.steps), timeout_s=600,
                            overall_timeout_s=1800)
            pred = predicted(size, tiles)
            row = {"size": size, "tiles": tiles, "grid": GRIDS[tiles],
                   "peak_bytes_max": max(r["peak_bytes"] for r in res),
                   "peak_bytes": [r["peak_bytes"] for r in res],
                   "step_s": max(r["step_s"] for r in res),
                   "pred_activation_bytes": pred["activation_bytes"],
                   "pred_halo_bytes": pred["halo_bytes"], "wall_s": time.perf_counter() - t0}
            rows.append(row)
            print(f"{size}² {tiles} tiles ({row['grid']}): peak/rank "
                  f"{row['peak_bytes_max'] / 2**20:.0f} MiB (predicted activations "
                  f"{row['pred_activation_bytes'] / 2**20:.0f} MiB), {row['step_s']:.2f} s/image, "
                  f"halo {row['pred_halo_bytes'] / 2**10:.0f} KiB/forward", flush=True)
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "spatial.json").write_text(json.dumps(rows, indent=1))
    lines = ["| image | tiles | peak per rank (MiB) | predicted activations (MiB) | s / image | "
             "halo per forward (KiB) |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['size']}² | {r['tiles']} ({r['grid']}) | "
                     f"{r['peak_bytes_max'] / 2**20:.0f} | {r['pred_activation_bytes'] / 2**20:.0f}"
                     f" | {r['step_s']:.2f} | {r['pred_halo_bytes'] / 2**10:.0f} |")
    (out / "spatial.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
