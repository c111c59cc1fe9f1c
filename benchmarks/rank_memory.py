"""Host memory of each rank and of the planning process, for a model of ``--layers``
4096x4096 Linear layers (64 MiB each) trained on ``--devices`` pipeline ranks.

Each rank builds only the parameters its pieces hold (the model built without its weights,
then its part: ``outcore.zoo.weightless.built_in_part``). Printed per rank: its process peak
(``ru_maxrss``), its share (parameters, gradients and optimizer state of its layers), and the
rest: what the runtime itself takes (torch, gloo, the traced model, buffers, activations). A
tiny model on as many ranks gives the runtime's fixed part. The planning process's peak is
printed beside the model's bytes.

    PYTHONPATH=. .venv/bin/python benchmarks/rank_memory.py
    PYTHONPATH=. .venv/bin/python benchmarks/rank_memory.py --layers 8 --devices 4

Writes ``benchmarks/results/rank_memory.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
from pathlib import Path

import numpy as np

import outcore
from outcore.graph.io import load

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = '''
import torch
from torch import nn


def make():
    return nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(LAYERS)])


def tiny():
    return nn.Sequential(*[nn.Linear(512, 512) for _ in range(LAYERS)])
'''
MiB = 2**20


def _run(model: str, devices: int, tmp: str, tag: str, input_shape) -> tuple:
    """The run's report, the planning process's peak so far, and each rank's parameter bytes
    (from the plan's assignment of the graph it trained)."""
    report = outcore.train(model, devices, layout="given", microbatches=devices,
                           strategy="pipeline", batch_size=8, input_shape=input_shape,
                           steps=2, optimizer="sgd", momentum=0.0, costs="estimate:cpu",
                           timeline=False, run_dir=f"{tmp}/{tag}")
    g = load(f"{tmp}/{tag}/graph.json")
    assignment = np.asarray(report.plan.assignment)
    params = [int(g.param_bytes[assignment == r].sum()) for r in range(devices)]
    return report, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, params


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--devices", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "lin.py").write_text(MODEL.replace("LAYERS", str(args.layers)))
        tiny, _, _ = _run(f"{tmp}/lin.py:tiny", args.devices, tmp, "tiny",
                            (8, 512))
        big, planner, params = _run(f"{tmp}/lin.py:make", args.devices,
                                    tmp, "big", (8, 4096))
    model_bytes = args.layers * (4096 * 4096 + 4096) * 4
    rows = []
    for rank, peak in enumerate(big.host_peak_bytes):
        share = 2 * params[rank]  # parameters and their gradients (SGD without momentum)
        rows.append({"rank": rank, "host_peak": peak, "share": share,
                     "rest": peak - share, "tiny_model_peak": _at(tiny.host_peak_bytes, rank)})
        print(f"rank {rank}: process peak {peak / MiB:8.1f} MiB, share {share / MiB:7.1f} MiB, "
              f"rest {(peak - share) / MiB:6.1f} MiB; tiny model "
              f"{_at(tiny.host_peak_bytes, rank) / MiB:6.1f} MiB", flush=True)
    print(f"planning process peak {planner / MiB:.1f} MiB for a model of {model_bytes / MiB:.0f} "
          f"MiB", flush=True)
    RESULTS.mkdir(exist_ok=True)
    doc = {"layers": args.layers, "devices": args.devices, "model_bytes": model_bytes,
           "planner_peak": planner, "ranks": rows}
    (RESULTS / "rank_memory.json").write_text(json.dumps(doc, indent=1))
    lines = [f"{args.layers} x Linear(4096, 4096) ({model_bytes / MiB:.0f} MiB), "
             f"{args.devices} pipeline ranks, SGD without momentum",
             "", "| rank | process peak | parameters + gradients | rest | tiny model's peak |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['rank']} | {r['host_peak'] / MiB:.0f} MiB | {r['share'] / MiB:.0f} MiB | "
              f"{r['rest'] / MiB:.0f} MiB | {r['tiny_model_peak'] / MiB:.0f} MiB |" for r in rows]
    lines += ["", f"planning process peak: {planner / MiB:.0f} MiB"]
    (RESULTS / "rank_memory.md").write_text("\n".join(lines) + "\n")
    return 0


def _at(values: list, rank: int) -> float:
    return values[rank] if rank < len(values) else float("nan")


if __name__ == "__main__":
    raise SystemExit(main())
