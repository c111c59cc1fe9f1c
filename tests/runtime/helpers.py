"""Shared helpers for runtime tests: plans from explicit assignments, and a plain single-process
PyTorch reference that does not use outcore's execution code."""

from __future__ import annotations

import copy

import numpy as np
import torch

from outcore.config import TrainConfig
from outcore.core.values import value_metas
from outcore.graph.capture import capture, trace
from outcore.graph.io import to_dict as graph_doc
from outcore.plan.layout import Layout
from outcore.plan.plan import make_plan, to_dict as plan_doc
from outcore.runtime.data import SyntheticData, default_loss, split
from outcore.zoo import build_model


def graph_for(cfg: TrainConfig, copies: int = 1):
    spec, model = build_model(cfg.graph.model, input_shape=cfg.graph.input_shape,
                              batch_size=cfg.graph.batch_size, seed=cfg.run.seed)
    micro = split(spec.example_inputs, cfg.planning.microbatches * copies)[0]
    g = capture(model, micro, name=cfg.graph.model, precision=cfg.graph.precision)
    # simple positive costs so the schedule builder has something to order by
    g = g.replace(fwd_s=np.full(g.num_nodes, 1e-3), bwd_s=np.full(g.num_nodes, 2e-3))
    return g


def docs_for(cfg: TrainConfig, assign, devices: int, *, parallel: str | None = None,
             replicas: int = 1, dp: int = 1, policies=None):
    """Graph and plan documents for ``assign(g) -> int64[n]`` on ``devices`` devices
    (optionally replicated: GEMS ``mast``/``master`` replicas and ``dp`` data-parallel
    copies; ``devices`` is then the model-parallel group size)."""
    g = graph_for(cfg, copies=replicas * dp)
    a = np.asarray(assign(g), dtype=np.int64)
    fields = {}
    if policies is not None:
        fields["policies"] = policies(g, a)
    total = devices
    if parallel is not None:
        layout = Layout.replicate(parallel, devices, replicas, dp)
        fields = {"layout": layout}
        total = layout.ranks(devices)
    plan = make_plan(g, a, strategy="manual", devices=total, memory_bytes=None,
                     microbatches=cfg.planning.microbatches,
                     schedule="1f1b" if cfg.planning.schedule == "auto"
                     else cfg.planning.schedule, **fields)
    return graph_doc(g), plan_doc(plan), g


def chunks(g, k: int) -> np.ndarray:
    """Contiguous equal-count stages over the graph's (topological) node order."""
    return np.minimum(np.arange(g.num_nodes) * k // g.num_nodes, k - 1)


def reference(cfg: TrainConfig, chunks: int | None = None, *, buffers: bool = False):
    """Plain PyTorch: same seed, same batches, gradient accumulation over ``chunks`` equal
    pieces of the global batch (default: the micro-batches). Returns the losses and the
    parameters (and, with ``buffers``, the buffers: batch-norm running statistics)."""
    chunks = chunks or cfg.planning.microbatches
    spec, built = build_model(cfg.graph.model, input_shape=cfg.graph.input_shape,
                              batch_size=cfg.graph.batch_size, seed=cfg.run.seed)
    model = copy.deepcopy(built)
    gm = trace(model).gm
    out_name = next(n.name for n in gm.graph.nodes if n.op == "output")
    meta = value_metas(gm, split(spec.example_inputs, chunks)[0])[out_name]
    data = SyntheticData(spec.example_inputs, spec.int_high, meta, cfg.graph.batch_size,
                         cfg.run.seed)
    if cfg.optim.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=cfg.optim.lr)
    losses = accumulated_steps(model, opt, data.batch, cfg.run.steps, chunks, default_loss,
                               precision=cfg.graph.precision, loss_scale=cfg.worker.loss_scale)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    if buffers:
        return losses, params, {k: b.detach().clone() for k, b in model.named_buffers()}
    return losses, params


def accumulated_steps(model, opt, batch_of, steps: int, chunks: int, loss_of,
                      precision: str = "32", loss_scale: float = 2.0 ** 16) -> list[float]:
    """Plain PyTorch training: for each step, ``batch_of(step) -> (inputs tuple, targets)``
    split into ``chunks`` equal pieces whose gradients accumulate, then one optimizer step.
    Returns the loss of each step (the sum of the pieces' ``loss_of(output, target) / chunks``).
    ``precision``: ``bf16-mixed`` / ``16-mixed`` run each forward and loss under
    ``torch.autocast`` (CPU), 16-mixed with ``torch.amp.GradScaler``, as the PyTorch docs
    show it (``loss_scale``: its first scale)."""
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cpu", init_scale=loss_scale) if precision == "16-mixed" \
        else None
    losses = []
    for step in range(steps):
        inputs, targets = batch_of(step)
        total = 0.0
        for x, y in zip(split(inputs, chunks), split(targets, chunks)):
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = loss_of(model(*x), y) / chunks
            (loss if scaler is None else scaler.scale(loss)).backward()
            total += loss.item()
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad()
        losses.append(total)
    return losses


def assert_matches(results, ref_losses, ref_state, rtol=1e-5, atol=0.0):
    """Losses within ``rtol`` relative; every parameter of every rank within ``rtol`` relative
    to the largest entry of that tensor (element-wise relative error is meaningless for
    entries that are zero up to rounding, e.g. attention key biases, whose gradient vanishes),
    plus ``atol``."""
    for r in results:
        np.testing.assert_allclose(r["losses"], ref_losses, rtol=rtol, atol=0)
    seen = set()
    for r in results:
        for k, v in r["state"].items():
            scale = max(ref_state[k].abs().max().item(), 1e-3)
            err = (v - ref_state[k]).abs().max().item()
            assert err <= rtol * scale + atol, \
                f"rank {r['rank']} parameter {k}: max error {err:.3g} > {rtol:g} x {scale:.3g}" \
                f" + {atol:g}"
            seen.add(k)
    assert seen == set(ref_state), f"parameters not held by any rank: {set(ref_state) - seen}"
