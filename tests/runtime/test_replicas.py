"""GEMS MAST/MASTER replicas and hybrid data parallelism equal single-process training.

With C copies of the model (replicas x data-parallel copies), each of M micro-batches per copy,
the global batch is split into C*M chunks; single-process training accumulates over the same
chunks. Losses and every parameter of every rank must match (1e-5 relative).
"""

from __future__ import annotations

import pytest
import torch

from outcore.config import TrainConfig
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import assert_matches, chunks, docs_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

CASES = [
    # model, K (model-parallel devices), mode, replicas, dp, microbatches
    ("outcore:mlp", 2, "mast", 2, 1, 2),
    ("outcore:diamond", 2, "mp", 1, 2, 2),        # data parallel x pipeline: 4 ranks
    ("outcore:mlp", 4, "master", 4, 1, 1),        # four replicas on four devices
    ("outcore:transformer:layers=1", 2, "mast", 2, 2, 1),  # MAST x data parallel: 4 ranks
]


@pytest.mark.parametrize("model,K,mode,replicas,dp,mbs", CASES,
                         ids=[f"{c[2]}-R{c[3]}-dp{c[4]}-{c[0].split(':')[1]}" for c in CASES])
def test_replicated_training_equals_single_process(model, K, mode, replicas, dp, mbs):
    copies = replicas * dp
    cfg = TrainConfig.make(model=model, batch_size=4 * copies * mbs, microbatches=mbs, steps=3,
                           optimizer="sgd", lr=0.05, return_state=True, track_memory=False)
    graph_doc, plan_doc, _ = docs_for(cfg, lambda g: chunks(g, K), K, parallel=mode,
                                      replicas=replicas, dp=dp)
    results = run_local(train_worker, K * dp, (cfg, graph_doc, plan_doc), timeout_s=60)
    assert_matches(results, *reference(cfg, chunks=copies * mbs))
    # every rank holds parameters of `replicas` stages (MAST: stage r of A, K-1-r of B)
    held = [set(r["state"]) for r in results]
    if mode == "mast" and K == 2 and dp == 1:
        assert held[0] == held[1]  # both devices hold both halves


def test_mast_places_replica_b_in_reverse():
    from outcore.plan.replicas import gems_maps
    assert gems_maps(4, 2) == ((0, 1, 2, 3), (3, 2, 1, 0))
    maps = gems_maps(4, 4)
    for device in range(4):  # every device holds a different stage of each replica
        stages = [m.index(device) for m in maps]
        assert sorted(stages) == [0, 1, 2, 3]


def test_replicas_agree_on_batchnorm_statistics():
    """Each replica updates its batch-norm running statistics on its own micro-batches; at the
    end of training (and in every checkpoint) the ranks holding a statistic hold its average."""
    cfg = TrainConfig.make(model="outcore:resnet_k:depth=11,width=4", input_shape=(8, 3, 16, 16),
                           batch_size=8, microbatches=2, steps=2, optimizer="sgd", lr=0.05,
                           return_state=True, track_memory=False)
    graph_doc, plan_doc, _ = docs_for(cfg, lambda g: chunks(g, 2), 2, parallel="mp",
                                      replicas=1, dp=2)
    results = run_local(train_worker, 4, (cfg, graph_doc, plan_doc), timeout_s=60)
    ref_losses, ref_state, ref_buffers = reference(cfg, chunks=4, buffers=True)
    assert_matches(results, ref_losses, ref_state)
    stats = [k for k in ref_buffers if k.endswith(("running_mean", "running_var"))]
    assert stats
    for k in stats:
        holders = [r for r in results if k in r["buffers"]]
        assert len(holders) == 2, k  # one stage of each of the two data-parallel copies
        a, b = (h["buffers"][k] for h in holders)
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
        assert not torch.equal(a, torch.zeros_like(a) if "mean" in k else torch.ones_like(a)), k
