"""Sharded data parallelism inside a plan: a model whose parameter state does not fit twice
(issue: tensor parallelism, "the depth (sharded) dimension").

A language model (outcore's zoo transformer, random init) whose parameters, gradients and Adam
state exceed the per-device limit ``--memory`` on each of ``--devices`` data-parallel copies:
``outcore plan --dp N`` is refused, ``--shard auto`` chooses a sharding degree that fits. The
plan is trained for ``--steps`` steps on local gloo workers; the measured peak per rank is
printed beside the prediction, and the median step time beside plain data parallelism without a
limit (the sharded step pays a gather per piece forward and backward and a reduce-scatter).

    .venv/bin/python benchmarks/shard_memory.py [--d-model 384 --layers 4 --memory 160MiB]

Writes ``benchmarks/results/shard_memory.json``.
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


def _train(model: str, args: argparse.Namespace, shard: int, memory: str | None):
    import outcore
    with tempfile.TemporaryDirectory() as tmp:
        return outcore.train(model, args.devices, memory=memory, dp=args.devices, shard=shard,
                             batch_size=args.batch_size, microbatches=1, steps=args.steps,
                             costs="estimate", run_dir=tmp, timeline=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--memory", default="160MiB")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()

    import outcore
    from outcore.errors import InfeasibleError
    from outcore.units import parse_bytes

    model = (f"outcore:transformer:vocab={args.vocab},d_model={args.d_model},"
             f"layers={args.layers},heads=4,seq=32")
    limit = float(parse_bytes(args.memory))
    g = outcore.model_graph(model, batch_size=args.batch_size // args.devices,
                            costs="estimate")
    state = g.total_param_bytes * 4  # fp32 weights, gradients, two Adam moments
    print(f"{model}: {g.total_param_bytes / 2**20:.1f} MiB of parameters, "
          f"{state / 2**20:.0f} MiB with gradients and Adam's state; limit {args.memory} on "
          f"each of {args.devices} data-parallel copies")
    try:
        outcore.plan(g, args.devices, args.memory, dp=args.devices, device="cpu")
        refused = None
    except InfeasibleError as e:
        refused = str(e).split("; ")[0]
    print(f"plain data parallelism: {'refused: ' + refused if refused else 'fits'}")
    # planned for the CPU workers it trains on (the default device is an accelerator, whose
    # parameters the planner may offload to the host; on a CPU that saves nothing)
    p = outcore.plan(g, args.devices, args.memory, dp=args.devices, depth=None, device="cpu")
    for n in p.notes:
        if n.startswith("depth ") or n.startswith("--shard"):
            print("  " + n)
    depth = p.layout.depth
    sharded = _train(model, args, depth, args.memory)
    plain = _train(model, args, 1, None)
    rows = []
    for r, peak in enumerate(sharded.peak_bytes):
        pred = sharded.predicted["peak_bytes"][r]
        rows.append({"rank": r, "measured_peak_bytes": peak, "predicted_peak_bytes": pred,
                     "limit_bytes": limit, "fits": peak <= limit,
                     "plain_dp_peak_bytes": plain.peak_bytes[r]})
        print(f"rank {r}: peak {peak / 2**20:.1f} MiB measured, {pred / 2**20:.1f} MiB "
              f"predicted, limit {limit / 2**20:.0f} MiB -> {'fits' if peak <= limit else 'OVER'}"
              f" (plain data parallel: {plain.peak_bytes[r] / 2**20:.1f} MiB)")
    step = {name: statistics.median(rep.step_s[1:] or rep.step_s)
            for name, rep in (("sharded", sharded), ("plain", plain))}
    print(f"median step: sharded {step['sharded'] * 1e3:.0f} ms "
          f"({sharded.predicted['iteration_s'] * 1e3:.0f} ms predicted), plain data parallel "
          f"{step['plain'] * 1e3:.0f} ms ({plain.predicted['iteration_s'] * 1e3:.0f} ms "
          f"predicted): {step['sharded'] / step['plain']:.2f}x; loss "
          f"{sharded.losses[0]:.4f} -> {sharded.losses[-1]:.4f} (plain "
          f"{plain.losses[0]:.4f} -> {plain.losses[-1]:.4f})")
    RESULTS.mkdir(exist_ok=True)
    out = {"model": model, "memory": args.memory, "refused_plain": refused, "depth": depth,
           "ranks": rows, "median_step_s": step,
           "predicted_step_s": {"sharded": sharded.predicted["iteration_s"],
                                "plain": plain.predicted["iteration_s"]},
           "losses": {"sharded": sharded.losses, "plain": plain.losses}, "notes": list(p.notes)}
    (RESULTS / "shard_memory.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
