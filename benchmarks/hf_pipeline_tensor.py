"""Hugging Face models under pipeline 2 x tensor 2 on 4 ranks, against one process.

Each model type is built tiny and random-init (hidden 32, 4 heads, 2 layers; ``hf:`` defaults),
captured through ``torch.export``, cut into 2 contiguous stages of equal node count, each stage
a slot of 2 tensor-parallel ranks (the plan's layout: Megatron pairs, fused q/k/v, per-head
operands, vocabulary splits found on the graph), and trained 3 steps of SGD (lr 0.05, momentum
0.9) on 4 gloo workers. The same model trains in one process (1 rank, no split) on the same
batches; the report gives the largest loss difference and, per parameter, the largest
difference relative to that parameter's largest entry (the equivalence tests' measure; the
single-process run itself equals plain PyTorch there).

    .venv/bin/python benchmarks/hf_pipeline_tensor.py [gpt2 llama ... | timm:<name>:<opts>]
        [--dtype float64]

Writes ``benchmarks/results/hf_pipeline_tensor.json`` (``..._selected.json`` for a chosen
list). About 15 s per model on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from outcore.config import TrainConfig  # noqa: E402
from outcore.graph.capture import capture  # noqa: E402
from outcore.graph.io import to_dict as graph_doc  # noqa: E402
from outcore.plan.layout import Layout  # noqa: E402
from outcore.plan.plan import make_plan, to_dict as plan_doc  # noqa: E402
from outcore.runtime.data import split  # noqa: E402
from outcore.runtime.launch import run_local  # noqa: E402
from outcore.runtime.worker import train_worker  # noqa: E402
from outcore.zoo import build_model  # noqa: E402

RESULTS = Path(__file__).with_name("results")
TYPES = ["gpt2", "llama", "t5", "bert", "opt", "bloom", "mpt", "falcon", "gemma", "bart",
         "mistral", "gpt_neox", "phi", "qwen2", "qwen3", "roberta", "deberta-v2", "mt5", "gptj",
         "codegen", "olmo", "stablelm", "electra", "distilbert", "xlm-roberta", "megatron-bert",
         "albert"]


def _docs(cfg: TrainConfig, stages: int, tp: int) -> tuple[dict, dict]:
    spec, model = build_model(cfg.graph.model, batch_size=cfg.graph.batch_size, seed=cfg.run.seed)
    micro = split(spec.example_inputs, cfg.planning.microbatches)[0]
    g = capture(model, micro, name=cfg.graph.model,
                path="export" if cfg.graph.model.startswith("hf:") else "auto")
    g = g.replace(fwd_s=np.full(g.num_nodes, 1e-3), bwd_s=np.full(g.num_nodes, 2e-3))
    a = np.minimum(np.arange(g.num_nodes) * stages // g.num_nodes, stages - 1)
    p = make_plan(g, a, strategy="manual", devices=stages * tp, memory_bytes=None,
                  microbatches=cfg.planning.microbatches, schedule="1f1b", layout=Layout(tp=tp))
    return graph_doc(g), plan_doc(p)


def compare(model: str) -> dict:
    cfg = TrainConfig.make(model=model, batch_size=4, microbatches=2, steps=3, optimizer="sgd",
                           lr=0.05, return_state=True, track_memory=False, timeout=120)
    t0 = time.perf_counter()
    one = run_local(train_worker, 1, (cfg, *_docs(cfg, 1, 1)), timeout_s=300)[0]
    four = run_local(train_worker, 4, (cfg, *_docs(cfg, 2, 2)), timeout_s=300)
    loss = max(float(np.max(np.abs(np.subtract(r["losses"], one["losses"])) /
                            np.abs(one["losses"]))) for r in four)
    worst, name = 0.0, ""
    for r in four:
        for k, v in r["state"].items():
            ref = one["state"][k]
            err = (v - ref).abs().max().item() / max(ref.abs().max().item(), 1e-3)
            if err > worst:
                worst, name = err, k
    return {"model": model, "loss_rel": loss, "param_rel": worst, "worst_param": name,
            "split": len(four[0].get("tensor_split") or []),
            "seconds": round(time.perf_counter() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("types", nargs="*", default=TYPES,
                    help="Hugging Face model types, or full model names (timm:vit_tiny_patch16_"
                         "224:image_size=32,...: captured through torch.fx where it can)")
    ap.add_argument("--dtype", default=None, help="float64: weights in double precision")
    args = ap.parse_args()
    rows = []
    print(f"{'model type':<14} {'split':>5} {'loss rel':>9} {'param rel':>9}  worst parameter")
    for t in args.types:
        model = (t if ":" in t else f"hf:{t}:hidden_size=32,intermediate_size=64,"
                 "num_attention_heads=4") + (f",dtype={args.dtype}" if args.dtype else "")
        try:
            r = compare(model)
        except Exception as e:  # report the failure per model and go on
            r = {"model": model, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"{t:<14} failed: {r['error']}", flush=True)
        else:
            print(f"{t:<14} {r['split']:>5} {r['loss_rel']:>9.1e} {r['param_rel']:>9.1e}  "
                  f"{r['worst_param']}", flush=True)
        rows.append(r)
    RESULTS.mkdir(exist_ok=True)
    name = "hf_pipeline_tensor" + (f"_{args.dtype}" if args.dtype else "") + \
        ("" if args.types == TYPES else "_selected") + ".json"  # a subset keeps the full run
    (RESULTS / name).write_text(json.dumps(rows, indent=1))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
