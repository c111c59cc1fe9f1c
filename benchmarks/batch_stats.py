"""Batch-norm models on 2 devices against 1: the losses of the layout the search picks (no
layout option) beside one device's, with the same batch, micro-batches and seed.

Each model trains 4 steps at 64 px, batch 4, 2 micro-batches, SGD (outcore's defaults: lr
1e-3, momentum 0.9), costs estimated for this CPU; the 2-device run lets the search choose the
layout. With batch statistics ``global`` (the default) every layout takes the same samples per
statistic as one device, so the losses agree to float rounding (a cut moves where some
gradients are summed; with a large learning rate a model like ghostnet_050, whose batch norms
see 2 samples of a 2x2 map, amplifies that rounding to ~1e-3 by the fourth step: try
``--lr 0.05``); ``--batch-stats per-copy`` shows DDP's statistics.

    PYTHONPATH=. .venv/bin/python benchmarks/batch_stats.py
    PYTHONPATH=. .venv/bin/python benchmarks/batch_stats.py --models timm:resnet18 \\
        --batch-stats per-copy

Writes ``benchmarks/results/batch_stats.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import outcore

MODELS = ["timm:ghostnet_050", "timm:resnest14d", "timm:mobilenetv3_small_050",
          "timm:efficientnet_b0", "timm:regnetx_002", "timm:densenet121", "timm:resnet18",
          "outcore:resnet_k:depth=11,width=4"]
RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--batch-stats", default="global", choices=("global", "per-copy"))
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    common = dict(input_shape=(4, 3, 64, 64), batch_size=4, microbatches=2, steps=4,
                  optimizer="sgd", lr=args.lr, costs="estimate:cpu", timeline=False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, model in enumerate(args.models):
            one = outcore.train(model, 1, run_dir=f"{tmp}/{i}-one", **common)
            two = outcore.train(model, 2, run_dir=f"{tmp}/{i}-two",
                                batch_stats=args.batch_stats, **common)
            diff = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(one.losses, two.losses))
            lay = two.plan.layout
            layout = (f"dp {lay.dp} x {lay.mode}" + (f" x{lay.replicas}" if lay.replicas > 1
                                                      else "")
                      + f", {two.plan.microbatches} micro-batch(es) per copy")
            rows.append({"model": model, "layout": layout, "one": one.losses,
                         "two": two.losses, "max_rel_diff": diff})
            print(f"{model:36s} {layout:38s} max rel diff {diff:.1e}  "
                  f"1 device {[round(x, 5) for x in one.losses]}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    name = "batch_stats" if args.batch_stats == "global" else "batch_stats_per_copy"
    (RESULTS / f"{name}.json").write_text(json.dumps(rows, indent=1))
    lines = ["| model | layout chosen on 2 devices | losses, 1 device | max rel. diff |",
             "| --- | --- | --- | ---: |"]
    lines += [f"| {r['model']} | {r['layout']} | {', '.join(f'{x:.4f}' for x in r['one'])} | "
              f"{r['max_rel_diff']:.1e} |" for r in rows]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
