"""Wall time per training step on local workers: the step as the report times it, and what a
step costs around it (the barrier before it, the step's figures after it, the data, the metrics).

For each model and micro-batch count: ``outcore.train`` for ``--steps`` steps; the wall time
per step is the mean interval between consecutive ``time`` stamps of ``metrics.jsonl`` after
``--skip`` steps (every tenth step measures peak memory and runs slower: it is in the mean, as
in any run), beside the median step the report gives. Small models in pipeline stages over up
to 2 workers (the pipeline planner may use one; the table says how many), where the runtime's
fixed costs per step are a large share of a step.

    PYTHONPATH=. .venv/bin/python benchmarks/step_wall.py
    PYTHONPATH=. .venv/bin/python benchmarks/step_wall.py --models mlp --mbs 1 --steps 300

Writes ``benchmarks/results/step_wall.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {"mlp": "outcore:mlp",
          "transformer": "outcore:transformer:layers=2,d_model=32,heads=2,seq=16,vocab=64"}


def cell(model: str, workers: int, mbs: int, steps: int, skip: int) -> dict:
    import outcore
    tmp = tempfile.mkdtemp(prefix="step_wall_")
    try:
        r = outcore.train(model, workers, batch_size=16, microbatches=mbs, steps=steps,
                          strategy="pipeline", run_dir=tmp, timeline=False, timeout=120.0,
                          layout="given")
        with open(r.files["metrics"]) as f:
            stamps = [json.loads(line)["time"] for line in f if line.strip()]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gaps = np.diff(stamps[skip:])
    return {"strategy": r.plan.strategy, "devices": r.plan.devices,
            "wall_per_step_s": float(gaps.mean()), "median_wall_s": float(np.median(gaps)),
            "median_step_s": r.median_step_s,
            "around_step_s": float(gaps.mean()) - r.median_step_s,
            "predicted_step_s": r.predicted.get("iteration_s")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mbs", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--skip", type=int, default=10, help="first steps left out (warm-up)")
    args = ap.parse_args(argv)
    if args.steps < args.skip + 2:
        ap.error("--steps must be at least --skip + 2")
    rows = []
    for name in args.models:
        for m in args.mbs:
            res = cell(MODELS[name], args.workers, m, args.steps, args.skip)
            res.update(model=name, workers=res["devices"], microbatches=m)
            rows.append(res)
            print(f"{name:12s} {res['devices']} workers {m} mbs ({res['strategy']}): wall "
                  f"{res['wall_per_step_s'] * 1e3:.2f} ms a step, the step itself "
                  f"{res['median_step_s'] * 1e3:.2f} ms (median), around it "
                  f"{res['around_step_s'] * 1e3:.2f} ms; median interval "
                  f"{res['median_wall_s'] * 1e3:.2f} ms", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "step_wall.json").write_text(json.dumps({"rows": rows}, indent=1))
    md = ["| model | workers | micro-batches | plan | wall per step (mean, ms) | "
          "interval (median, ms) | step (median, ms) | around the step (ms) |", "|---" * 8 + "|"]
    md += [f"| {r['model']} | {r['workers']} | {r['microbatches']} | {r['strategy']} | "
           f"{r['wall_per_step_s'] * 1e3:.2f} | {r['median_wall_s'] * 1e3:.2f} | "
           f"{r['median_step_s'] * 1e3:.2f} | {r['around_step_s'] * 1e3:.2f} |" for r in rows]
    (RESULTS / "step_wall.md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
