"""Which planners belong in ``--strategy auto``: every planner's plan, simulated.

``outcore plan --strategy auto`` runs ``pardnn``, ``pipeline`` and ``subgraph`` and keeps the plan
the schedule simulator (the 1F1B schedule the runtime executes) finds fastest. HEFT wins some of
the emulated single-micro-batch comparisons of ``benchmarks/plan_quality.py``; this program asks
whether it would ever win inside ``auto``. Zoo models are traced with torch.fx and costed by the
analytical V100 model at a micro-batch of 8, on K = 2 and 4 devices (16 GB/s, 25 us) with 1 and 4
micro-batches and no memory limit.

    .venv/bin/python benchmarks/auto_portfolio.py    # ~15 s

Writes ``benchmarks/results/auto_portfolio.json`` and ``auto_portfolio.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import outcore.api as api
from outcore.errors import OutcoreError
from outcore.graph.capture import capture
from outcore.placers import auto_placers
from outcore.zoo import resolve_model

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("outcore:transformer:layers=4,d_model=256,heads=4,seq=32,vocab=512",
          "outcore:amoebanet", "outcore:lstm_lm", "torchvision:resnet50")
AUTO = auto_placers()
EXTRA = ("heft",)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    rows = []
    for name in MODELS:
        spec = resolve_model(name, batch_size=8)
        g = api.estimate(capture(spec.build(), spec.example_inputs, name=name), "v100")
        for K in (2, 4):
            for M in (1, 4):
                row = {"model": name, "nodes": g.num_nodes, "devices": K, "microbatches": M}
                for strategy in AUTO + EXTRA:
                    t0 = time.perf_counter()
                    try:
                        p = api.plan(g, K, strategy=strategy, microbatches=M, device="v100")
                        row[strategy] = p.predicted["iteration_s"]
                    except OutcoreError as e:
                        row[strategy] = None
                        row[f"{strategy}_error"] = str(e)
                    row[f"{strategy}_plan_s"] = time.perf_counter() - t0
                auto = min(row[s] for s in AUTO if row[s] is not None)
                row["auto"] = auto
                for s in EXTRA:
                    row[f"{s}_vs_auto"] = row[s] / auto if row[s] else math.nan
                rows.append(row)
                print(f"{name} K={K} M={M}: " + ", ".join(
                    f"{s} {row[s] * 1e3:.2f} ms" if row[s] else f"{s} -"
                    for s in AUTO + EXTRA) + f"; heft / auto {row['heft_vs_auto']:.2f}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "auto_portfolio.json").write_text(json.dumps(rows, indent=1))
    lines = ["| model | K | M | " + " | ".join(AUTO + EXTRA) + " | heft / auto |",
             "| --- | ---: | ---: | " + " | ".join("---:" for _ in AUTO + EXTRA) + " | ---: |"]
    for r in rows:
        cells = [f"{r[s] * 1e3:.2f} ms" if r[s] else "-" for s in AUTO + EXTRA]
        lines.append(f"| {r['model'].split(':')[1]} | {r['devices']} | {r['microbatches']} | "
                     + " | ".join(cells) + f" | {r['heft_vs_auto']:.2f}x |")
    ratios = [r["heft_vs_auto"] for r in rows if not math.isnan(r["heft_vs_auto"])]
    summary = (f"HEFT against auto's choice: {min(ratios):.2f}x to {max(ratios):.2f}x of its "
               f"simulated iteration time ({sum(x < 0.999 for x in ratios)} of {len(ratios)} "
               "configurations faster).")
    (RESULTS / "auto_portfolio.md").write_text(
        "# Planners inside auto (simulated iteration time, V100 costs)\n\n"
        + "\n".join(lines) + "\n\n" + summary + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
