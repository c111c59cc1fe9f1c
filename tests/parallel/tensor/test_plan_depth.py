"""Sharded data parallelism inside a plan (``layout.depth``, FSDP / ZeRO-3) equals
single-process training.

Each data-parallel copy of a device slot holds ``1 / depth`` of the slot's parameters,
gradients and optimizer state; pieces gather their parameters before forward and backward and
reduce-scatter their gradients. Losses and every parameter (gathered whole) match plain PyTorch
within 1e-5 relative after three steps, with SGD and with Adam (whose state is sharded too;
on the MLP: Adam turns the transformer's vanishing attention-key-bias gradients, rounding noise,
into full-size steps, so no two summation orders agree there).
"""

from __future__ import annotations

import numpy as np
import pytest

from outcore.config import TrainConfig
from outcore.errors import UsageError
from outcore.graph.io import to_dict as graph_doc
from outcore.plan.layout import Layout
from outcore.plan.plan import make_plan, to_dict as plan_doc
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from outcore.schedule.lower import lower
from outcore.zoo import build_model
from tests.runtime.helpers import assert_matches, chunks, graph_for, reference

MODEL = "outcore:transformer:layers=2"


def _plan(g, stages: int, dp: int, depth: int, microbatches: int, tp: int = 1):
    layout = Layout.replicate("mp", stages, 1, dp, depth=depth, tp=tp)
    return make_plan(g, chunks(g, stages), strategy="manual", devices=stages * dp * tp,
                     memory_bytes=None, microbatches=microbatches, layout=layout)


def _run(stages: int, dp: int, depth: int, microbatches: int, optimizer: str = "sgd",
         model: str = MODEL, tp: int = 1, **worker):
    cfg = TrainConfig.make(model=model, batch_size=4 * microbatches * dp, microbatches=microbatches,
                           steps=3, optimizer=optimizer, lr=0.05 if optimizer == "sgd" else 1e-3,
                           return_state=True, track_memory=False, **worker)
    g = graph_for(cfg)
    plan = _plan(g, stages, dp, depth, microbatches, tp)
    results = run_local(train_worker, stages * dp * tp, (cfg, graph_doc(g), plan_doc(plan)),
                        timeout_s=120)
    return cfg, results


@pytest.mark.dist
@pytest.mark.timeout(300)
@pytest.mark.parametrize("optimizer,model", [("sgd", MODEL), ("adam", "outcore:mlp")])
def test_sharded_data_parallel_equals_single_process(optimizer, model):
    cfg, results = _run(stages=1, dp=2, depth=2, microbatches=2, optimizer=optimizer,
                        model=model)
    assert_matches(results, *reference(cfg))
    # every parameter of the one slot is sharded, the same ones on both copies
    assert results[0]["sharded"] == results[1]["sharded"] == sorted(results[0]["state"])


@pytest.mark.dist
@pytest.mark.timeout(400)
def test_pipeline_2_x_sharded_2_equals_single_process():
    """Each rank builds only its stage's parameters (built without weights, then its part),
    and the ones it shards a unit at a time once it holds their shards (a build budget of one
    byte), and still trains as one process."""
    cfg, results = _run(stages=2, dp=2, depth=2, microbatches=2, build_batch_bytes=1)
    assert_matches(results, *reference(cfg))
    assert results[0]["sharded"] == results[2]["sharded"] != results[1]["sharded"]
    _, whole = build_model(MODEL)
    whole_bytes = sum(p.numel() * p.element_size() for p in whole.parameters())
    built = [r["built_bytes"] for r in results]  # ranks d * 2 + s: copy d of stage s
    assert built[0] == built[2] and built[1] == built[3], built
    # no build held more than a quarter of the model (a stage's unsharded parameters, or one
    # unit of its sharded ones), though each stage holds about half of it
    assert all(0 < b < whole_bytes / 4 for b in built), (built, whole_bytes)


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_tensor_2_x_sharded_2_equals_single_process():
    """tp 2 inside each slot, its two copies sharding every tensor shard's parameters: rank
    ``d * 2 + t`` holds half of tensor shard ``t`` (AxoNN's tensor x depth on 4 ranks)."""
    cfg, results = _run(stages=1, dp=2, depth=2, microbatches=2, tp=2)
    assert_matches(results, *reference(cfg))
    assert results[0]["tensor_split"], "the MLP pairs are split"
    assert results[0]["sharded"] == results[2]["sharded"] == sorted(results[0]["state"])


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_hybrid_sharding_equals_single_process():
    """dp 4 x shard 2 (hybrid sharding): copies {0, 1} and {2, 3} each shard the parameters,
    and each shard's gradients are also all-reduced between the two groups."""
    cfg, results = _run(stages=1, dp=4, depth=2, microbatches=1, model="outcore:mlp")
    assert_matches(results, *reference(cfg))
    assert all(r["sharded"] == results[0]["sharded"] for r in results)


def test_sharding_lowers_memory_and_adds_collectives():
    """Costed per rank: the shards hold 1 / depth of the parameter state (buffers read
    through constant nodes stay whole), each piece's forward and backward pay the gather (and
    the backward the scatter), and the all-reduce of a fully sharded bucket costs nothing."""
    cfg = TrainConfig.make(model=MODEL, batch_size=8, microbatches=1)
    g = graph_for(cfg)
    plain = lower(g, _plan(g, 1, 2, 1, 1))
    sharded = lower(g, _plan(g, 1, 2, 2, 1))
    constants = float(np.asarray(g.out_bytes)[g.nodes_with_op("constant")].sum())
    np.testing.assert_allclose(sharded.costs.static_bytes - constants,
                               (plain.costs.static_bytes - constants) / 2, rtol=1e-6)
    assert sharded.costs.fwd_s.sum() > plain.costs.fwd_s.sum()
    assert len(sharded.pieces.pieces) > len(plain.pieces.pieces)  # gather units
    assert sharded.schedule.meta["bucket_sharded"] == (True,)
    assert sharded.schedule.meta["bucket_ring"] == (1,)


def test_depth_must_divide_data_parallel_copies():
    with pytest.raises(UsageError, match="must divide --dp"):
        Layout.replicate("mp", 2, 1, 3, depth=2)
    with pytest.raises(UsageError, match="GEMS replicas"):
        Layout.replicate("mast", 2, 2, 2, depth=2)


@pytest.mark.dist
@pytest.mark.timeout(300)
@pytest.mark.parametrize("resume_on", [2, 1], ids=["sharded-to-sharded", "sharded-to-one"])
def test_a_sharded_checkpoint_resumes(tmp_path, resume_on):
    """A sharded run saves whole parameters and Adam state by name (gathered from the shards):
    resumed sharded again (each shard sliced back) or on one device, the resumed steps equal
    uninterrupted single-process training within 1e-5."""
    from outcore.runtime import checkpoint

    base = dict(model="outcore:mlp", batch_size=8, microbatches=2, optimizer="adam", lr=1e-2,
                track_memory=False)
    ckpt = str(tmp_path / "ckpt")
    cfg = TrainConfig.make(**base, steps=2, checkpoint_dir=ckpt, checkpoint_every=2)
    g = graph_for(cfg)
    run_local(train_worker, 2, (cfg, graph_doc(g), plan_doc(_plan(g, 1, 2, 2, 2))),
              timeout_s=120)
    assert checkpoint.latest(ckpt)[0] == 2
    cfg = TrainConfig.make(**base, steps=4, checkpoint_dir=ckpt, resume=True, return_state=True)
    plan = _plan(g, 1, 2, 2, 2) if resume_on == 2 else \
        make_plan(g, chunks(g, 1), strategy="manual", devices=1, memory_bytes=None,
                  microbatches=2)
    resumed = run_local(train_worker, resume_on, (cfg, graph_doc(g), plan_doc(plan)),
                        timeout_s=120)
    ref_losses, ref_state = reference(cfg)
    assert all(len(r["losses"]) == 2 for r in resumed)
    assert_matches(resumed, ref_losses[2:], ref_state)


def test_the_layout_search_shards_copies_that_do_not_fit_whole():
    """``--layout auto`` enumerates sharding: on 2 devices under 160 MiB, two plain copies of a
    51 MiB-parameter LM (205 MiB with Adam) are pruned by their memory floor without memory
    policies, and two copies sharding it fit (the second pass, with policies, may find plain
    copies that offload faster); sharding is never tried where plain copies fit."""
    import outcore

    g = outcore.model_graph("outcore:transformer:d_model=384,layers=4,vocab=8192",
                            batch_size=8, costs="estimate")
    p = outcore.plan(g, 2, "160MiB", search_layout=True, depth=None)
    records = {(r["dp"], r["depth"]): r["outcome"] for r in p.extra["candidates"]
               if r["parallel"] == "mp" and r["memory_policy"] == "none"}
    assert records[(2, 1)].startswith("pruned: memory floor")
    assert records[(2, 2)] in ("chosen", "fits") or records[(2, 2)].startswith("slower")
    roomy = outcore.plan(g, 2, "1GiB", search_layout=True, depth=None)
    sharded = [r["outcome"] for r in roomy.extra["candidates"] if r["depth"] > 1]
    assert sharded and all(o.startswith("not tried") for o in sharded)


def _units_by_rows(g, assignment, policies, units):
    """shard_units by its definition: np.unique over the stacked (policy group, unit, rank)
    rows (the implementation numbers one key per triple instead)."""
    from outcore.schedule.lower import gather_units

    unit = gather_units(g, assignment, units)
    old = policies.group_of if policies is not None else np.full(g.num_nodes, -1, np.int64)
    pairs, group_of = np.unique(np.stack([old, unit, assignment]), axis=1, return_inverse=True)
    names = tuple(policies.policy_of_group(int(o)) if policies is not None else "none"
                  for o in pairs[0])
    return group_of.reshape(-1), names


def _sharded_bytes_by_names(g, names, sharded):
    """Per node, the bytes of its parameters in a sharded bucket, read by name (a graph
    without names: one tensor per node owning parameter bytes, named after the node)."""
    from outcore.schedule.lower import _param_namer

    names_in = {n for ns, sh in zip(names, sharded) if sh for n in ns}
    out = np.zeros(g.num_nodes)
    name = _param_namer(g)
    for i in range(g.num_nodes):
        owned = (g.attr(i, "params", []) or []) if g.attrs is not None else \
            (name([i]) if g.param_bytes[i] > 0 else [])
        if owned:
            out[i] = float(g.param_bytes[i]) * sum(n in names_in for n in owned) / len(owned)
    return out


@pytest.mark.parametrize("source", ["generated", "captured"])
def test_sharding_bytes_and_gather_units_follow_their_definitions(source):
    """Sharding's per-node bytes (arrays over the buckets' nodes on a graph without parameter
    names) and its gather units (one key per (group, unit, rank)) equal the name-by-name and
    row-by-row definitions, on a graph of four copies with memory-policy groups."""
    from outcore.graph.generators import make
    from outcore.plan.policies import MemoryPolicies
    from outcore.plan.replicas import expand
    from outcore.schedule.lower import (
        _sharded_node_bytes,
        shard_units,
        sharded_buckets,
        shared_param_buckets,
    )

    if source == "generated":
        g = make("transformer", 600)
    else:
        g = graph_for(TrainConfig.make(model=MODEL, batch_size=8, microbatches=1))
    stages, dp = 2, 4
    plan = _plan(g, stages, dp, 2, 1)
    big, assignment, copies = expand(g, plan)
    assert copies == dp
    rng = np.random.default_rng(0)
    groups = rng.integers(-1, 3, big.num_nodes)
    pol = MemoryPolicies(groups, ("checkpoint", "offload", "checkpoint"))
    for policies in (None, pol):
        got = shard_units(big, assignment, policies)
        want, names = _units_by_rows(big, assignment, policies, 8)
        np.testing.assert_array_equal(got.group_of, want)
        assert got.policies == names
    bgroups, names, _ = shared_param_buckets(big, assignment)
    sharded = sharded_buckets(bgroups, stages, dp)
    assert any(sharded) and big.param_bytes.sum() > 0
    for mask in (sharded, tuple(not s for s in sharded)):
        got = _sharded_node_bytes(big, names, mask)
        np.testing.assert_array_equal(got, _sharded_bytes_by_names(big, names, mask))
    assert _sharded_node_bytes(big, names, sharded).sum() > 0


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_a_tied_weight_an_exported_graph_passes_on_stays_whole():
    """GPT-2 through torch.export reads its tied embedding once and hands it to the output
    layer's piece: that parameter stays whole (a shard is whole only while the piece that
    gathered it runs), the others are sharded, and training equals plain PyTorch."""
    pytest.importorskip("transformers")
    from tests.zoo.helpers import assert_close, docs, reference as plain

    model = "hf:gpt2:hidden_size=32"
    # the graph and the reference at the run's chunk: 2 copies x 2 micro-batches of 2 samples
    at_chunk = TrainConfig.make(model=model, batch_size=8, microbatches=4, steps=2,
                                optimizer="sgd", lr=0.05, return_state=True, track_memory=False)
    _, _, g = docs(at_chunk, lambda g: np.zeros(g.num_nodes), 1)
    assert g.meta["capture"]["path"] == "export"
    cfg = at_chunk.replace(microbatches=2)
    plan = _plan(g, stages=1, dp=2, depth=2, microbatches=2)
    results = run_local(train_worker, 2, (cfg, graph_doc(g), plan_doc(plan)), timeout_s=120)
    assert_close(results, *plain(at_chunk, g.meta["capture"].get("output")), rtol=1e-5)
    sharded = results[0]["sharded"]
    assert sharded and "transformer.wte.weight" not in sharded
