"""Dropout does not depend on placement: 1 rank and 2 ranks give the same losses and
parameters with dropout on, whatever the layout and however the batch is grouped into
micro-batches and copies (random nodes draw per sample, step and node; see
``outcore.core.randomness``)."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.config import TrainConfig
from outcore.graph.io import to_dict as graph_doc
from outcore.plan.layout import Layout
from outcore.plan.plan import make_plan, to_dict as plan_doc
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import assert_matches, chunks, docs_for, graph_for

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]


def _run(model: str, ranks: int, schedule: str, microbatches: int = 2, **layout):
    # SGD: Adam would blow an attention key bias's vanishing gradient (rounding) up to lr
    cfg = TrainConfig.make(model=model, batch_size=8, microbatches=microbatches, steps=3,
                           schedule=schedule, return_state=True, track_memory=False,
                           timeout=20, optimizer="sgd", lr=0.05)
    graph_doc, plan_doc, _ = docs_for(cfg, lambda g: chunks(g, ranks), ranks, **layout)
    copies = layout.get("replicas", 1) * layout.get("dp", 1)
    world = ranks * layout.get("dp", 1) if layout else ranks
    assert copies * microbatches <= 8
    return run_local(train_worker, world, (cfg, graph_doc, plan_doc), timeout_s=90)


def _assert_same(runs, one):
    for r in runs:
        np.testing.assert_allclose(r["losses"], one[0]["losses"], rtol=1e-6, atol=0)
        for k, v in r["state"].items():
            np.testing.assert_allclose(v.numpy(), one[0]["state"][k].numpy(), rtol=1e-5,
                                       atol=1e-7, err_msg=k)


def test_dropout_losses_equal_on_one_and_two_ranks():
    one = _run("tests/runtime/dropout_model.py:drop_mlp", 1, "1f1b")
    two = _run("tests/runtime/dropout_model.py:drop_mlp", 2, "gpipe")
    for r in two:
        np.testing.assert_allclose(r["losses"], one[0]["losses"], rtol=1e-6, atol=0)
        for k, v in r["state"].items():
            np.testing.assert_allclose(v.numpy(), one[0]["state"][k].numpy(), rtol=1e-5,
                                       atol=1e-7, err_msg=k)
    # dropout is really on: the same model without it trains differently
    plain = _run("tests/runtime/dropout_model.py:no_drop_mlp", 1, "1f1b")
    assert not np.allclose(plain[0]["losses"], one[0]["losses"], rtol=1e-3)


@pytest.mark.parametrize("model,layout", [
    ("drop_mlp", dict(parallel="mp", dp=2)), ("drop_mlp", dict(parallel="mast", replicas=2)),
    ("inplace_drop_mlp", dict(parallel="mp", dp=2)),
    ("attention_drop", dict(parallel="mp", dp=2)), ("encoder_drop", dict(parallel="mp", dp=2))],
    ids=["dp2", "mast", "in-place-dp2", "attention-dp2", "torch-encoder-layer-dp2"])
def test_dropout_masks_do_not_depend_on_how_the_batch_is_grouped(model, layout):
    """One rank with the whole batch as one micro-batch against data-parallel copies (4 chunks
    of 2 samples) and GEMS replicas: every sample draws its own mask (also a dropout that
    writes its input, the attention dropout inside ``scaled_dot_product_attention``, and the
    dropouts inside ``nn.TransformerEncoderLayer``, which capture exports to reach them)."""
    one = _run(f"tests/runtime/dropout_model.py:{model}", 1, "1f1b", microbatches=1)
    ranks = 1 if layout.get("dp") else 2
    _assert_same(_run(f"tests/runtime/dropout_model.py:{model}", ranks, "1f1b", **layout), one)


@pytest.mark.parametrize("model", [
    "tests/runtime/dropout_model.py:tp_drop_mlp",
    "timm:vit_tiny_patch16_224:image_size=32,patch_size=8,embed_dim=32,depth=1,num_heads=2,"
    "proj_drop_rate=0.2,attn_drop_rate=0.2,drop_rate=0.1"], ids=["mlp", "timm-vit"])
def test_dropout_on_tensor_parallel_shards_draws_one_devices_masks(model):
    """Dropout between a Megatron pair's layers sees a rank's columns (and attention dropout
    its heads): each rank draws the whole sample's mask and keeps its shard, so tp 2 trains as
    one rank does."""
    if model.startswith("timm:"):
        pytest.importorskip("timm")
    cfg = TrainConfig.make(model=model, batch_size=8, microbatches=2, steps=3, optimizer="sgd",
                           lr=0.05, return_state=True, track_memory=False, timeout=20)
    one = _run(model, 1, "1f1b")
    g = graph_for(cfg)
    plan = make_plan(g, chunks(g, 1), strategy="manual", devices=2, memory_bytes=None,
                     microbatches=2, schedule="1f1b", layout=Layout(tp=2))
    two = run_local(train_worker, 2, (cfg, graph_doc(g), plan_doc(plan)), timeout_s=120)
    assert two[0]["tensor_split"], "nothing was split: the test would not test tp"
    assert_matches(two, one[0]["losses"], one[0]["state"], rtol=1e-5)
