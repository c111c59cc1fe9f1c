"""Memory policies at run time: same losses and parameters as no policy (1e-5 relative), and
checkpointing really lowers the measured peak; on a CPU host offloading is a faithful no-op."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from outcore.config import TrainConfig
from outcore.plan.policies import MemoryPolicies, segmented, segments
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import assert_matches, chunks, docs_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]


def mixed(g, a):
    """Rank 0's nodes in three segments: checkpoint, offload activations, offload parameters;
    rank 1's nodes checkpointed in two segments."""
    group = np.full(g.num_nodes, -1)
    names = []
    for dev, kinds in ((0, ["checkpoint", "offload-activations", "offload-params"]),
                       (1, ["checkpoint", "checkpoint"])):
        for seg, kind in zip(segments(np.flatnonzero(a == dev), len(kinds)), kinds):
            group[seg] = len(names)
            names.append(kind)
    return MemoryPolicies(group, tuple(names))


def test_policies_train_exactly_like_no_policy():
    cfg = TrainConfig.make(model="outcore:diamond", batch_size=8, microbatches=2, steps=3,
                           return_state=True, track_memory=False)
    graph_doc, plan_doc, _ = docs_for(cfg, lambda g: chunks(g, 2), 2, policies=mixed)
    results = run_local(train_worker, 2, (cfg, graph_doc, plan_doc), timeout_s=60)
    assert_matches(results, *reference(cfg))


def test_checkpointing_lowers_measured_peak():
    cfg = TrainConfig.make(model="outcore:resnet_k:depth=29,width=8", batch_size=16,
                           microbatches=1, steps=2, return_state=True, track_memory=True)

    plain = docs_for(cfg, lambda g: np.zeros(g.num_nodes), 1)
    ckpt = docs_for(cfg, lambda g: np.zeros(g.num_nodes), 1, policies=_segmented("checkpoint"))
    base = run_local(train_worker, 1, (cfg, plain[0], plain[1]), timeout_s=60)[0]
    low = run_local(train_worker, 1, (cfg, ckpt[0], ckpt[1]), timeout_s=60)[0]
    np.testing.assert_allclose(low["losses"], base["losses"], rtol=1e-5)
    # batch-norm running statistics count each batch once, as in plain PyTorch, although the
    # backward recomputes every checkpointed forward
    _, _, ref_buffers = reference(cfg, buffers=True)
    assert set(low["buffers"]) == set(ref_buffers) and any("running_var" in k for k in ref_buffers)
    for run in (base, low):
        for k, ref in ref_buffers.items():
            torch.testing.assert_close(run["buffers"][k], ref, rtol=1e-5, atol=1e-6, msg=k)
    assert low["peak_bytes"][0] < 0.7 * base["peak_bytes"][0], (low["peak_bytes"],
                                                                 base["peak_bytes"])


def _segmented(policy: str):
    """Every node in about sqrt(n) segments of equal saved bytes, each under ``policy``."""
    return lambda g, a: segmented(g.saved_bytes, policy, int(np.sqrt(g.num_nodes)))


def test_pieces_of_one_rank_hold_what_the_simulator_predicts():
    """Six pieces on one rank, plain and checkpointed: the measured peak is within 10 % of the
    simulator's. A piece's input from a piece of the same rank is not held once read unless a
    layer saves it (the plain pieces measured 21.1 MiB against 15.6 MiB in one piece while
    autograd leaves held them), and a checkpointed piece's backward holds its recomputed
    activations and the three gradients of its downsampling block's forked input (predicted
    11.2 MiB against 16.2 MiB measured before both were modelled)."""
    from outcore.plan.plan import make_plan
    from outcore.runtime.local_cluster import local_cluster
    from outcore.sim.simulate import simulate

    cfg = TrainConfig.make(model="outcore:resnet_k:depth=11,width=8", batch_size=16,
                           microbatches=1, steps=2, track_memory=True)
    one = docs_for(cfg, lambda g: np.zeros(g.num_nodes), 1)
    whole = run_local(train_worker, 1, (cfg, one[0], one[1]), timeout_s=60)[0]["peak_bytes"][0]
    for policy in ("none", "checkpoint"):
        graph_doc, plan_doc, g = docs_for(cfg, lambda g: np.zeros(g.num_nodes), 1,
                                          policies=_segmented(policy))
        a = np.zeros(g.num_nodes, dtype=np.int64)
        plan = make_plan(g, a, strategy="manual", devices=1, memory_bytes=None,
                         microbatches=1, policies=_segmented(policy)(g, a))
        assert len(set(plan.policies.group_of.tolist())) >= 5
        predicted = simulate(plan, g, cluster=local_cluster(1, True)).peak_bytes[0]
        measured = run_local(train_worker, 1, (cfg, graph_doc, plan_doc),
                             timeout_s=60)[0]["peak_bytes"][0]
        assert abs(measured / predicted - 1) <= 0.10, (policy, measured, predicted)
        if policy == "none":
            assert measured <= 1.05 * whole, (measured, whole)


def _named(policy_of: dict[str, str]):
    """One group per named node (its policy), every other node without one."""
    def policies(g, a):
        group = np.full(g.num_nodes, -1)
        names = []
        for v in range(g.num_nodes):
            if g.name_of(v) in policy_of:
                group[v] = len(names)
                names.append(policy_of[g.name_of(v)])
        return MemoryPolicies(group, tuple(names))
    return policies


def _first_apart(g, a):
    """Two plain pieces: the first layer, and the rest."""
    group = np.ones(g.num_nodes, dtype=np.int64)
    group[[g.index_of_name[name] for name in ("inp", "first")]] = 0
    return MemoryPolicies(group, ("none", "none"))


def _alternating(g, a):
    """Twelve segments of the nodes, checkpointed and plain in turn."""
    group = np.full(g.num_nodes, -1)
    names = []
    for k, seg in enumerate(segments(np.arange(g.num_nodes), 12)):
        group[seg] = len(names)
        names.append("checkpoint" if k % 2 == 0 else "none")
    return MemoryPolicies(group, tuple(names))


@pytest.mark.parametrize("case", ["relu saved again", "small inputs", "handed back"])
def test_what_pieces_hold_for_each_other_is_predicted(case):
    """Tensors a layer's saved bytes did not count, measured against the simulator on one
    rank. *relu saved again*: a checkpointed block's ReLU saves its output, which the next
    block's plain convolutions save too (counted at the ReLU, it left with the ReLU's saved
    bytes: 3.6 % under a bfloat16 CNN's measured peak, past its limit). *small inputs*: pieces
    take tensors under 64 KiB from pieces of their rank as autograd leaves, held until their
    backward (an LM cut into twelve pieces measured 35 KiB over its prediction). *handed
    back*: a piece reads another's output again at its end; the gradient it makes there is
    handed back only when its backward ends, so it is held through all of it (256 KiB
    here; a tied output weight's put hf:xlnet 1.4 % over its prediction)."""
    from outcore.plan.plan import make_plan
    from outcore.runtime.local_cluster import local_cluster
    from outcore.sim.simulate import simulate

    if case == "relu saved again":
        model, policies = "outcore:resnet_k:depth=11,width=8", _named(
            {"stage2_0_bn1": "checkpoint", "stage2_0_relu": "checkpoint"})
    elif case == "small inputs":
        model, policies = ("outcore:transformer:layers=2,d_model=64,heads=4,seq=16,vocab=2048",
                           _alternating)
    else:
        model, policies = "tests/runtime/handed_model.py:late_reader", _first_apart
    cfg = TrainConfig.make(model=model, batch_size=8, microbatches=2, steps=2,
                           optimizer="sgd", momentum=0.0, track_memory=True)
    graph_doc, plan_doc, g = docs_for(cfg, lambda g: np.zeros(g.num_nodes), 1,
                                      policies=policies)
    a = np.zeros(g.num_nodes, dtype=np.int64)
    plan = make_plan(g, a, strategy="manual", devices=1, memory_bytes=None, microbatches=2,
                     policies=policies(g, a), optimizer="sgd")
    predicted = simulate(plan, g, cluster=local_cluster(1, True)).peak_bytes[0]
    measured = run_local(train_worker, 1, (cfg, graph_doc, plan_doc),
                         timeout_s=60)[0]["peak_bytes"][0]
    # the CPU allocator's own record of one rank's program: exact, so no slack beyond a few
    # KiB (the held leaves are 0.7 % of the LM's peak, inside the matrix's 1 % + 16 KiB)
    assert measured <= predicted + 4096, (case, measured, predicted)
    assert measured >= 0.9 * predicted, (case, measured, predicted)
