"""Where the runtime's time goes per piece and per message (issue: fine-grained placements).

A chain of tiny Linear+Tanh layers placed round-robin over 2 workers (every layer its own piece,
every edge a message), one micro-batch, against the same model on 1 worker. Each worker runs
``--steps`` steps, every other one traced, and the script reports, per action kind, the median
time per action (forward, backward, send, receive, optimizer; traced steps) and the median step
(untraced steps, as training runs), plus the per-piece
and per-message costs the simulator charges, so the two can be compared. In the same run it
measures the gloo one-way latency (ping-pong, as ``benchmarks/link_probe.py``) and the
runtime's per-piece cost (``outcore.runtime.overhead``, where that module exists) and simulates
the plan again with those measured figures ("calibrated" prediction).

    .venv/bin/python benchmarks/piece_overhead.py --layers 64 --steps 60
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).with_name("results")


def worker(ctx, cfg, graph_doc, plan_doc, steps):
    import torch

    from outcore.runtime.worker import build_trainer
    trainer, data = build_trainer(cfg, graph_doc, plan_doc, torch.device("cpu"))
    per_kind: dict[str, list[float]] = {}
    step_s, traced = [], 0
    for step in range(steps):
        inputs, targets = data.batch(step)
        if ctx.world_size > 1:
            torch.distributed.barrier()
        # every other step traced (per action kind); training runs untraced, so the step
        # time is taken on the untraced steps (a traced action costs ~1-2 us more)
        trace = step % 2 == 1
        t0 = time.perf_counter()
        report = trainer.step(inputs, targets, trace=trace, track_memory=False)
        if step >= steps // 4:  # after warm-up
            if not trace:
                step_s.append(time.perf_counter() - t0)
                continue
            traced += 1
            for e in report.events:
                per_kind.setdefault(e.kind, []).append(e.end_s - e.start_s)
    oneway = _pingpong(trainer) if ctx.world_size > 1 else None
    return {"rank": ctx.rank, "step_s": step_s, "traced_steps": traced, "oneway_s": oneway,
            "kinds": {k: (len(v), statistics.median(v), sum(v)) for k, v in per_kind.items()}}


def _pingpong(trainer, rounds: int = 300) -> float | None:
    """Mean one-way time of a small message between the two workers themselves, over the
    transport they trained on (``trainer.messenger.links``: same-host sockets), after the
    steps: the hand-off each hop of the chain pays."""
    import torch
    links = trainer.messenger.links
    if links is None:
        return None
    peer = 1 - trainer.rank
    buf = torch.zeros(8, 16)
    torch.distributed.barrier()
    t0 = time.perf_counter()
    for k in range(rounds):
        if trainer.rank == 0:
            links.send(peer, [buf], k)
            links.recv_into(peer, [buf], k, "ping-pong")
        else:
            links.recv_into(peer, [buf], k, "ping-pong")
            links.send(peer, [buf], k)
    links.flush()
    return (time.perf_counter() - t0) / rounds / 2


def measure(layers: int, devices: int, steps: int) -> dict:
    import outcore
    from outcore.config import TrainConfig
    from outcore.graph.io import to_dict as graph_doc
    from outcore.plan.plan import to_dict as plan_doc
    from outcore.runtime.launch import run_local

    model = f"outcore:mlp:layers={layers},width=16"
    cfg = TrainConfig.make(model=model, batch_size=8, microbatches=1, steps=steps, optimizer="sgd")
    g = outcore.model_graph(model, batch_size=8, costs="estimate:cpu")
    p = outcore.plan(g, devices, strategy="round-robin" if devices > 1 else "auto",
                     optimizer="sgd", device="cpu")
    results = run_local(worker, p.devices, (cfg, graph_doc(g), plan_doc(p), steps),
                        timeout_s=300, threads=1)
    sim = outcore.simulate(p, g)
    oneway = results[0].get("oneway_s")
    calibrated = _calibrated(p, g, oneway) if devices > 1 else sim.iteration_s
    return {"devices": p.devices, "calibrated_step_s": calibrated,
            "pieces": sim.to_dict()["pieces"],
            "transfers": sim.to_dict()["transfers"],
            "median_step_s": statistics.median(results[0]["step_s"]),
            "predicted_step_s": sim.iteration_s,
            "kinds": {r["rank"]: r["kinds"] for r in results},
            "traced_steps": results[0]["traced_steps"]}


def _calibrated(p, g, oneway_s: float | None = None) -> float:
    """The plan simulated with this run's measured link latency, per-piece cost and (same-host
    transport) per-message host cost."""
    import os
    import sys

    import outcore
    from outcore.hardware.cluster import make_cluster
    sys.path.insert(0, os.path.dirname(__file__))
    from outcore.runtime.overhead import piece_overhead_s
    over = piece_overhead_s()
    messages, transport = None, "gloo"
    try:
        from outcore.runtime.local_cluster import same_host_transport
        from outcore.runtime.overhead import message_overhead_s, samehost_latency_s
        if same_host_transport():
            transport = "same-host sockets"
            messages = message_overhead_s()
            try:
                from outcore.core.samehost import auto_spin_us
                echo = samehost_latency_s(auto_spin_us(2) * 1e-6)
            except (ImportError, TypeError):  # trees before the spin-aware probe
                echo = samehost_latency_s()
            # the link's own latency: the one-way time less the send and receive host times,
            # which the simulator charges on their own (as outcore train's local cluster)
            lat = max((oneway_s if oneway_s is not None else echo) - sum(messages), 1e-6)
            print(f"same-host one-way: between the workers {oneway_s and oneway_s * 1e6:.0f}"
                  f" us, echo probe {echo * 1e6:.0f} us")
    except ImportError:  # the tree before the same-host transport
        pass
    if transport == "gloo":
        from link_probe import measure as link_measure
        lat = link_measure(sizes=(4, 1 << 20), repeat=10)[0]
    cl = p.cluster_or_default()
    kwargs = {"overhead_s": over} if over else {}
    if messages:
        kwargs["message_overhead_s"] = messages
    cluster = make_cluster(p.devices, None, cl.intra.bandwidth, lat, device="cpu",
                           host_cores=cl.host_cores, **kwargs)
    print(f"measured now ({transport}): one-way {lat * 1e6:.0f} us, per-piece forward/backward "
          f"{'/'.join(f'{x * 1e6:.0f}' for x in over) if over else 'n/a'} us, per-message "
          f"send/receive {'/'.join(f'{x * 1e6:.0f}' for x in messages) if messages else 'n/a'}"
          " us")
    return outcore.simulate(p, g, cluster=cluster).iteration_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default=None, help="results JSON (default: results/)")
    args = ap.parse_args()
    rows = [measure(args.layers, d, args.steps) for d in (1, 2)]
    one, two = rows
    print(f"chain of {args.layers} layers, 1 micro-batch, median step: 1 worker "
          f"{one['median_step_s'] * 1e3:.2f} ms, 2 workers {two['median_step_s'] * 1e3:.2f} ms "
          f"({two['median_step_s'] / one['median_step_s']:.1f}x); predicted "
          f"{one['predicted_step_s'] * 1e3:.2f} / {two['predicted_step_s'] * 1e3:.2f} ms; "
          f"with this run's measured latency and per-piece cost "
          f"{two['calibrated_step_s'] * 1e3:.2f} ms (load {os.getloadavg()[0]:.1f})")
    for row in rows:
        print(f"{row['devices']} worker(s), {row['pieces']} pieces, {row['transfers']} "
              "transfers; per action kind on rank 0: count per step, median us, mean us, "
              "share of step")
        kinds = row["kinds"][0]
        total = sum(v[2] for v in kinds.values())
        own = sum(kinds[k][2] for k in ("F", "B", "send") if k in kinds)
        print(f"  rank 0's own work per step (F + B + send, traced; independent of the peer's "
              f"state): {own / max(row['traced_steps'], 1) * 1e3:.2f} ms")
        for kind, (count, med, tot) in sorted(kinds.items(), key=lambda kv: -kv[1][2]):
            steps = max(row["traced_steps"], 1)
            print(f"  {kind:10s} {count / steps:7.1f} {med * 1e6:9.1f} {tot / count * 1e6:9.1f} "
                  f"{tot / total:7.1%}")
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / "piece_overhead.json"
    out.write_text(json.dumps({"layers": args.layers, "steps": args.steps, "rows": rows},
                              indent=1, default=lambda x: x.tolist() if isinstance(x, np.ndarray)
                              else str(x)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
