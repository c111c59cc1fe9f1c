"""Simulated: where AxoNN's 2-D grid beats Megatron's 1-D layout, per MLP pair.

A GPT-style MLP pair (``hidden -> 4 hidden -> hidden``, bf16) of one micro-batch on ``tp`` A100s
(8 per node on NVLink3, one HDR InfiniBand port per GPU), priced by
:func:`outcore.cost.grid.best_grid` for every factorisation ``rows x cols`` of ``tp``
(rank ``r * cols + c``: column groups of consecutive ranks; 1-D is ``rows = 1``).

    .venv/bin/python benchmarks/tp_grid.py [--tokens 2048 8192] [--hidden 8192 12288]

Writes ``benchmarks/results/tp_grid.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from outcore.cost.grid import best_grid  # noqa: E402
from outcore.hardware.presets import device_preset, link_preset  # noqa: E402
from outcore.hardware.spec import Cluster  # noqa: E402

RESULTS = Path(__file__).with_name("results")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192],
                    help="activation rows of one micro-batch (sequences x length)")
    ap.add_argument("--hidden", type=int, nargs="+", default=[8192, 12288])
    ap.add_argument("--tp", type=int, nargs="+", default=[8, 16, 32, 64])
    args = ap.parse_args()
    rows = []
    print(f"{'hidden':>6} {'tokens':>6} {'tp':>3}  {'1-D ms':>8}  {'best grid':>9}  "
          f"{'ms':>8}  {'1-D / best':>10}  comm share (1-D, best)")
    for hidden in args.hidden:
        for tokens in args.tokens:
            for tp in args.tp:
                cl = Cluster(device=device_preset("a100"), nodes=max(tp // 8, 1),
                             devices_per_node=min(tp, 8), intra=link_preset("nvlink3"),
                             inter=link_preset("ib-hdr"), nics_per_node=8)
                costs = best_grid(tp, tokens, hidden, 4 * hidden, cl)
                one = next(c for c in costs if c.rows == 1)
                best = costs[0]
                rows.append({"hidden": hidden, "tokens": tokens, "tp": tp,
                             "one_d_s": one.total_s, "best": [best.rows, best.cols],
                             "best_s": best.total_s,
                             "all": [[c.rows, c.cols, c.comm_s, c.compute_s] for c in costs]})
                print(f"{hidden:>6} {tokens:>6} {tp:>3}  {one.total_s * 1e3:>8.3f}  "
                      f"{best.rows:>4} x {best.cols:<3}  {best.total_s * 1e3:>8.3f}  "
                      f"{one.total_s / best.total_s:>9.2f}x  "
                      f"{one.comm_s / one.total_s:.0%}, {best.comm_s / best.total_s:.0%}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "tp_grid.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
