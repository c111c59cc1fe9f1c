"""Peak memory per rank and time per image against the tile count (1, 2, 4), through plans.

The huge-image job's network (``benchmarks/spatial_job.py``: 3x3 convolutions with batch norm
at full resolution, two max pools, a stride-2 convolution, global pool, linear; batch 1, SGD)
trained with ``outcore.train`` (the CLI's road: capture, analytical costs, plan, local gloo
workers of one thread, the CPU tensor tracker's peak per rank) on 1 device (no tiles) and with
``--sp 2`` (2x1 tiles) and ``--sp 4`` (4x1) on 2 and 4 ranks, each image size; the join is
the planner's (no memory limit: the smallest estimated peak per rank) unless ``--join`` names
it. Prints measured beside predicted.

    .venv/bin/python benchmarks/spatial_sweep.py [--sizes 1024,2048] [--tiles 1,2,4] [--steps 3]

Writes ``benchmarks/results/spatial_sweep.{json,md}``. This machine has 2 cores shared with
other jobs: 4 ranks oversubscribe it, so the times are for orientation only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spatial_job import MODEL_SOURCE


def run(model: str, size: int, tiles: int, steps: int, join: str | None) -> dict:
    import outcore
    options = {"sp": tiles, "sp_join": join} if tiles > 1 else {}
    r = outcore.train(model, tiles, input_shape=f"1x3x{size}x{size}", batch_size=1,
                      microbatches=1, steps=steps, optimizer="sgd", lr=0.01,
                      costs="estimate:cpu", timeline=False, timeout=600.0, layout="given",
                      memory_policy="none", run_dir=tempfile.mkdtemp(prefix="spatial-sweep-"),
                      **options)
    return {"size": size, "tiles": tiles, "ranks": r.plan.devices,
            "join": r.plan.spatial.join if r.plan.spatial else None,
            "s_per_image": r.median_step_s, "predicted_s": r.predicted.get("iteration_s"),
            "losses": r.losses, "peak_bytes": r.peak_bytes,
            "predicted_peak_bytes": r.predicted.get("peak_bytes") or []}


def table(rows: list[dict]) -> list[str]:
    mib = 2.0 ** 20
    lines = [("| image | tiles | ranks | join | peak per rank, measured (MiB) | predicted (MiB) "
              "| largest peak vs 1 tile | s / image measured | predicted |"),
             "| --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: |"]
    base: dict[int, float] = {}
    for r in rows:
        top = max(r["peak_bytes"])
        base.setdefault(r["size"], top)
        lines.append(
            f"| {r['size']}² | {r['tiles']} | {r['ranks']} | {r['join'] or '-'} | "
            + ", ".join(f"{p / mib:.1f}" for p in r["peak_bytes"]) + " | "
            + ", ".join(f"{p / mib:.1f}" for p in r["predicted_peak_bytes"]) + " | "
            + f"{top / base[r['size']]:.2f}x | {r['s_per_image']:.2f} | "
            + f"{r['predicted_s']:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,2048")
    ap.add_argument("--tiles", default="1,2,4")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--join", default=None, help="join node for every tiled run")
    args = ap.parse_args()
    model_file = Path(tempfile.mkdtemp(prefix="spatial-sweep-model-")) / "net.py"
    model_file.write_text(MODEL_SOURCE)
    rows = [run(f"{model_file}:net", size, tiles, args.steps, args.join)
            for size in (int(s) for s in args.sizes.split(","))
            for tiles in (int(t) for t in args.tiles.split(","))]
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "spatial_sweep.json").write_text(json.dumps({"runs": rows}, indent=1))
    lines = table(rows)
    (out_dir / "spatial_sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
