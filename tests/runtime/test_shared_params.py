"""Shared (tied) parameters split over ranks train exactly like one process, with no hang.

An embedding and an output layer share one weight (GPT-2 / BERT weight tying). When the two
layers land on different ranks, each rank holds the tensor under a different name
(``embed.weight``, ``head.weight``); both must join the same gradient all-reduce bucket, or the
step hangs (the bug this file guards against). Compared with plain PyTorch on the same batches:
losses, and every parameter after plain SGD steps (momentum 0, so each step's update is the
gradient times the learning rate: equal parameters mean equal gradients).
"""

from __future__ import annotations

import numpy as np
import pytest

from outcore.config import TrainConfig
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import assert_matches, chunks, docs_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

MODEL = "tests/runtime/tied_model.py:tied_lm"


def _rank_of(g, assign, module: str) -> set[int]:
    a = np.asarray(assign(g))
    return {int(a[i]) for i in range(g.num_nodes) if g.module_of(i) == module}


def ends_apart(g):
    """Embedding on rank 0, output layer on rank 1, the body alternating (not a pipeline)."""
    fixed = {"embed": 0, "head": 1}
    return np.array([fixed.get(g.module_of(i), i % 2) for i in range(g.num_nodes)])


CASES = [
    # schedule, assignment, parallel mode, replicas, microbatches
    ("1f1b", lambda g: chunks(g, 2), None, 1, 2),      # pipeline stages
    ("gpipe", ends_apart, None, 1, 2),                  # arbitrary DAG partition
    ("1f1b", lambda g: chunks(g, 2), "mast", 2, 1),    # GEMS MAST: both ranks hold both ends
]


@pytest.mark.parametrize("schedule,assign,mode,replicas,mbs", CASES,
                         ids=["pipeline-1f1b", "dag-gpipe", "mast-replicas"])
def test_tied_weights_on_two_ranks_equal_single_process(schedule, assign, mode, replicas, mbs):
    cfg = TrainConfig.make(model=MODEL, batch_size=4 * replicas * mbs, microbatches=mbs, steps=3,
                           schedule=schedule, optimizer="sgd", lr=0.1, momentum=0.0,
                           return_state=True, track_memory=False, timeout=20)
    graph_doc, plan_doc, g = docs_for(cfg, assign, 2, parallel=mode, replicas=replicas)
    assert _rank_of(g, assign, "embed") != _rank_of(g, assign, "head"), \
        "the test must split the tied layers"
    results = run_local(train_worker, 2, (cfg, graph_doc, plan_doc), timeout_s=90)
    ref_losses, ref_state = reference(cfg, chunks=replicas * mbs)
    assert_matches(results, ref_losses, ref_state)
    holders = [r["rank"] for r in results if "embed.weight" in r["state"]]
    assert holders == [0, 1], "both ranks hold the tied weight, under its first name"
