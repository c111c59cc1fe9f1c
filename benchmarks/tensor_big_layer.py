"""A layer too big for one device, planned with tensor parallelism and trained (issue: tensor
parallelism, "a layer too big for one device").

A language model (outcore's zoo transformer, random init) whose embedding and output layer
(``--vocab`` x ``--d-model`` fp32 each) with Adam's state alone exceed the per-device limit
``--memory``: every split *between* layers is refused. ``outcore plan --tp auto`` is asked on
``--devices`` devices; the plan it returns is then trained with ``outcore.train`` for ``--steps``
steps on local gloo workers, and the measured peak per rank is printed beside the prediction.

    .venv/bin/python benchmarks/tensor_big_layer.py [--vocab 65536 --d-model 512 --memory 420MiB]

Writes ``benchmarks/results/tensor_big_layer.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).with_name("results")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=65536)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--memory", default="420MiB")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()

    import outcore
    from outcore.errors import InfeasibleError
    from outcore.units import parse_bytes

    model = (f"outcore:transformer:vocab={args.vocab},d_model={args.d_model},layers=1,heads=4,"
             "seq=32")
    limit = float(parse_bytes(args.memory))
    g = outcore.model_graph(model, batch_size=args.batch_size, costs="estimate")
    embed_state = args.vocab * args.d_model * 4 * 4  # fp32 weight, gradient, two Adam moments
    print(f"{model}: {g.total_param_bytes / 2**20:.0f} MiB of parameters; the embedding with "
          f"Adam's state alone {embed_state / 2**20:.0f} MiB; limit {args.memory} per device")
    try:
        outcore.plan(g, args.devices, args.memory, tp=1)
        refused = None
    except InfeasibleError as e:
        refused = str(e)
    print(f"without tensor parallelism: {'refused: ' + refused if refused else 'fits'}")
    p = outcore.plan(g, args.devices, args.memory, tp=None)
    for n in p.notes:
        if n.startswith("tp ") or n.startswith("--tp"):
            print("  " + n)
    with tempfile.TemporaryDirectory() as tmp:
        report = outcore.train(model, args.devices, memory=args.memory, tp=p.layout.tp,
                               batch_size=args.batch_size, microbatches=p.microbatches,
                               steps=args.steps, costs="estimate", run_dir=tmp)
    predicted = report.predicted["peak_bytes"]
    rows = []
    for r, peak in enumerate(report.peak_bytes):
        pred = predicted[r // report.plan.layout.tp]
        rows.append({"rank": r, "measured_peak_bytes": peak, "predicted_peak_bytes": pred,
                     "limit_bytes": limit, "fits": peak <= limit})
        print(f"rank {r}: peak {peak / 2**20:.2f} MiB measured, {pred / 2**20:.2f} MiB "
              f"predicted, limit {limit / 2**20:.0f} MiB -> {'fits' if peak <= limit else 'OVER'}")
    step_s = statistics.median(report.step_s[1:] or report.step_s)
    print(f"plan: {report.plan.strategy}, {report.plan.layout.describe()} on "
          f"{report.plan.devices} ranks; median step {step_s * 1e3:.0f} ms measured, "
          f"{report.predicted['iteration_s'] * 1e3:.0f} ms predicted; loss "
          f"{report.losses[0]:.4f} -> {report.losses[-1]:.4f}")
    RESULTS.mkdir(exist_ok=True)
    out = {"model": model, "memory": args.memory, "refused_without_tp": refused,
           "tp": report.plan.layout.tp, "strategy": report.plan.strategy, "ranks": rows,
           "median_step_s": step_s, "predicted_step_s": report.predicted["iteration_s"],
           "notes": list(p.notes)}
    (RESULTS / "tensor_big_layer.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
