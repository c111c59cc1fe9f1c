"""Helpers for ecosystem-model tests: a graph and plan for a model name, and plain PyTorch
training of the unmodified model on the same batches (none of outcore's execution code)."""

from __future__ import annotations

import copy

import numpy as np
import torch

from outcore.config import TrainConfig
from outcore.core.values import value_metas
from outcore.graph.capture import capture, retrace
from outcore.graph.io import to_dict as graph_doc
from outcore.plan.plan import make_plan, to_dict as plan_doc
from outcore.runtime.data import SyntheticData, default_loss, split
from outcore.runtime.worker import make_optimizer
from outcore.zoo import resolve_model
from tests.runtime.helpers import accumulated_steps


def docs(cfg: TrainConfig, assign, devices: int, costs: str = "flat"):
    """(graph doc, plan doc, graph) of ``cfg.graph.model`` captured at the micro-batch shape."""
    spec = resolve_model(cfg.graph.model, input_shape=cfg.graph.input_shape,
                         batch_size=cfg.graph.batch_size)
    torch.manual_seed(cfg.run.seed)
    model = spec.build()
    micro = split(spec.example_inputs, cfg.planning.microbatches)[0]
    g = capture(model, micro, name=cfg.graph.model)
    if costs == "flat":
        g = g.replace(fwd_s=np.full(g.num_nodes, 1e-3), bwd_s=np.full(g.num_nodes, 2e-3))
    a = np.asarray(assign(g), dtype=np.int64)
    plan = make_plan(g, a, strategy="manual", devices=devices, memory_bytes=None,
                     microbatches=cfg.planning.microbatches,
                     schedule="1f1b" if cfg.planning.schedule == "auto" else cfg.planning.schedule)
    return graph_doc(g), plan_doc(plan), g


def output_of(out, key: str | None):
    """The tensor outcore trains on, from the model's own result."""
    if key is not None and not isinstance(out, torch.Tensor):
        return out[key]
    return out


def reference(cfg: TrainConfig, output_key: str | None):
    """Plain PyTorch: same seed and batches, the run's optimizer, gradient accumulation over
    the micro-batches.
    Returns (losses, parameters by name (a tied tensor under its first name))."""
    spec = resolve_model(cfg.graph.model, input_shape=cfg.graph.input_shape,
                         batch_size=cfg.graph.batch_size)
    torch.manual_seed(cfg.run.seed)
    model = copy.deepcopy(spec.build())
    micro = split(spec.example_inputs, cfg.planning.microbatches)[0]
    gm = retrace(copy.deepcopy(model), micro, {"capture": {"path": "auto"}}).gm
    out_name = next(n.name for n in gm.graph.nodes if n.op == "output")
    meta = value_metas(gm, micro)[out_name]
    data = SyntheticData(spec.example_inputs, spec.int_high, meta, cfg.graph.batch_size,
                         cfg.run.seed, spec.task, spec.task_options)
    opt = make_optimizer(cfg)(model.parameters())  # the run's optimizer, as the workers make it
    losses = accumulated_steps(model, opt, data.batch, cfg.run.steps, cfg.planning.microbatches,
                               lambda out, y: default_loss(output_of(out, output_key), y))
    # a tied tensor under the model's first name for it, as outcore names it on every rank
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}


def assert_close(results, ref_losses, ref_state, rtol: float):
    """Losses within ``rtol``; every parameter a rank holds within ``rtol`` of its largest entry;
    every parameter held by some rank."""
    for r in results:
        np.testing.assert_allclose(r["losses"], ref_losses, rtol=rtol, atol=0)
    seen = set()
    for r in results:
        for k, v in r["state"].items():
            ref = ref_state[k]
            scale = max(ref.abs().max().item(), 1e-2)
            err = (v - ref).abs().max().item()
            assert err <= rtol * scale, f"rank {r['rank']} {k}: error {err:.3g} > {rtol:g} x " \
                                        f"{scale:.3g}"
            seen.add(k)
    missing = [k for k in ref_state if k not in seen]
    assert not missing, f"parameters no rank holds: {missing[:5]}"


def llama_folder(folder, seed: int):
    """A tiny random Llama saved as a local Hugging Face checkpoint in ``folder``; returns the
    model (its weights are the folder's)."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=128, max_position_embeddings=64)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder)
    return model
