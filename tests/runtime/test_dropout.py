"""Dropout does not depend on placement: 1 rank and 2 ranks give the same losses and
parameters with dropout on (random nodes are reseeded per node, step and micro-batch; see
``outcore.core.randomness``)."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.config import TrainConfig
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import chunks, docs_for

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]


def _run(model: str, ranks: int, schedule: str):
    cfg = TrainConfig.make(model=model, batch_size=8, microbatches=2, steps=3, schedule=schedule,
                           return_state=True, track_memory=False, timeout=20)
    graph_doc, plan_doc, _ = docs_for(cfg, lambda g: chunks(g, ranks), ranks)
    return run_local(train_worker, ranks, (cfg, graph_doc, plan_doc), timeout_s=90)


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
