"""Measured throughput of outcore's parallel modes on this machine, beside the simulator's
prediction, in one run: GEMS MP-Basic vs MAST vs MASTER, and (with --subgraph) SUPER sub-graph
parallelism vs data parallelism on a branchy model.

Every configuration trains the same model with the same micro-batch size per model replica on
two local workers (one thread each): MP-Basic splits it over the two; MAST adds a second
replica in reverse order on the same two devices, so each step processes twice the samples.
Throughput is the median samples/s over the steps after the first (`outcore.train`'s report).

    .venv/bin/python benchmarks/parallel_modes.py [--steps 8] [--subgraph]

Writes ``benchmarks/results/parallel_modes.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run(name: str, model: str, devices: int, batch: int, mbs: int, steps: int,
        **kw) -> dict:
    import outcore
    with tempfile.TemporaryDirectory() as tmp:
        rep = outcore.train(model, devices, batch_size=batch, microbatches=mbs, steps=steps,
                            run_dir=tmp, timeline=False, costs="profile", layout="given", **kw)
    pred = rep.predicted
    row = {"config": name, "model": model, "devices": devices, "batch": batch,
           "microbatches": mbs, "strategy": rep.plan.strategy,
           "parallel": rep.plan.layout.to_dict(),
           "measured_samples_per_s": rep.samples_per_s,
           "predicted_samples_per_s": pred.get("samples_per_s"),
           "measured_step_s": rep.median_step_s, "predicted_step_s": pred.get("iteration_s"),
           "peak_bytes": rep.peak_bytes, "predicted_peak_bytes": pred.get("peak_bytes")}
    print(f"{name}: {row['measured_samples_per_s']:.1f} samples/s measured, "
          f"{row['predicted_samples_per_s']:.1f} predicted", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--model", default="outcore:resnet_k:depth=29,width=16")
    ap.add_argument("--mb", type=int, default=8, help="samples per micro-batch per replica")
    ap.add_argument("--mbs", type=int, default=2, help="micro-batches per replica")
    ap.add_argument("--subgraph", action="store_true",
                    help="also SUPER sub-graph vs data parallel on outcore:transformer")
    ap.add_argument("--out", default="benchmarks/results/parallel_modes")
    args = ap.parse_args()
    per = args.mb * args.mbs
    rows = [
        run("MP-Basic", args.model, 2, per, args.mbs, args.steps, strategy="pipeline"),
        run("MAST", args.model, 2, 2 * per, args.mbs, args.steps, strategy="pipeline",
            parallel="mast"),
        run("data parallel (reference)", args.model, 2, 2 * per, args.mbs, args.steps,
            strategy="pipeline", dp=2),
    ]
    if args.subgraph:
        sub = "outcore:transformer:layers=2,d_model=128,heads=4,seq=32"
        rows += [
            run("SUPER sub-graph", sub, 2, per, args.mbs, args.steps, strategy="subgraph"),
            run("data parallel", sub, 2, per, args.mbs, args.steps, dp=2),
        ]
    lines = []
    groups = [(f"GEMS on {args.model} (reference: MP-Basic)", rows[:3])]
    if args.subgraph:
        groups.append((f"SUPER on {rows[3]['model']} (reference: data parallel)",
                       [rows[4], rows[3]]))
    for title, block in groups:
        base = block[0]["measured_samples_per_s"]
        base_p = block[0]["predicted_samples_per_s"]
        lines += [f"**{title}**", "",
                  "| configuration | devices | batch | measured samples/s | predicted "
                  "samples/s | measured vs reference | predicted vs reference |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in block:
            lines.append(f"| {r['config']} | {r['devices']} | {r['batch']} | "
                         f"{r['measured_samples_per_s']:.1f} | "
                         f"{r['predicted_samples_per_s']:.1f} | "
                         f"{r['measured_samples_per_s'] / base:.2f}x | "
                         f"{r['predicted_samples_per_s'] / base_p:.2f}x |")
        lines.append("")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(rows, indent=1))
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
