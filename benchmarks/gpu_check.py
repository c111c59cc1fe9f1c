"""One GPU check anyone can run: outcore against plain PyTorch on one GPU, in one script.

Each row trains a model both ways (same model built from the same seed, batch, Adam, and
precision) and sets outcore's measured step and peak beside plain PyTorch's and beside what the
plan predicted:

* ``resnet50``: torchvision resnet50, batch 64, 224 px (profiled costs); then with ``--memory
  3GiB``, where the worker's caching allocator is capped at the limit (an overrun fails);
* ``gpt2``: Hugging Face GPT-2 (124M parameters, its real sizes), bf16-mixed, sequence 512;
* ``llama``: a small Hugging Face Llama, profiled and trained in bf16-mixed;
* ``offload``: an MLP whose parameters and Adam state exceed ``--memory``: the planner's
  offload policy must keep the measured peak inside it;
* ``refuse``: ``outcore train --devices 2`` on a machine with one GPU is refused in one line;
* ``tests``: the ``gpu``-marked tests (``pytest -m gpu``).

    PYTHONPATH=. python benchmarks/gpu_check.py            # on the GPU machine, < 8 min
    PYTHONPATH=. python benchmarks/gpu_check.py --tiny     # the script itself, small, on CPU
    PYTHONPATH=. python benchmarks/gpu_check.py --only resnet50 gpt2

Writes ``benchmarks/results/gpu_check.{json,md}`` (``gpu_check_tiny.*`` with ``--tiny``) after
every row, so a run cut short keeps what it measured. Peak memory is the caching allocator's
(``torch.cuda.max_memory_allocated``); on the CPU (``--tiny``) plain PyTorch's peak is not
measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
MiB = 2**20

# name -> (model, input shape or None, batch, precision, outcore options)
FULL = {
    "resnet50": ("torchvision:resnet50", (64, 3, 224, 224), 64, "32", {}),
    "resnet50 3GiB": ("torchvision:resnet50", (64, 3, 224, 224), 64, "32", {"memory": "3GiB"}),
    "gpt2": ("hf:gpt2:seq=512", None, 8, "bf16-mixed", {}),
    "llama": ("hf:llama:hidden_size=1024,intermediate_size=2816,num_hidden_layers=8,"
              "num_attention_heads=16,num_key_value_heads=4,vocab_size=32000,seq=512",
              None, 8, "bf16-mixed", {}),
    "offload": ("outcore:mlp:width=4096,layers=8,in_features=4096", None, 64, "32",
                {"memory": "1GiB", "memory_policy": "offload"}),
}
TINY = {
    "resnet50": ("torchvision:resnet18", (8, 3, 32, 32), 8, "32", {}),
    "resnet50 3GiB": ("torchvision:resnet18", (8, 3, 32, 32), 8, "32", {"memory": "1GiB"}),
    "gpt2": ("hf:gpt2:n_layer=2,n_embd=64,n_head=2,vocab_size=256,seq=32", None, 8,
             "bf16-mixed", {}),
    "llama": ("hf:llama:hidden_size=64,intermediate_size=128,num_hidden_layers=2,"
              "num_attention_heads=4,num_key_value_heads=2,vocab_size=256,seq=32",
              None, 8, "bf16-mixed", {}),
    "offload": ("outcore:mlp", None, 8, "32", {}),
}
ROWS = ("resnet50", "resnet50 3GiB", "gpt2", "llama", "offload", "refuse", "tests")


def _logits(out):
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, dict):
        return out.get("logits", next(iter(out.values())))
    return out[0] if isinstance(out, (tuple, list)) else out


def plain_step(model: str, shape, batch: int, precision: str, steps: int, device: str) -> dict:
    """A plain PyTorch loop on the same model (built from seed 0 as outcore builds it), batch
    and Adam, under autocast for a mixed precision: median step and peak memory."""
    import torch

    from outcore.hardware.precision import autocast
    from outcore.runtime.data import default_loss
    from outcore.zoo import build_model

    spec, net = build_model(model, input_shape=shape, batch_size=batch, seed=0)
    dev = torch.device(device)
    if dev.type == "cpu":
        torch.set_num_threads(1)  # as outcore's workers run
    net.to(dev).train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, foreach=True)
    x = tuple(t.to(dev) for t in spec.example_inputs)
    with torch.no_grad(), autocast(precision, dev):
        out = _logits(net(*x))
    target = torch.randint(0, out.shape[-1], out.shape[:-1], device=dev)
    times = []
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    for _ in range(steps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        with autocast(precision, dev):
            loss = default_loss(_logits(net(*x)), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    del net, opt, x
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"step_s": statistics.median(times[max(1, len(times) // 4):]), "peak_bytes": peak}


def outcore_step(model: str, shape, batch: int, precision: str, steps: int,
                 options: dict, costs: str) -> dict:
    import outcore

    with tempfile.TemporaryDirectory(prefix="gpucheck_") as run_dir:
        r = outcore.train(model, 1, batch_size=batch, input_shape=shape, steps=steps,
                          precision=precision, optimizer="adam", costs=costs, timeline=False,
                          run_dir=run_dir, **options)
    pred = r.per_rank("peak_bytes")
    return {"step_s": r.median_step_s, "predicted_step_s": r.predicted.get("iteration_s"),
            "peak_bytes": r.peak_bytes[0] if r.peak_bytes else None,
            "predicted_peak_bytes": pred[0] if pred else None,
            "limit_bytes": r.plan.memory_bytes,
            "layout": f"{r.plan.layout.mode} dp {r.plan.layout.dp} tp {r.plan.layout.tp}",
            "microbatches": r.config.planning.microbatches,
            "policies": sorted(set(r.plan.policies.policies)) if r.plan.policies else [],
            "losses": [r.losses[0], r.losses[-1]]}


def refuse_row() -> dict:
    """``--devices 2`` with one GPU: one line, exit 2, before any worker starts."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "outcore.cli.main", "train", "outcore:transformer",
                        "--devices", "2", "--steps", "1"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    lines = [x for x in p.stderr.strip().splitlines() if x.strip()]
    return {"exit": p.returncode, "stderr_lines": len(lines), "message": lines[-1] if lines else "",
            "wall_s": time.perf_counter() - t0,
            "ok": p.returncode == 2 and len(lines) == 1 and "NCCL" not in p.stderr}


def tests_row() -> dict:
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py",
                        "-p", "no:cacheprovider"], capture_output=True, text=True, timeout=400,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    tail = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-300:]
    return {"exit": p.returncode, "summary": tail, "ok": p.returncode == 0}


def _mib(x) -> str:
    return f"{x / MiB:.0f}" if x else "-"


def _ms(x) -> str:
    return f"{x * 1e3:.1f}" if x else "-"


def table(rows: dict, card: str) -> list[str]:
    lines = [f"GPU check on {card}", "",
             "| case | plain step (ms) | outcore step / predicted (ms) | ratio | plain peak (MiB) "
             "| outcore peak / predicted / limit (MiB) | notes |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"| {name} | | | | | | failed: {r['error'][:150]} |")
        elif name == "refuse":
            lines.append(f"| {name} | | | | | | exit {r['exit']}, {r['stderr_lines']} line(s): "
                         f"{r['message'][:120]} |")
        elif name == "tests":
            lines.append(f"| {name} | | | | | | {r['summary']} |")
        else:
            o, p = r["outcore"], r.get("plain") or {}
            ratio = o["step_s"] / p["step_s"] if p.get("step_s") else None
            lines.append(
                f"| {name} | {_ms(p.get('step_s'))} | {_ms(o['step_s'])} / "
                f"{_ms(o['predicted_step_s'])} | {f'{ratio:.2f}x' if ratio else '-'} | "
                f"{_mib(p.get('peak_bytes'))} | {_mib(o['peak_bytes'])} / "
                f"{_mib(o['predicted_peak_bytes'])} / {_mib(o['limit_bytes'])} | "
                f"{o['layout']}, {o['microbatches']} mb, {r['precision']}"
                + (f", {'/'.join(o['policies'])}" if o["policies"] else "") + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="small models on the CPU (checks the "
                    "script; no plain peak, no allocator cap)")
    ap.add_argument("--only", nargs="+", choices=ROWS, default=list(ROWS))
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    import torch

    cases = TINY if args.tiny else FULL
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    card = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({platform.processor()})"
    costs = "profile" if device == "cuda" else "estimate:cpu"
    stem = "gpu_check_tiny" if args.tiny else "gpu_check"
    out: dict = {}
    t_start = time.perf_counter()
    for name in args.only:
        t0 = time.perf_counter()
        try:
            if name == "refuse":
                if device != "cuda" or torch.cuda.device_count() != 1:
                    continue
                out[name] = refuse_row()
            elif name == "tests":
                out[name] = tests_row()
            else:
                model, shape, batch, prec, options = cases[name]
                row = {"model": model, "batch": batch, "precision": prec}
                if "memory" not in options:  # plain PyTorch has no limit to keep
                    row["plain"] = plain_step(model, shape, batch, prec, args.steps, device)
                row["outcore"] = outcore_step(model, shape, batch, prec, args.steps, options,
                                              costs)
                out[name] = row
        except Exception as e:  # one case failing is a row, not the end of the check
            out[name] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
                         if str(e).strip() else type(e).__name__}
        out.setdefault(name, {})["wall_s"] = time.perf_counter() - t0
        print(f"{name}: {json.dumps(out[name])[:400]}", flush=True)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{stem}.json").write_text(json.dumps(
            {"card": card, "torch": torch.__version__, "rows": out,
             "wall_s": time.perf_counter() - t_start}, indent=1))
        (RESULTS / f"{stem}.md").write_text("\n".join(table(out, card)) + "\n")
    print("\n".join(table(out, card)))
    print(f"wall {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
