"""Megatron pairing found from captured graphs (zoo models, no names consulted)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from outcore.graph.capture import capture
from outcore.graph.tensor_pairs import find_layout
from outcore.zoo.toy import mlp
from outcore.zoo.transformer import transformer


def styles(layout):
    return {s.module: s.style for s in layout.splits}


def test_mlp_pairs_consecutive_linears_and_splits_the_head_alone():
    g = capture(mlp(width=32, layers=4, num_classes=10), torch.randn(4, 16))
    lay = find_layout(g, 2, min_split_bytes=0)
    assert [(p.columns, p.rows) for p in lay.pairs] == [(("layers.0.0",), ("layers.1.0",)),
                                                        (("layers.2.0",), ("layers.3.0",))]
    assert styles(lay)["out"] == "colwise_gather"          # 10 outputs split 2 ways
    assert styles(find_layout(g, 4, min_split_bytes=0))["out"] == "rowwise_alone"  # 10 % 4
    assert find_layout(g, 2).split_modules == ()             # all below the 1 MiB default


def test_transformer_pairs_mlp_blocks_but_not_per_head_projections():
    g = capture(transformer(layers=2, d_model=32, heads=4, vocab=64, seq=8),
                torch.randint(0, 64, (2, 8)))
    lay = find_layout(g, 2, min_split_bytes=0)
    assert [(p.columns, p.rows) for p in lay.pairs] == [
        (("blocks.0.fc1",), ("blocks.0.fc2",)), (("blocks.1.fc1",), ("blocks.1.fc2",))]
    s = styles(lay)
    assert s["embed"] == "vocab"
    # q @ k^T contracts over the head width: q/k/v cannot pair with proj in this model
    assert s["blocks.0.heads.0.q"] == "colwise_gather"


class Attention(nn.Module):
    """Standard multi-head attention with separate projections and a head reshape."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, self.heads, -1).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.o(y.transpose(1, 2).reshape(b, t, -1))


def test_attention_projections_pair_through_the_head_split():
    g = capture(Attention(), torch.randn(2, 8, 32))
    lay = find_layout(g, 2, min_split_bytes=0)
    assert len(lay.pairs) == 1
    assert lay.pairs[0].columns == ("q", "k", "v") and lay.pairs[0].rows == ("o",)
    assert lay.pairs[0].heads == 4
    # 4 heads cannot be split 8 ways: no pair, each projection alone
    assert find_layout(g, 8, min_split_bytes=0).pairs == ()


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        return self.b(torch.tanh(h) + h.sum(-1, keepdim=True))  # a reduction over the split dim


def test_a_reduction_over_the_split_dimension_blocks_the_pair():
    lay = find_layout(capture(Residual(), torch.randn(2, 8)), 2, min_split_bytes=0)
    assert lay.pairs == ()


class FusedAttention(nn.Module):
    """One q/k/v projection, cut into its three chunks by a reshape (timm) or a split (GPT-2)."""

    def __init__(self, by_split: bool, d: int = 32, heads: int = 4):
        super().__init__()
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.by_split, self.heads = by_split, heads

    def forward(self, x):
        b, t, d = x.shape
        if self.by_split:
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                       for z in self.qkv(x).split(d, dim=2))
        else:
            q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.fc2(torch.relu(self.fc1(x)))


def test_a_fused_qkv_projection_pairs_only_where_its_rows_are_split_chunk_by_chunk():
    from outcore.graph.tensor_pairs import chunks_of
    for by_split in (False, True):
        g = capture(FusedAttention(by_split), torch.randn(2, 8, 32))
        qkv, fc1 = (next(i for i in range(g.num_nodes) if g.module_of(i) == m and
                         g.op_of(i) == "linear") for m in ("qkv", "fc1"))
        assert (chunks_of(g, qkv), chunks_of(g, fc1)) == (3, 1)
        fused = find_layout(g, 2, min_split_bytes=0, fused=True)
        assert [(p.columns, p.rows, p.chunks, p.heads) for p in fused.pairs] == [
            (("qkv",), ("o",), (3,), 4), (("fc1",), ("fc2",), (1,), None)]
        # a contiguous split of its rows would mix q, k and v: not paired, split alone
        plain = find_layout(g, 2, min_split_bytes=0, fused=False)
        assert [p.columns for p in plain.pairs] == [("fc1",)]
        assert styles(plain)["qkv"] == "colwise_gather"
        assert find_layout(g, 2, min_split_bytes=0).pairs == plain.pairs  # the default


class GatedMLP(nn.Module):
    """Phi-3's MLP: one Linear computes the gate and the up projection, cut in two."""

    def __init__(self, width: int = 16, hidden: int = 64):
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return x + self.down(nn.functional.silu(gate) * up)


def test_a_fused_gate_and_up_projection_pairs_without_heads():
    """Cut into gate and up, the fused output has no heads to split: its rows are split
    chunk by chunk (each rank its part of the gate and of the up projection)."""
    g = capture(GatedMLP(), torch.randn(2, 5, 16))
    fused = find_layout(g, 2, min_split_bytes=0, fused=True)
    assert [(p.columns, p.rows, p.chunks, p.heads) for p in fused.pairs] == [
        (("gate_up",), ("down",), (2,), None)]
    assert find_layout(g, 2, min_split_bytes=0).pairs == ()  # a contiguous split mixes them


class ComputedHeadWidth(FusedAttention):
    """CaiT's reshape: the head width computed from the input (``c // heads``), which a split
    that divides the module's head count would double."""

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)\
            .unbind(0)
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        return x + self.o(y.transpose(1, 2).reshape(b, t, c))


def test_sizes_computed_from_the_input_keep_an_attention_pair_whole():
    g = capture(ComputedHeadWidth(False), torch.randn(2, 8, 32))
    assert g.meta["capture"]["path"] == "fx"
    assert [p.columns for p in find_layout(g, 2, min_split_bytes=0, fused=True).pairs] == []


class HeadBias(nn.Module):
    """Attention scores plus a learned per-head bias of shape (1, heads, t, t) (Swin, T5)."""

    def __init__(self, d: int = 32, heads: int = 4, t: int = 8, alibi: bool = False):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        # ALiBi-style (MPT): (heads, 1, t), broadcast over the query positions
        self.bias = nn.Parameter(torch.zeros(heads, 1 if alibi else t, t))
        self.heads, self.alibi = heads, alibi

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, self.heads, -1).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        bias = (self.bias * 1.0) if self.alibi else self.bias.unsqueeze(0)
        scores = (q @ k.transpose(-2, -1) + bias).softmax(-1)
        return x + self.o((scores @ v).transpose(1, 2).reshape(b, t, -1))


@pytest.mark.parametrize("alibi", [False, True], ids=["relative", "alibi"])
def test_a_per_head_bias_is_sliced_and_its_gradient_all_reduced(alibi):
    from outcore.cost.tensor import layout_collectives
    g = capture(HeadBias(alibi=alibi), torch.randn(2, 8, 32))
    lay = find_layout(g, 2, min_split_bytes=0)
    (pair,) = lay.pairs
    assert pair.columns == ("q", "k", "v") and pair.heads == 4
    ((u, v, nbytes),) = pair.sliced
    shape = [4, 1, 8] if alibi else [1, 4, 8, 8]
    assert g.attr(u, "shape") == shape and g.op_of(v) == "add" and nbytes == 4 * np.prod(shape)
    assert any(c.what == "per-head operand gradient" and c.nbytes == nbytes and c.phase == "bwd"
               for c in layout_collectives(lay)[v])
    # 4 heads over 8 ranks: no head split, no pair
    assert find_layout(g, 8, min_split_bytes=0).pairs == ()


class MultiQueryAttention(FusedAttention):
    """Falcon's multi-query q/k/v: one projection viewed as ``heads + 2`` heads, then split
    into the query's heads and one key and one value head."""

    def __init__(self):
        super().__init__(by_split=True, d=32, heads=2)
        self.qkv = nn.Linear(32, 4 * 16)  # (2 query heads + key + value) x head width 16
        self.o = nn.Linear(32, 32)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 4, 16).split([2, 1, 1], dim=-2)
        y = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2).expand(b, 2, t, 16),
            v.transpose(1, 2).expand(b, 2, t, 16))
        x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.fc2(torch.relu(self.fc1(x)))


def test_a_split_of_the_heads_into_parts_tp_cannot_divide_keeps_the_attention_whole():
    """Splitting 4 heads 2 ways leaves 2 per rank, but the query's 2 heads and the key's and
    value's 1 cannot each be halved: the projection does not pair (the MLP still does)."""
    g = capture(MultiQueryAttention(), torch.randn(2, 8, 32))
    lay = find_layout(g, 2, min_split_bytes=0, fused=True)
    assert [p.columns for p in lay.pairs] == [("fc1",)]
    assert styles(lay)["qkv"] != "colwise"
