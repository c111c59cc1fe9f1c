"""Concatenation-heavy graphs (DenseNet, Inception) split over 2 ranks train exactly like one
process: losses and every parameter after plain SGD steps (momentum 0, so equal parameters mean
equal gradients), within 1e-5 relative to each tensor's largest entry.

The tiny DenseNet (tests/runtime/dense_model.py) has what timm's densenet121 has: every layer
takes the list of all earlier features and concatenates it, batch norm in training mode and
in-place ReLU; a feature made on one rank feeds several later layers, some on the same rank and
some on the other, so its gradient is summed from local and received parts. The cases cut it
once (a pipeline: every earlier feature crosses) and at several points (features cross back and
forth, each rank holding pieces on both sides of the other's).

This is the regression test for the densenet121 / inception_v3 entries of the ecosystem sweep,
which differed on 2 ranks: not a gradient bug (in float64 their step-0 gradients on 2 ranks
equal one rank's to 5e-11 relative) but rounding, amplified by batch norm over 2 values per
channel (micro-batch 2 at 1x1 spatial) and Adam's sign-like first step; the sweep now gives
them inputs and an optimizer under which one process is itself reproducible.
"""

from __future__ import annotations

import numpy as np
import pytest

from outcore.config import TrainConfig
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import assert_matches, chunks, docs_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

MODEL = "tests/runtime/dense_model.py:tiny_densenet"


def segments(k: int):
    """``k`` runs of consecutive nodes alternating between the 2 ranks."""
    return lambda g: (np.arange(g.num_nodes) * k // g.num_nodes) % 2


CASES = [
    ("1f1b", lambda g: chunks(g, 2)),   # one cut: every earlier feature crosses once
    ("1f1b", segments(5)),              # features cross back and forth
    ("gpipe", segments(13)),            # many short runs: most concatenations mix ranks
]


@pytest.mark.parametrize("schedule,assign", CASES, ids=["pipeline", "5-runs", "13-runs"])
def test_dense_concatenations_on_two_ranks_equal_single_process(schedule, assign):
    cfg = TrainConfig.make(model=MODEL, batch_size=8, microbatches=2, steps=3, schedule=schedule,
                           optimizer="sgd", lr=0.1, momentum=0.0, return_state=True,
                           track_memory=False, timeout=30)
    graph_doc, plan_doc, g = docs_for(cfg, assign, 2)
    a = np.asarray(assign(g))
    names = [g.name_of(i) for i in range(g.num_nodes)]
    # the cut must separate a feature from some of its consumers: a cat on rank 1 reading a
    # feature made on rank 0 (or the reverse)
    crossing = [names[int(d)] for s, d in zip(g.src.tolist(), g.dst.tolist())
                if a[s] != a[d] and names[int(d)].startswith("cat")]
    assert crossing, "the split must send features into a concatenation on the other rank"
    results = run_local(train_worker, 2, (cfg, graph_doc, plan_doc), timeout_s=120)
    assert_matches(results, *reference(cfg), rtol=1e-5)
