"""outcore's tensor-parallel step against the same model parallelised by hand, in one run.

Same model (outcore's zoo transformer, random init, same seed), same data, loss and optimizer
(SGD), ``--tp`` local gloo workers with one thread each, every worker fed the same batch.

* **1d**: ``outcore.parallel.tensor.tensor_parallel(model, tp, example_inputs=x)`` (layout found
from the
  graph: MLP blocks paired, embedding split by vocabulary, LM head split with a gather, layers
  under 1 MiB whole) against the torchtitan recipe written by hand with module names:
  ``parallelize_module`` with fc1 ``ColwiseParallel``, fc2 ``RowwiseParallel``, the embedding
  ``RowwiseParallel(input_layouts=Replicate())``, the head ``ColwiseParallel(output_layouts=
  Replicate())`` (the zoo model's per-head projections cannot be split by heads, so both keep
  attention whole).
* **depth**: ``tensor_parallel(..., mode="depth")`` against ``fully_shard`` by hand on every
  block and the root (torchtitan's FSDP recipe), each rank fed its slice of the batch.

Both variants live in the same worker processes and alternate in rounds (A B A B ...), so that
machine noise hits both; each round times ``--steps`` steps (after ``--warmup``); we report the
median step time of each and the ratio hand / outcore (>= 1: outcore is as fast).

    .venv/bin/python benchmarks/tensor_parallel.py [--tp 2 --rounds 3 --steps 10 --d-model 256]

Writes ``benchmarks/results/tensor_parallel.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _model(args):
    import torch

    from outcore.zoo.transformer import transformer
    torch.manual_seed(0)
    return transformer(layers=args.layers, d_model=args.d_model, heads=4, vocab=args.vocab,
                       seq=args.seq)


def _by_hand(model, mesh, mode: str) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    if mode == "depth":
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return
    plan = {"embed": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.fc1"] = ColwiseParallel()
        plan[f"blocks.{i}.fc2"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)


def _setup(ctx, args, variant: str, mode: str):
    """A model parallelised by ``variant``, its batch and one training step."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from outcore.parallel.tensor import tensor_parallel

    model = _model(args)
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    y = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    if mode == "depth":
        x, y = x.chunk(ctx.world_size)[ctx.rank], y.chunk(ctx.world_size)[ctx.rank]
    if variant == "outcore":
        tensor_parallel(model, ctx.world_size, mode=mode, example_inputs=x)
    else:
        _by_hand(model, init_device_mesh("cpu", (ctx.world_size,)), mode)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()

    split = getattr(model, "outcore_tensor_layout", None)
    return step, (list(split.split_modules) if split else None)


def _worker(ctx, args, mode: str) -> dict:
    """Both variants in the same processes, alternating rounds (A B A B ...)."""
    import torch

    steps, splits = {}, {}
    for variant in ("outcore", "hand"):
        steps[variant], splits[variant] = _setup(ctx, args, variant, mode)
        for _ in range(args.warmup):
            steps[variant]()
    times: dict[str, list[float]] = {"outcore": [], "hand": []}
    for _ in range(args.rounds):
        for variant in ("outcore", "hand"):
            torch.distributed.barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                steps[variant]()
            torch.distributed.barrier()
            times[variant].append((time.perf_counter() - t0) / args.steps)
    return {"times": times, "split": splits["outcore"]}


def main(argv=None) -> dict:
    from outcore.runtime.launch import run_local

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--modes", default="1d,depth")
    args = p.parse_args(argv)
    times: dict[str, dict[str, list[float]]] = {}
    splits = {}
    for mode in args.modes.split(","):
        res = run_local(_worker, args.tp, (args, mode), timeout_s=120, overall_timeout_s=900)
        # a round's time is its slowest rank's
        times[mode] = {v: [max(r["times"][v][k] for r in res) for k in range(args.rounds)]
                       for v in ("outcore", "hand")}
        splits[mode] = res[0]["split"]
    rows = []
    for mode, t in times.items():
        o, h = statistics.median(t["outcore"]), statistics.median(t["hand"])
        rows.append({"mode": mode, "outcore_step_s": o, "hand_step_s": h, "ratio": h / o,
                     "outcore_split": splits[mode]})
    result = {"args": vars(args), "rows": rows}
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "tensor_parallel.json").write_text(json.dumps(result, indent=2))
    lines = ["| mode | outcore step (ms) | by hand (ms) | hand / outcore |", "|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['outcore_step_s'] * 1e3:.1f} | {r['hand_step_s'] * 1e3:.1f} "
              f"| {r['ratio']:.2f}x |" for r in rows]
    (out / "tensor_parallel.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for r in rows:
        print(f"{r['mode']}: outcore split {r['outcore_split']}")
    return result


if __name__ == "__main__":
    main()
