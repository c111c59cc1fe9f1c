"""Distributed training equals single-process training: losses and every parameter.

Each case trains a few steps on 2-4 local gloo workers under a plan given as an explicit
assignment (sequential stages, branches split across ranks, a rank holding pieces on both sides
of another rank's piece), and compares with a plain PyTorch loop (``helpers.reference``) that
uses the same seed, batches and micro-batching but none of outcore's execution code.
"""

from __future__ import annotations

import numpy as np
import pytest

from outcore.config import TrainConfig
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import assert_matches, chunks, docs_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]


def pingpong(k: int, segments: int):
    """Consecutive runs of nodes alternate between ranks: every rank holds pieces on both sides
    of the others' pieces (an arbitrary DAG partition, not a pipeline)."""
    return lambda g: (np.arange(g.num_nodes) * segments // g.num_nodes) % k


def by_branch(g):
    """Attention heads 0,1 on rank 1, the rest of the model on rank 0 (branches concurrently)."""
    return np.array([1 if ("heads_0" in g.name_of(i) or "heads_1" in g.name_of(i)) else 0
                     for i in range(g.num_nodes)])


CASES = [
    # model, microbatches, schedule, assignment, ranks, optimizer
    ("outcore:mlp", 2, "1f1b", lambda g: chunks(g, 2), 2, "adam"),
    ("outcore:diamond", 4, "gpipe", pingpong(2, 5), 2, "adam"),
    ("outcore:transformer:layers=1", 2, "1f1b", by_branch, 2, "sgd"),
    ("outcore:transformer", 2, "1f1b", pingpong(2, 4), 2, "sgd"),
    ("outcore:two_tower", 2, "gpipe", lambda g: np.arange(g.num_nodes) % 3, 3, "adam"),
    ("outcore:lstm_lm:unroll=True,seq=4,layers=2", 2, "1f1b", lambda g: chunks(g, 3), 3,
     "adam"),
    ("torchvision:resnet18:num_classes=10", 2, "1f1b", lambda g: chunks(g, 4), 4, "adam"),
]


@pytest.mark.parametrize("model,mbs,schedule,assign,ranks,optimizer", CASES,
                         ids=[f"{c[0].split(':')[1]}-{c[2]}-{c[4]}ranks" for c in CASES])
def test_distributed_equals_single_process(model, mbs, schedule, assign, ranks, optimizer):
    shape = (8, 3, 32, 32) if model.startswith("torchvision") else None
    cfg = TrainConfig.make(model=model, input_shape=shape, batch_size=8, microbatches=mbs, steps=3,
                           schedule=schedule, optimizer=optimizer, lr=1e-2 if optimizer == "sgd"
                           else 1e-3, return_state=True, track_memory=False)
    graph_doc, plan_doc, g = docs_for(cfg, assign, ranks)
    assert len(set(np.asarray(assign(g)).tolist())) == ranks, "every rank must hold nodes"
    results = run_local(train_worker, ranks, (cfg, graph_doc, plan_doc), timeout_s=60)
    assert_matches(results, *reference(cfg))


def test_single_rank_is_plain_training():
    """--devices 1 runs through the same code path and equals the plain loop."""
    cfg = TrainConfig.make(model="outcore:diamond", batch_size=8, microbatches=2, steps=4,
                           return_state=True, track_memory=False)
    graph_doc, plan_doc, _ = docs_for(cfg, lambda g: np.zeros(g.num_nodes), 1)
    results = run_local(train_worker, 1, (cfg, graph_doc, plan_doc), timeout_s=60)
    assert_matches(results, *reference(cfg))
