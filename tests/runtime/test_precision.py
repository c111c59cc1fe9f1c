"""Mixed precision (``--precision bf16-mixed|16-mixed``) equals a plain PyTorch autocast loop.

The reference (``helpers.reference``) is the loop the PyTorch docs show: each micro-batch's
forward and loss under ``torch.autocast("cpu", dtype)``, the backward outside it, float32
parameters and optimizer, and for ``16-mixed`` a ``torch.amp.GradScaler``. Outcore runs every
piece's forward and loss under the same autocast, so the bfloat16 / float16 activations that
cross ranks are the very tensors the plain loop makes: losses and parameters match within
1e-5 relative on pipelines, tensor parallelism, data parallelism, sharding and checkpointing.
A ResNet's parameters after Adam match within 1e-2 (bfloat16's resolution: its split
gradients are summed in another order, and Adam turns a near-zero bias gradient's last bit
into a whole step). Where a bfloat16 tensor feeds several pieces, or a row-parallel layer
adds two partial sums, the sums are rounded in another order than one device's: there the
tolerance is bfloat16's (tensor parallelism below).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from outcore.config import TrainConfig
from outcore.graph.capture import capture
from outcore.graph.io import to_dict as graph_doc
from outcore.hardware.precision import LossScaler, autocast
from outcore.plan.layout import Layout
from outcore.plan.plan import make_plan, to_dict as plan_doc
from outcore.plan.policies import MemoryPolicies
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from outcore.zoo import build_model
from tests.runtime.helpers import assert_matches, chunks, docs_for, graph_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

LM = "outcore:transformer:layers=2"


def _cfg(model: str = LM, **kw):
    base = dict(model=model, batch_size=8, microbatches=2, steps=3, optimizer="adam",
                lr=1e-3, return_state=True, track_memory=False, precision="bf16-mixed")
    return TrainConfig.make(**{**base, **kw})


def _run_layout(cfg: TrainConfig, stages: int, layout: Layout, copies: int = 1):
    g = graph_for(cfg, copies=copies)
    plan = make_plan(g, chunks(g, stages), strategy="manual", devices=layout.ranks(stages),
                     memory_bytes=None, microbatches=cfg.planning.microbatches,
                     schedule="1f1b", layout=layout)
    return run_local(train_worker, plan.devices, (cfg, graph_doc(g), plan_doc(plan)),
                     timeout_s=120)


def test_bf16_pipeline_equals_the_autocast_loop():
    cfg = _cfg()
    graph, plan, _ = docs_for(cfg, lambda g: chunks(g, 2), 2)
    results = run_local(train_worker, 2, (cfg, graph, plan), timeout_s=120)
    assert_matches(results, *reference(cfg))


def test_fp16_backs_off_its_loss_scale_as_gradscaler_does(tmp_path):
    """A first scale of 2**30 overflows float16's gradients: the steps are skipped and the
    scale halves, step for step as ``torch.amp.GradScaler(init_scale=2**30)`` does, until the
    gradients fit; the parameters then equal the plain loop's."""
    metrics = tmp_path / "metrics.jsonl"
    cfg = _cfg("outcore:mlp", steps=12, optimizer="sgd", lr=1e-2, precision="16-mixed",
               loss_scale=2.0 ** 30, metrics_out=str(metrics))
    graph, plan, _ = docs_for(cfg, lambda g: chunks(g, 2), 2)
    results = run_local(train_worker, 2, (cfg, graph, plan), timeout_s=120)
    assert_matches(results, *reference(cfg))
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    skipped = [m["step"] for m in lines if m.get("skipped")]
    assert skipped and skipped == list(range(len(skipped))) and len(skipped) < cfg.run.steps
    assert [m["loss_scale"] for m in lines[:3]] == [2.0 ** 29, 2.0 ** 28, 2.0 ** 27]
    assert not any("nonfinite" in m for m in lines)  # an overflow is not a failure


def test_bf16_tensor_parallel_equals_the_autocast_loop():
    """A row-parallel layer's two partial sums are each rounded to bfloat16 before they are
    added, where one device rounds their sum once: losses within 1e-4, parameters within
    1e-3 of their largest entry plus 1e-5 (of SGD's steps of 0.05 x gradient; bfloat16
    rounds at 4e-3)."""
    cfg = _cfg(optimizer="sgd", lr=0.05)
    results = _run_layout(cfg, 1, Layout(tp=2))
    losses, state = reference(cfg)
    np.testing.assert_allclose(results[0]["losses"], losses, rtol=1e-4)
    assert_matches(results, losses, state, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("depth", [1, 2], ids=["dp2", "sharded2"])
def test_bf16_data_parallel_and_sharded_equal_the_autocast_loop(depth):
    cfg = _cfg(batch_size=8, microbatches=1)
    results = _run_layout(cfg, 1, Layout.replicate("mp", 1, 1, 2, depth=depth), copies=2)
    assert_matches(results, *reference(cfg, chunks=2))


@pytest.mark.parametrize("policy", ["checkpoint", "offload-activations", "offload-params"])
def test_bf16_memory_policies_equal_the_autocast_loop(policy):
    """A checkpointed piece recomputes under the autocast it was saved under; offloaded
    activations and parameters come back as they left."""
    cfg = _cfg()
    graph, plan, _ = docs_for(cfg, lambda g: chunks(g, 2), 2, policies=lambda g, a:
                              MemoryPolicies(np.where(a == 0, 0, -1), (policy,)))
    results = run_local(train_worker, 2, (cfg, graph, plan), timeout_s=120)
    assert_matches(results, *reference(cfg))


@pytest.mark.slow
def test_bf16_resnet_with_batch_norm_on_three_stages():
    cfg = _cfg("torchvision:resnet18:num_classes=10", input_shape=(8, 3, 32, 32))
    graph, plan, _ = docs_for(cfg, lambda g: chunks(g, 3), 3)
    results = run_local(train_worker, 3, (cfg, graph, plan), timeout_s=180)
    losses, state = reference(cfg)
    np.testing.assert_allclose(results[0]["losses"], losses, rtol=1e-5)
    assert_matches(results, losses, state, rtol=1e-2)


def test_capture_records_what_autocast_makes():
    """The graph's activation bytes and dtypes follow the precision (the memory model and
    the messages' sizes read them); parameters stay float32."""
    spec, model = build_model("outcore:mlp", batch_size=8, seed=0)
    x = spec.example_inputs
    g32 = capture(model, x)
    g16 = capture(model, x, precision="bf16-mixed")
    assert g16.meta["precision"] == "bf16-mixed" and g32.meta["precision"] == "32"
    linear = [i for i in range(g32.num_nodes) if g32.param_bytes[i] > 0]
    assert linear and all(g16.attr(i, "dtype") == "bfloat16" for i in linear)
    np.testing.assert_array_equal(g16.param_bytes, g32.param_bytes)
    assert g16.out_bytes[linear].sum() * 2 == g32.out_bytes[linear].sum()
    # what a linear layer saves for its backward: its input and its weight, both bfloat16
    assert 0 < g16.saved_bytes.sum() < g32.saved_bytes.sum() + g32.param_bytes.sum()


def test_loss_scaler_follows_gradscaler():
    """Scale after each of a sequence of overflows and good steps, as GradScaler's."""
    ours = LossScaler(scale=8.0, interval=3)
    theirs = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=3)
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.0)
    for overflow in [True, False, False, False, True, False, False, False, False]:
        theirs.scale(torch.ones(()))
        p.grad = torch.tensor([float("inf") if overflow else 1.0, 0.0])
        theirs.step(opt)
        theirs.update()
        ours.update(overflow)
        assert ours.scale == theirs.get_scale()
    grads = [torch.full((3,), 16.0)]
    ours.unscale(grads)
    assert torch.equal(grads[0], torch.full((3,), 16.0 / ours.scale))


def test_autocast_is_a_null_context_at_32():
    with autocast("32", "cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast("bf16-mixed", "cpu"):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_fp16_resumes_with_its_loss_scale(tmp_path):
    """The loss scale is checkpointed: a 16-mixed run resumed after a skipped step carries on
    with the backed-off scale, and ends where an uninterrupted run does."""
    ckpt = str(tmp_path / "ckpt")
    base = dict(model="outcore:mlp", optimizer="sgd", lr=1e-2, precision="16-mixed",
                loss_scale=2.0 ** 22, checkpoint_dir=ckpt)
    first = _cfg(**base, steps=2, checkpoint_every=2)
    graph, plan, _ = docs_for(first, lambda g: chunks(g, 2), 2)
    run_local(train_worker, 2, (first, graph, plan), timeout_s=120)
    metrics = tmp_path / "resumed.jsonl"
    cfg = _cfg(**base, steps=6, resume=True, metrics_out=str(metrics))
    resumed = run_local(train_worker, 2, (cfg, graph, plan), timeout_s=120)
    losses, state = reference(cfg)
    assert_matches(resumed, losses[2:], state)
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert lines[0]["step"] == 2 and lines[0]["loss_scale"] < 2.0 ** 22


def test_precision_names_and_refusals():
    from outcore.errors import PlanError, UsageError
    from outcore.runtime.worker import build_trainer
    from outcore.units import parse_precision

    assert [parse_precision(x) for x in ("32-true", "bf16", "16", "BF16-MIXED")] == \
        ["32", "bf16-mixed", "16-mixed", "bf16-mixed"]
    with pytest.raises(UsageError, match="float32 master weights"):
        parse_precision("bf16-true")
    # a graph captured in float32 does not train in bf16-mixed: its messages would be sized
    # for float32 tensors
    cfg = _cfg("outcore:mlp", precision="32")
    graph, plan, _ = docs_for(cfg, lambda g: chunks(g, 1), 1)
    with pytest.raises(PlanError, match="captured in precision 32"):
        build_trainer(_cfg("outcore:mlp"), graph, plan, torch.device("cpu"))


def test_no_allocator_cap_on_the_cpu():
    from outcore.runtime.worker import cap_allocator
    assert cap_allocator(torch.device("cpu"), 2**30) is None
