"""Tensor parallelism inside a plan's stages equals single-process training.

A plan with ``layout.tp = 2`` runs every device slot as two processes holding shard 0 and 1 of
the slot's split layers (rank ``slot * 2 + t``); activations and gradients between stages go
shard to shard. Losses and every parameter (gathered whole) match plain PyTorch within 1e-5
relative after three SGD steps: one slot (tp 2 on 2 ranks), and pipeline 2 x tensor 2 on 4 ranks
(``slow``: four processes on this machine's two cores).
"""

from __future__ import annotations

import numpy as np
import pytest

from outcore.config import TrainConfig
from outcore.graph.io import to_dict as graph_doc
from outcore.plan.layout import Layout
from outcore.plan.plan import make_plan, to_dict as plan_doc
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import assert_matches, chunks, graph_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

MODEL = "outcore:transformer:layers=2"
VIT = "timm:vit_tiny_patch16_224:image_size=32,patch_size=8,embed_dim=32,depth=2,num_heads=2"
SWIN = ("timm:swin_tiny_patch4_window7_224:image_size=32,embed_dim=16,depths=(1,1),"
        "num_heads=(2,2),window_size=4,drop_path_rate=0.0")  # (timm default 0.1: random)
MLP_PAIRS = ["blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2"]


def _run(stages: int, tp: int, microbatches: int, schedule: str = "1f1b", model: str = MODEL,
         **worker):
    cfg = TrainConfig.make(model=model, batch_size=4 * microbatches, microbatches=microbatches,
                           steps=3, optimizer="sgd", lr=0.05, return_state=True,
                           track_memory=False, schedule=schedule, **worker)
    g = graph_for(cfg)
    plan = make_plan(g, chunks(g, stages), strategy="manual", devices=stages * tp,
                     memory_bytes=None, microbatches=microbatches, schedule=schedule,
                     layout=Layout(tp=tp))
    results = run_local(train_worker, stages * tp, (cfg, graph_doc(g), plan_doc(plan)),
                        timeout_s=120)
    return cfg, results


def test_tensor_parallel_slot_equals_single_process():
    cfg, results = _run(stages=1, tp=2, microbatches=2)
    assert_matches(results, *reference(cfg))
    # both shards ran the same (whole) piece list, with both blocks' MLP pairs split (the zoo
    # model's per-head projections do not pair, and alone they are under the 1 MiB threshold)
    assert results[0]["pieces"] == results[1]["pieces"]
    assert results[0]["tensor_split"] == MLP_PAIRS


def test_a_tensor_parallel_rank_builds_its_shards_a_layer_at_a_time():
    """With a build budget of one byte each split layer is built in its own pass and cut at
    once: the values are still the whole model's (training equals plain PyTorch), and no pass
    allocated more than the unsplit parameters plus one whole split layer."""
    cfg, results = _run(stages=1, tp=2, microbatches=2, build_batch_bytes=1)
    assert_matches(results, *reference(cfg))
    state = results[0]["state"]
    split = {k: v.numel() * v.element_size() for k, v in state.items()
             if k.rpartition(".")[0] in MLP_PAIRS}
    assert len(split) == 8  # weight and bias of four layers
    unsplit = sum(v.numel() * v.element_size() for k, v in state.items() if k not in split)
    for r in results:
        assert 0 < r["built_bytes"] <= unsplit + max(split.values()), \
            (r["built_bytes"], unsplit, split)


def test_timm_vit_fused_qkv_pairs_in_a_plan_and_equals_single_process():
    """timm's attention computes q, k and v with one Linear, reshaped to (b, t, 3, heads,
    head_dim): the plan splits it chunk by chunk (each rank its heads of q, k and v) and
    divides the module's num_heads and attn_dim."""
    pytest.importorskip("timm")
    cfg, results = _run(stages=1, tp=2, microbatches=2, model=VIT)
    assert_matches(results, *reference(cfg))
    split = results[0]["tensor_split"]
    for block in (0, 1):
        for layer in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"):
            assert f"blocks.{block}.{layer}" in split


def test_swin_window_attention_with_its_per_head_bias_pairs_and_equals_single_process():
    """Swin adds a relative position bias of shape (1, heads, n, n) to the scores: each rank
    slices it to its heads (the bias table's gradient summed over the group)."""
    pytest.importorskip("timm")
    cfg, results = _run(stages=1, tp=2, microbatches=2, model=SWIN)
    assert_matches(results, *reference(cfg))
    split = results[0]["tensor_split"]
    for layer in (0, 1):
        assert f"layers.{layer}.blocks.0.attn.qkv" in split
        assert f"layers.{layer}.blocks.0.attn.proj" in split


def test_a_tied_vocabulary_splits_by_rows_in_both_layers_and_equals_single_process():
    """An embedding tied to the output layer: both split the shared weight by vocabulary rows
    (the same shard, Megatron's vocabulary-parallel embedding and a column-split output with
    its logits gathered), so neither is left whole; training equals plain PyTorch."""
    cfg, results = _run(stages=1, tp=2, microbatches=2,
                        model="tests/runtime/tied_model.py:tied_lm_wide")
    assert_matches(results, *reference(cfg))
    assert {"embed", "head"} <= set(results[0]["tensor_split"]), results[0]["tensor_split"]
    shard = results[0]["state"]["embed.weight"]
    assert tuple(shard.shape) == (4096, 64)  # gathered whole for the comparison


def test_a_vocabulary_split_embedding_equals_single_process():
    """An untied 8192-word embedding and output layer (2 MiB each: split alone by rows)."""
    cfg, results = _run(stages=1, tp=2, microbatches=2,
                        model="outcore:transformer:layers=1,vocab=8192,d_model=64,heads=4,seq=8")
    assert_matches(results, *reference(cfg))
    assert {"embed", "head"} <= set(results[0]["tensor_split"]), results[0]["tensor_split"]


@pytest.mark.slow
def test_pipeline_2_x_tensor_2_equals_single_process():
    cfg, results = _run(stages=2, tp=2, microbatches=2)
    assert_matches(results, *reference(cfg))
    assert results[0]["pieces"] == results[1]["pieces"] != results[2]["pieces"]
    assert all(r["tensor_split"] == MLP_PAIRS for r in results)
    # each rank built its device slot's parameters (then kept its shards), not the model's
    state = {k: v for r in results for k, v in r["state"].items()}
    whole = sum(v.numel() * v.element_size() for v in state.values())
    assert all(0 < r["built_bytes"] < 0.75 * whole for r in results), \
        ([r["built_bytes"] for r in results], whole)


def test_tensor_parallel_costs_shrink_parameters():
    """The lowering costs a tp plan as one shard sees it: split layers hold half their
    parameters, and the split Linears take half their time plus their all-reduces."""
    from outcore.cost.tensor import tensor_graph
    from outcore.hardware.spec import LinkSpec

    cfg = TrainConfig.make(model=MODEL, batch_size=4, microbatches=1)
    g = graph_for(cfg)
    tg, layout = tensor_graph(g, 2, LinkSpec(bandwidth=1e9, latency_s=0.0))
    assert layout.pairs, "the transformer's MLP and attention blocks pair"
    split = [s.node for s in layout.splits if s.style != "whole"]
    np.testing.assert_allclose(tg.param_bytes[split], np.ceil(g.param_bytes[split] / 2))
    assert tg.meta["tp"] == 2 and tg.total_param_bytes < g.total_param_bytes


@pytest.mark.slow
@pytest.mark.parametrize("mode,stages,dp", [("mast", 2, 1)], ids=["mast"])
def test_replicas_and_data_parallel_outside_tensor_parallel(mode, stages, dp):
    """GEMS MAST (two replicas on two slots, each slot two tp ranks: 4 ranks): every stage's
    gradient bucket is all-reduced shard by shard between the two slots holding it. (Data
    parallelism, ``("mp", 1, 2)``, runs the same bucket code and passed too; it is left out
    of the default run for time.)"""
    replicas = 2 if mode == "mast" else 1
    copies = replicas * dp
    cfg = TrainConfig.make(model=MODEL, batch_size=4 * copies, microbatches=1, steps=3,
                           optimizer="sgd", lr=0.05, return_state=True, track_memory=False)
    g = graph_for(cfg, copies=copies)
    layout = Layout.replicate(mode, stages, replicas, dp, tp=2)
    plan = make_plan(g, chunks(g, stages), strategy="manual", devices=layout.ranks(stages),
                     memory_bytes=None, microbatches=1, schedule="1f1b", layout=layout)
    results = run_local(train_worker, plan.devices, (cfg, graph_doc(g), plan_doc(plan)),
                        timeout_s=120)
    assert_matches(results, *reference(cfg, chunks=copies))
    assert all(r["tensor_split"] == MLP_PAIRS for r in results)


@pytest.mark.slow
def test_a_tensor_parallel_checkpoint_resumes_on_one_device(tmp_path):
    """A checkpoint is keyed by parameter name: a tp 2 run's checkpoint resumes on one device,
    and the resumed steps equal uninterrupted single-process training (SGD with momentum, whose
    state is in the checkpoint too; 1e-5). Not Adam: the zoo model's attention-key biases have
    a vanishing gradient whose rounding noise Adam turns into full-size steps."""
    from outcore.runtime import checkpoint

    base = dict(model=MODEL, batch_size=4, microbatches=1, optimizer="sgd", lr=0.05,
                momentum=0.9, track_memory=False)
    ckpt = str(tmp_path / "ckpt")
    cfg = TrainConfig.make(**base, steps=2, checkpoint_dir=ckpt, checkpoint_every=2)
    g = graph_for(cfg)
    tp_plan = make_plan(g, chunks(g, 1), strategy="manual", devices=2, memory_bytes=None,
                        layout=Layout(tp=2))
    run_local(train_worker, 2, (cfg, graph_doc(g), plan_doc(tp_plan)), timeout_s=120)
    assert checkpoint.latest(ckpt)[0] == 2
    cfg = TrainConfig.make(**base, steps=4, checkpoint_dir=ckpt, resume=True, return_state=True)
    one = make_plan(g, chunks(g, 1), strategy="manual", devices=1, memory_bytes=None)
    resumed = run_local(train_worker, 1, (cfg, graph_doc(g), plan_doc(one)), timeout_s=120)
    ref_losses, ref_state = reference(cfg)
    assert_matches(resumed, ref_losses[2:], ref_state)


def test_a_fused_gate_and_up_projection_traced_by_fx_pairs_chunk_by_chunk():
    """The fx path's module split: the gate/up Linear's rows are sharded chunk by chunk (each
    rank its part of the gate and of the up projection), training equal to plain PyTorch."""
    from pathlib import Path
    model = str(Path(__file__).with_name("export_models.py")) + ":gated_mlp"
    cfg, results = _run(stages=1, tp=2, microbatches=2, model=model)
    assert_matches(results, *reference(cfg))
    assert results[0]["tensor_split"][:4] == ["gate_up.0", "down.0", "gate_up.1", "down.1"]
