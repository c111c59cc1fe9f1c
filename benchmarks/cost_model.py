"""Benchmark the analytical cost model on this CPU (one thread).

1. Measure random grids of layers (``outcore.cost.calibrate.default_layers``: conv2d, depthwise
   conv2d, linear, pooling, batch norm, ReLU, add), split them 70/30 into training and held-out
   layers, and report the absolute % error on the held-out layers (median and 90th percentile,
   forward and backward) of: the regression fitted on the training layers (form chosen by
   cross-validation), the seed's raw polynomial, the uncalibrated roofline with the shipped
   ``cpu`` preset, and the roofline with the probe's spec measured now. The grid is measured
   twice; the two passes give the machine's repeatability (noise floor).
2. Whole models (resnet18 at batch 4, 224², and an outcore zoo model): predicted sum of node
   times vs the profiled sum and a timed training step.

Prints a table and writes ``benchmarks/results/cost_model.md`` and ``.json``.

    .venv/bin/python benchmarks/cost_model.py            # ~7 min
    .venv/bin/python benchmarks/cost_model.py --quick    # ~1.5 min
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from outcore.cost.analytical import estimate, layer_times
from outcore.cost.calibrate import default_layers, measure_layers
from outcore.cost.profile import profile
from outcore.cost.regression import CostModel, Sample, ape, family_of, fit, samples_from_graph
from outcore.graph.capture import capture
from outcore.hardware.presets import device_preset
from outcore.hardware.probe import measure_cpu
from outcore.hardware.spec import DeviceSpec
from outcore.zoo import resolve_model


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _stats(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    e = ape(pred, true)
    return {"fwd_p50": float(np.median(e[:, 0])), "fwd_p90": float(np.percentile(e[:, 0], 90)),
            "bwd_p50": float(np.median(e[:, 1])), "bwd_p90": float(np.percentile(e[:, 1], 90)),
            "n": int(len(true))}


def _truth(samples: Sequence[Sample]) -> np.ndarray:
    return np.array([[s.fwd_s, s.bwd_s] for s in samples])


def _roofline(samples: Sequence[Sample], spec: DeviceSpec) -> np.ndarray:
    out = []
    for s in samples:
        attrs = {"in_shapes": [list(x) for x in s.in_shapes], "shape": list(s.out_shape or []),
                 "config": s.config, "dtype": s.dtype}
        out.append(layer_times(s.op, attrs, spec, param_bytes=s.param_bytes,
                               out_bytes=4 * math.prod(s.out_shape or [0])))
    return np.array(out)


def _regression(samples: Sequence[Sample], model: CostModel) -> np.ndarray:
    return np.array([model.predict_sample(s) for s in samples], dtype=float)


def _min_of(a: Sequence[Sample], b: Sequence[Sample]) -> list[Sample]:
    """Per layer, the smaller of two measurements (contention only ever adds time)."""
    return [replace(x, fwd_s=min(x.fwd_s, y.fwd_s), bwd_s=min(x.bwd_s, y.bwd_s))
            for x, y in zip(a, b)]


def layer_benchmark(args: argparse.Namespace, probe_spec: DeviceSpec,
                    preset_spec: DeviceSpec) -> dict[str, Any]:
    warmup, repeat = (2, 3) if args.quick else (3, 5)
    layers = default_layers(args.quick, args.seed)
    t0 = time.perf_counter()
    say(f"measuring {len(layers)} layers twice (warmup {warmup}, repeat {repeat}) ...")
    first = measure_layers(layers, warmup=warmup, repeat=repeat, seed=args.seed)
    second = measure_layers(layers[::-1], warmup=warmup, repeat=repeat, seed=args.seed)[::-1]
    samples = _min_of(first, second)
    measure_s = time.perf_counter() - t0
    order = list(range(len(samples)))
    random.Random(args.seed).shuffle(order)
    cut = int(0.7 * len(order))
    train = [samples[i] for i in order[:cut]]
    test_idx = order[cut:]
    say(f"  {measure_s:.0f} s; fitting on {len(train)}, holding out {len(test_idx)}")
    model = fit(train, device="cpu", seed=args.seed)
    seed_model = fit(train, forms=("raw2",), device="cpu", seed=args.seed)
    methods = {
        "regression (CV-chosen form)": lambda ss: _regression(ss, model),
        "seed form: raw polynomial, degree 2": lambda ss: _regression(ss, seed_model),
        "roofline, shipped `cpu` preset": lambda ss: _roofline(ss, preset_spec),
        "roofline, probe measured now": lambda ss: _roofline(ss, probe_spec),
    }
    rows: list[dict[str, Any]] = []
    families = sorted({family_of(s.op, s.config) for s in samples},
                      key=lambda f: (f not in ("conv2d", "conv2d_grouped", "linear"), f))
    for fam in families:
        idx = [i for i in test_idx if family_of(samples[i].op, samples[i].config) == fam]
        fam_test = [samples[i] for i in idx]
        for name, predict in methods.items():
            rows.append({"method": name, "family": fam,
                         **_stats(predict(fam_test), _truth(fam_test))})
        rows.append({"method": "repeatability: 2nd measurement vs 1st", "family": fam,
                     **_stats(_truth([second[i] for i in idx]), _truth([first[i] for i in idx]))})
    return {"rows": rows, "model": model, "cv": model.cv, "chosen": model.summary(),
            "n_train": len(train), "n_test": len(test_idx), "measure_s": measure_s,
            "samples": [s.to_dict() for s in samples]}


def _per_node(pred: Any, prof: Any) -> dict[str, float]:
    mask = (prof.fwd_s > 0) & (prof.bwd_s > 0) & (pred.fwd_s > 0) & (pred.bwd_s > 0)
    true = np.column_stack([prof.fwd_s[mask], prof.bwd_s[mask]])
    est = np.column_stack([pred.fwd_s[mask], pred.bwd_s[mask]])
    e = ape(est, true)
    return {"node_fwd_p50": float(np.median(e[:, 0])), "node_bwd_p50": float(np.median(e[:, 1])),
            "nodes": int(mask.sum())}


def model_benchmark(spec_name: str, batch: int, args: argparse.Namespace,
                    estimators: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """Profile the model ``args.model_runs`` times; compare estimates with the medians."""
    warmup, repeat = (1, 3) if args.quick else (2, 5)
    spec = resolve_model(spec_name, batch_size=batch)
    torch.manual_seed(args.seed)
    net = spec.build()
    g = capture(net, spec.example_inputs, name=spec_name)
    runs = []
    for k in range(args.model_runs):
        say(f"profiling {spec_name} (batch {batch}, {g.num_nodes} nodes), run {k + 1}/"
            f"{args.model_runs} ...")
        runs.append(profile(g, net, spec.example_inputs, device="cpu", warmup=warmup,
                            repeat=repeat))
    prof = runs[0].replace(fwd_s=np.median([r.fwd_s for r in runs], axis=0),
                           bwd_s=np.median([r.bwd_s for r in runs], axis=0))
    sums = [r.total_compute_s for r in runs]
    steps = [r.meta["profile"]["step_s"] for r in runs]
    step_s, sum_s = float(np.median(steps)), float(np.median(sums))
    shape = "x".join(map(str, spec.example_inputs[0].shape))
    spread = (lambda xs: f"{min(xs) * 1e3:.0f}-{max(xs) * 1e3:.0f} ms") if len(runs) > 1 else \
        (lambda xs: "")
    rows = [{"model": spec_name, "input": shape, "method": "profiled (sum of nodes)",
             "sum_s": sum_s, "vs_profiled": 1.0, "vs_step": sum_s / step_s,
             "runs": spread(sums)},
            {"model": spec_name, "input": shape, "method": "timed training step",
             "sum_s": step_s, "vs_profiled": step_s / sum_s, "vs_step": 1.0,
             "runs": spread(steps)}]
    for name, fn in estimators.items():
        est = fn(g)
        total = est.total_compute_s
        rows.append({"model": spec_name, "input": shape, "method": name, "sum_s": total,
                     "vs_profiled": total / sum_s, "vs_step": total / step_s,
                     **_per_node(est, prof)})
    return rows, prof


def _fmt_pct(x: float) -> str:
    return f"{x:.0f}%" if x >= 10 else f"{x:.1f}%"


def render(result: dict[str, Any]) -> str:
    lines = ["# Cost model benchmark", "",
             f"Machine: {result['machine']}, torch {result['torch']}, 1 thread. "
             f"Command: `{result['command']}` ({result['elapsed_s']:.0f} s). Load average "
             f"(other processes on the 2 cores) {result['load'][0]:.1f} at the start, "
             f"{result['load'][1]:.1f} at the end.", "",
             f"Probe (measured now): {result['probe']['source']}", "",
             f"Shipped `cpu` preset: {result['preset']['source']}", "",
             "## Held-out layers", "",
             f"{result['layers']['n_train']} training and {result['layers']['n_test']} held-out "
             "layers drawn from one random grid; absolute % error of predicted vs measured time "
             "per layer. Every layer was measured twice (two passes over the grid, the second in "
             "reverse order), each time the median of several runs; the truth is the smaller of "
             "the two (other processes only add time), and the repeatability row compares the "
             "two passes.", "",
             "| family | method | n | fwd p50 | fwd p90 | bwd p50 | bwd p90 |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["layers"]["rows"]:
        lines.append(f"| {r['family']} | {r['method']} | {r['n']} | {_fmt_pct(r['fwd_p50'])} | "
                     f"{_fmt_pct(r['fwd_p90'])} | {_fmt_pct(r['bwd_p50'])} | "
                     f"{_fmt_pct(r['bwd_p90'])} |")
    lines += ["", "Forms chosen by 5-fold cross-validation on the training layers "
              "(CV median / p90 % error of every candidate):", ""]
    for fam, dirs in result["layers"]["cv"].items():
        for d, info in dirs.items():
            forms = ", ".join(f"{f} {v['p50']:.0f}/{v['p90']:.0f}"
                              for f, v in info["forms"].items())
            lines.append(f"- {fam} {d}: **{info['chosen']}** ({forms})")
    lines += ["", "## Whole models", "",
              f"Each model profiled {result['model_runs']} time(s); the profiled sum, the timed "
              "training step (forward + backward of the whole model) and each node's times are "
              "medians over the runs (range in brackets). Sum = sum of per-node forward + "
              "backward times; node p50 = median absolute % error per node against the "
              "profiled node times.", "",
              "| model | input | method | sum | vs profiled | vs step | node fwd p50 | "
              "node bwd p50 |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["models"]:
        node = (f"{_fmt_pct(r['node_fwd_p50'])} | {_fmt_pct(r['node_bwd_p50'])}"
                if "node_fwd_p50" in r else " | ")
        runs = f" ({r['runs']})" if r.get("runs") else ""
        lines.append(f"| {r['model']} | {r['input']} | {r['method']} | {r['sum_s'] * 1e3:.0f} ms"
                     f"{runs} "
                     f"| {r['vs_profiled']:.2f} | {r['vs_step']:.2f} | {node} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller grid, fewer repeats")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--zoo", default="outcore:amoebanet", help="second whole model")
    p.add_argument("--zoo-batch", type=int, default=16)
    p.add_argument("--model-runs", type=int, default=None,
                   help="profiling runs per whole model (default 3, 1 with --quick)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    if args.model_runs is None:
        args.model_runs = 1 if args.quick else 3
    load_start = os.getloadavg()[0]
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    say("probing the CPU (1 thread) ...")
    probe_spec = measure_cpu(threads=1)
    preset_spec = device_preset("cpu")
    layers = layer_benchmark(args, probe_spec, preset_spec)
    grid_model: CostModel = layers.pop("model")
    estimators = {
        "roofline, `cpu` preset": lambda g: estimate(g, preset_spec),
        "roofline, probe": lambda g: estimate(g, probe_spec),
        "regression (grid) + roofline (probe) for the rest":
            lambda g: estimate(g, probe_spec, model=grid_model),
    }
    models, prof18 = model_benchmark("torchvision:resnet18", 4, args, estimators)
    grid = [Sample.from_dict(d) for d in layers["samples"]]
    both = fit(grid + samples_from_graph(prof18), device="cpu", seed=args.seed)
    estimators["regression (grid + resnet18 layers, all ops) + roofline"] = \
        lambda g: estimate(g, probe_spec, model=both)
    zoo_rows, _ = model_benchmark(args.zoo, args.zoo_batch, args, estimators)
    models += zoo_rows
    result = {
        "machine": f"{platform.machine()} {probe_spec.extra.get('device_model', '')}",
        "torch": torch.__version__,
        "command": "benchmarks/cost_model.py" + (" --quick" if args.quick else ""),
        "elapsed_s": time.perf_counter() - t_start,
        "load": [load_start, os.getloadavg()[0]],
        "model_runs": args.model_runs,
        "probe": {"source": probe_spec.extra["source"], "peak_flops": probe_spec.peak_flops,
                  "mem_bandwidth": probe_spec.mem_bandwidth, "launch_s": probe_spec.launch_s},
        "preset": {"source": preset_spec.extra.get("source", ""),
                   "peak_flops": preset_spec.peak_flops,
                   "mem_bandwidth": preset_spec.mem_bandwidth, "launch_s": preset_spec.launch_s},
        "layers": {k: v for k, v in layers.items() if k != "samples"},
        "models": models,
    }
    text = render(result)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    (out / f"cost_model{suffix}.md").write_text(text)
    (out / f"cost_model{suffix}.json").write_text(json.dumps(
        {**result, "samples": layers["samples"]}, indent=1) + "\n")
    say(f"wrote {out / f'cost_model{suffix}.md'} and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
