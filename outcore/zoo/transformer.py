"""A transformer language model whose attention heads are separate branches.

Each head owns its query, key and value projections (``Head``), so in the captured graph the heads
of a layer are parallel branches joined by a concatenation: the structure SUPER's sub-graph
parallelism (Jain et al., IPDPS 2021) splits across devices, and the one AxoNN/Megatron tensor
parallelism splits by columns. Pre-norm blocks as in GPT-2 (Radford et al., 2019, section 2.3).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class Head(nn.Module):
    """One causal attention head: its own q, k, v projections of width ``d_head``."""

    def __init__(self, d_model: int, d_head: int, seq: int):
        super().__init__()
        self.q = nn.Linear(d_model, d_head)
        self.k = nn.Linear(d_model, d_head)
        self.v = nn.Linear(d_model, d_head)
        self.scale = 1.0 / math.sqrt(d_head)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale + self.mask
        return torch.matmul(torch.softmax(scores, dim=-1), v)


class Block(nn.Module):
    """LayerNorm, heads in parallel, concat, projection, residual; LayerNorm, MLP, residual."""

    def __init__(self, d_model: int, heads: int, d_ff: int, seq: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.heads = nn.ModuleList(Head(d_model, d_model // heads, seq) for _ in range(heads))
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.proj(torch.cat([head(h) for head in self.heads], dim=-1))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class TransformerLM(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, d_ff: int, seq: int):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of heads ({heads})")
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        self.blocks = nn.Sequential(*(Block(d_model, heads, d_ff, seq) for _ in range(layers)))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos
        return self.head(self.ln(self.blocks(x)))


def transformer(layers: int = 2, d_model: int = 64, heads: int = 4, d_ff: int = 0,
                vocab: int = 256, seq: int = 32) -> nn.Module:
    """Causal transformer LM over ``seq`` tokens; ``d_ff`` defaults to ``4 * d_model``."""
    return TransformerLM(vocab, d_model, heads, layers, d_ff or 4 * d_model, seq)
