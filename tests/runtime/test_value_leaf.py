"""A leaf module that reads a tensor's value (``if big.sum() > ...``: torch.fx cannot trace
it, and a fake tensor cannot answer it) trains on 2 ranks like one process: each rank learns
its output's shape by running it on stand-in values (losses and every parameter within 1e-5
after SGD steps)."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.config import TrainConfig
from outcore.graph.capture import capture
from outcore.graph.io import to_dict as graph_doc
from outcore.plan.plan import make_plan, to_dict as plan_doc
from outcore.runtime.data import split
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from outcore.zoo import build_model
from tests.runtime.helpers import assert_matches, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

MODEL = "tests/runtime/broadcast_model.py:leaf"


def test_a_leaf_that_reads_a_value_trains_on_two_ranks_like_one_process():
    cfg = TrainConfig.make(model=MODEL, batch_size=8, microbatches=2, steps=3, optimizer="sgd",
                           lr=0.1, momentum=0.0, return_state=True, track_memory=False,
                           timeout=30)
    spec, net = build_model(MODEL, batch_size=8, seed=cfg.run.seed)
    g = capture(net, split(spec.example_inputs, 2)[0], name=MODEL)
    assert g.meta["forced_leaves"] == ["block"]
    g = g.replace(fwd_s=np.full(g.num_nodes, 1e-3), bwd_s=np.full(g.num_nodes, 2e-3))
    # the input layer on rank 0; the leaf, which receives its input, and the rest on rank 1
    a = np.array([0 if g.op_of(i) == "input" or g.module_of(i) == "inp" else 1
                  for i in range(g.num_nodes)])
    assert a[g.names.index("block")] == 1
    plan = make_plan(g, a, strategy="manual", devices=2, memory_bytes=None, microbatches=2,
                     schedule="1f1b")
    results = run_local(train_worker, 2, (cfg, graph_doc(g), plan_doc(plan)), timeout_s=120)
    assert_matches(results, *reference(cfg), rtol=1e-5)
