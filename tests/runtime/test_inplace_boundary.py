"""An in-place ATen op (``aten.add_`` of an exported graph) on a tensor received from another
rank, directly or through an alias of it (an element of a received tuple, a view): the piece
gets a copy (autograd forbids writing into the received leaf), and 2 ranks train like one
process (losses and every parameter within 1e-5 after SGD steps)."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.config import TrainConfig
from outcore.graph.capture import capture
from outcore.graph.io import to_dict as graph_doc
from outcore.graph.ir import Graph
from outcore.plan.plan import make_plan, to_dict as plan_doc
from outcore.runtime.data import split
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from outcore.zoo import build_model
from tests.runtime.helpers import assert_matches, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

MODEL = "tests/runtime/inplace_model.py:make"
ALIAS_MODEL = "tests/runtime/inplace_alias_model.py:make"


def _captured(model: str, path: str) -> tuple[TrainConfig, Graph]:
    """The run's config and the model's graph (1 / 2 ms per node), at the micro-batch size."""
    cfg = TrainConfig.make(model=model, batch_size=8, microbatches=2, steps=3, optimizer="sgd",
                           lr=0.1, momentum=0.0, return_state=True, track_memory=False, timeout=30)
    spec, net = build_model(model, batch_size=8, seed=cfg.run.seed)
    g = capture(net, split(spec.example_inputs, 2)[0], name=model, path=path)
    return cfg, g.replace(fwd_s=np.full(g.num_nodes, 1e-3), bwd_s=np.full(g.num_nodes, 2e-3))


def _trains_like_one_process(cfg: TrainConfig, g: Graph, a: np.ndarray) -> None:
    plan = make_plan(g, a, strategy="manual", devices=2, memory_bytes=None, microbatches=2,
                     schedule="1f1b")
    results = run_local(train_worker, 2, (cfg, graph_doc(g), plan_doc(plan)), timeout_s=120)
    assert_matches(results, *reference(cfg), rtol=1e-5)


def test_in_place_add_of_a_received_tensor_on_two_ranks_equals_single_process():
    cfg, g = _captured(MODEL, "export")
    # fc1 (its weights and matmul) on rank 0, everything else on rank 1: rank 1's add_ writes
    # into fc1's output, received from rank 0
    a = np.array([0 if g.module_of(i) == "fc1" else 1 for i in range(g.num_nodes)])
    adds = [i for i in range(g.num_nodes) if g.op_of(i) == "add_"]
    assert adds and all(a[i] == 1 for i in adds)
    assert any(a[int(s)] == 0 and int(d) in adds for s, d in zip(g.src, g.dst))
    _trains_like_one_process(cfg, g, a)


def test_in_place_write_through_an_alias_of_a_received_tensor_equals_single_process():
    cfg, g = _captured(ALIAS_MODEL, "export")
    # rank 0: the input, fc1, topk and fc2; rank 1 takes topk's tuple and fc2's output and
    # writes into them through getitem (div_) and view + transpose (mul_)
    ops = [g.op_of(i) for i in range(g.num_nodes)]
    a = np.array([0 if ops[i] in ("input", "topk") or g.module_of(i) in ("fc1", "fc2") else 1
                  for i in range(g.num_nodes)])
    edges = {(ops[int(s)], ops[int(d)]) for s, d in zip(g.src, g.dst) if a[s] == 0 != a[d]}
    assert ("topk", "getitem") in edges and ("linear", "view") in edges, edges
    assert {"div_", "mul_"} <= {ops[i] for i in range(g.num_nodes) if a[i] == 1}
    _trains_like_one_process(cfg, g, a)


@pytest.mark.parametrize("path", ["export", "fx"])
def test_readers_before_and_after_an_in_place_write_in_other_pieces(path):
    # fc1 and relu_ on rank 0, both readers (h * 2 before the write, fc3 after it) on rank 1:
    # rank 1 must get h as it was before relu_ for the first, and after it for the second
    cfg, g = _captured("tests/runtime/inplace_alias_model.py:make_write_after_read", path)
    ops = [g.op_of(i) for i in range(g.num_nodes)]
    a = np.array([1 if ops[i] == "mul" or g.module_of(i) in ("fc2", "fc3") else 0
                  for i in range(g.num_nodes)])
    relu = ops.index("relu_")
    fc3 = next(i for i in range(g.num_nodes) if g.module_of(i) == "fc3" and ops[i] == "linear")
    assert a[relu] == 0 and a[fc3] == 1
    assert (relu, fc3) in set(zip(g.src.tolist(), g.dst.tolist()))
    _trains_like_one_process(cfg, g, a)


@pytest.mark.parametrize("path", ["export", "fx"])
def test_in_place_write_after_a_layer_that_returns_its_received_input(path):
    cfg, g = _captured("tests/runtime/inplace_alias_model.py:make_aliasing_layers", path)
    # the linears on rank 0; identity, dropout and the in-place ReLUs on rank 1
    a = np.array([0 if g.op_of(i) == "input" or g.module_of(i) in ("fc1", "fc2") else 1
                  for i in range(g.num_nodes)])
    assert "dropout" in [g.op_of(i) for i in range(g.num_nodes) if a[i] == 1]
    _trains_like_one_process(cfg, g, a)
