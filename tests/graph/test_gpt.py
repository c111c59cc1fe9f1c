"""The torch-free GPT generator: Megatron pairs found, parameter count, A100 costs (pure)."""

from __future__ import annotations

import pytest

from outcore.cost.analytical import estimate
from outcore.errors import UsageError
from outcore.graph.gpt import PARAM_BYTES_PER_PARAM, GPTShape, make_gpt
from outcore.graph.tensor_pairs import find_layout

SMALL = GPTShape(layers=3, hidden=256, heads=8, vocab=1024, seq=128)


def test_every_block_pairs_attention_and_mlp():
    g = make_gpt(SMALL, batch=2)
    lay = find_layout(g, 4, min_split_bytes=0)
    got = [(p.columns, p.rows, p.heads) for p in lay.pairs]
    want = []
    for i in range(SMALL.layers):
        want.append((tuple(f"h.{i}.attn.{x}" for x in "qkv"), (f"h.{i}.attn.proj",), 8))
        want.append(((f"h.{i}.mlp.fc1",), (f"h.{i}.mlp.fc2",), None))
    assert got == want
    assert lay.split("wte").style == "vocab"
    assert lay.split("lm_head").style == "colwise_gather"
    # 8 heads do not split 16 ways: the attention pairs are refused, the MLPs still pair
    lay16 = find_layout(g, 16, min_split_bytes=0)
    assert [p.columns for p in lay16.pairs] == [(f"h.{i}.mlp.fc1",) for i in range(3)]


def test_parameter_count():
    g = make_gpt(SMALL)
    d, L, V = SMALL.hidden, SMALL.layers, SMALL.vocab
    assert g.param_bytes.sum() == SMALL.params * PARAM_BYTES_PER_PARAM
    assert SMALL.params == pytest.approx(12 * L * d * d + 2 * V * d, rel=0.01)
    # AxoNN's 40B shape: 12 L d^2 = 38.7e9 (+ 0.9e9 embedding and head)
    big = GPTShape(layers=38, hidden=9216, heads=72)
    assert big.params == pytest.approx(39.7e9, rel=0.01)
    # model FLOPs = 6 x (block and LM-head weights) x tokens + attention (s / 6d of the blocks)
    blocks, head = 12 * 38 * 9216**2, 51200 * 9216
    assert big.model_flops(2048) == pytest.approx(
        6 * 2048 * (blocks * (1 + 2048 / 6 / 9216) + head), rel=1e-9)


def test_a100_costs_are_positive_and_compute_bound():
    g = estimate(make_gpt(GPTShape(layers=1, hidden=1024, heads=16, vocab=4096, seq=512)),
                 "a100")
    work = [i for i in range(g.num_nodes) if g.op_of(i) not in ("input", "view")]
    assert all(g.fwd_s[i] > 0 for i in work)
    assert all(g.bwd_s[i] > 0 for i in work)
    fc1 = g.names.index("h.0.mlp.fc1")
    flops = 2.0 * 512 * 1024 * 4096
    # bf16 on the tensor cores at the preset's efficiency (312 TFLOP/s x 0.7) + one launch
    assert g.fwd_s[fc1] == pytest.approx(flops / (312e12 * 0.7) + 5e-6, rel=1e-6)
    assert g.bwd_s[fc1] == pytest.approx(2 * flops / (312e12 * 0.7) + 10e-6, rel=1e-6)


def test_bad_shape_is_refused():
    with pytest.raises(UsageError, match="heads dividing"):
        make_gpt(GPTShape(layers=1, hidden=100, heads=3))
