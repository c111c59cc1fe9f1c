"""Memory fidelity by layout: each rank's measured peak tensor memory against the plan's
prediction, for every layout kind x a few models.

Each cell is one ``outcore.train`` (estimated CPU costs, 2 steps, SGD without momentum, batch
8, gloo workers on this machine); the peak is the tensor tracker's (``report.peak_bytes``), the
prediction the plan's (``report.per_rank("peak_bytes")``), both per rank. The checkpoint
cells (a pipeline, data parallelism, sharded data parallelism) give the plain layout's
predicted peak x 0.9 (else 0.95, 0.99, 0.995: the first met) as ``--memory`` with
``--memory-policy checkpoint``, so the plan must drop activations. A cell
is over when a rank's measured peak passes its prediction (a plan made for that prediction
would break its limit). CPU offload is
not a cell: on a CPU the host is the device (``--memory-policy offload`` saves nothing here).

    PYTHONPATH=. .venv/bin/python benchmarks/memory_layouts.py
    PYTHONPATH=. .venv/bin/python benchmarks/memory_layouts.py --models mlp --layouts dp tp
    PYTHONPATH=. .venv/bin/python benchmarks/memory_layouts.py --precision bf16-mixed

Writes ``benchmarks/results/memory_layouts.{json,md}`` (``memory_layouts_bf16-mixed.*`` for
another precision).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import outcore

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {"mlp": ("outcore:mlp", None),
          "lm": ("outcore:transformer:layers=2,d_model=64,heads=4,seq=16,vocab=2048", None),
          "cnn (bn)": ("outcore:resnet_k:depth=11,width=8", (8, 3, 32, 32)),
          "hf gpt2 (tied)": ("hf:gpt2:hidden_size=64", None)}
LAYOUTS = {"pipeline": (2, dict(strategy="pipeline", microbatches=2)),
           "dag": (2, dict(strategy="pardnn", microbatches=2)),
           "dp": (2, dict(dp=2)),
           "mast": (2, dict(parallel="mast")),
           "master": (4, dict(parallel="master")),
           "sp": (2, dict(sp=2)),
           "tp": (2, dict(tp=2)),
           "tp x pp": (4, dict(tp=2, strategy="pipeline", microbatches=2)),
           "sharded": (2, dict(dp=2, shard=2)),
           "checkpoint": (2, dict(strategy="pipeline", microbatches=2,
                                  memory_policy="checkpoint")),
           "dp ckpt": (2, dict(dp=2, memory_policy="checkpoint")),
           "sharded ckpt": (2, dict(dp=2, shard=2, memory_policy="checkpoint"))}
# the checkpointed cells and the plain layout whose predicted peak their limit is a share of
CHECKPOINTED = {"checkpoint": "pipeline", "dp ckpt": "dp", "sharded ckpt": "sharded"}
MiB = 2**20
# the checkpoint cell's limit: the first of these shares of the plain pipeline's predicted peak
# that a plan with checkpointing meets (a model whose largest stage is mostly parameters
# saves little by it)
CHECKPOINT_SHARES = (0.9, 0.95, 0.99, 0.995)
# a rank is over its prediction by more than this share and this many bytes (a rank that holds
# a few KiB is not judged by its ratio)
OVER, OVER_BYTES = 0.01, 16 * 1024


def _train(model: str, shape, devices: int, options: dict, precision: str = "32") -> dict:
    run_dir = tempfile.mkdtemp(prefix="memlayout_")
    try:
        r = outcore.train(model, devices, layout="given", batch_size=8, input_shape=shape,
                          steps=2, optimizer="sgd", momentum=0.0, costs="estimate:cpu",
                          timeline=False, run_dir=run_dir, precision=precision, **options)
    except Exception as e:  # a cell that cannot run is reported, not fatal
        return {"error": str(e).splitlines()[0][:160]}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    pred = [float(x) for x in r.per_rank("peak_bytes") if x is not None]
    meas = [float(x) for x in r.peak_bytes or []]
    ratios = [m / p for m, p in zip(meas, pred) if p > 0]
    return {"layout": str(r.plan.layout), "measured": meas, "predicted": pred,
            "worst_ratio": max(ratios) if ratios else None,
            "over": any(m > p * (1 + OVER) and m - p > OVER_BYTES for m, p in zip(meas, pred))}


def table(rows: list[dict], models: list[str], kinds: list[str]) -> list[str]:
    """Per model and layout: the peak rank's measured / predicted MiB and its error; over when
    a rank passes its prediction (by :data:`OVER` and :data:`OVER_BYTES`)."""
    lines = ["| model | " + " | ".join(kinds) + " |", "| --- |" + " ---: |" * len(kinds)]
    for name in models:
        cells = []
        for kind in kinds:
            r = next(x for x in rows if x["model"] == name and x["kind"] == kind)
            if "error" in r:
                cells.append("-")
                continue
            top = max(range(len(r["predicted"])), key=lambda i: r["predicted"][i])
            m, p = r["measured"][top], r["predicted"][top]
            over = any(a > b * (1 + OVER) and a - b > OVER_BYTES
                       for a, b in zip(r["measured"], r["predicted"]))
            cells.append(f"{m / MiB:.2f} / {p / MiB:.2f} ({m / p - 1:+.0%})"
                         + (" **over**" if over else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--precision", default="32", choices=("32", "bf16-mixed", "16-mixed"),
                    help="train every cell in this precision (outcore train --precision)")
    args = ap.parse_args()
    prec = args.precision
    rows = []
    for name in args.models:
        model, shape = MODELS[name]
        plain_peaks: dict[str, float] = {}
        for kind in args.layouts:
            devices, options = LAYOUTS[kind]
            options = dict(options)
            if kind in CHECKPOINTED:
                base = CHECKPOINTED[kind]
                if base not in plain_peaks:
                    plain_peaks[base] = max(_train(model, shape, devices,
                                                   dict(LAYOUTS[base][1]), prec)
                                            .get("predicted") or [0])
                plain_peak = plain_peaks[base]
                for share in CHECKPOINT_SHARES:  # the tightest limit checkpointing meets
                    options["memory"] = share * plain_peak if plain_peak else None
                    res = _train(model, shape, devices, options, prec)
                    if "error" not in res:
                        break
            else:
                res = _train(model, shape, devices, options, prec)
            if kind in CHECKPOINTED.values() and res.get("predicted"):
                plain_peaks[kind] = max(res["predicted"])
            res.update(model=name, kind=kind, devices=devices)
            rows.append(res)
            if "error" in res:
                print(f"{name:10s} {kind:10s}: {res['error']}", flush=True)
                continue
            print(f"{name:10s} {kind:10s}: measured / predicted per rank (MiB) "
                  + ", ".join(f"{m / MiB:.2f}/{p / MiB:.2f}"
                              for m, p in zip(res["measured"], res["predicted"]))
                  + f"; worst {res['worst_ratio']:.3f}" + (" OVER" if res["over"] else ""),
                  flush=True)
    RESULTS.mkdir(exist_ok=True)
    stem = "memory_layouts" + ("" if prec == "32" else f"_{prec}")
    (RESULTS / f"{stem}.json").write_text(json.dumps(rows, indent=1))
    lines = table(rows, args.models, [k for k in LAYOUTS if k in args.layouts])
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
