"""Models for ``tests/parallel/tensor/test_plan_tensor_export.py`` (loaded by file path, as users
name theirs): attention that reshapes with its head count and width as constants, which a
``torch.export`` graph bakes in and the graph-level split must divide by ``tp``; and timm-style
attention with one fused q/k/v projection reshaped to ``[b, t, 3, heads, head_dim]``."""

from __future__ import annotations

import torch
from torch import nn


class ConstantSizeAttention(nn.Module):
    """q/k/v -> o attention (4 heads) and an MLP; the reshapes read ``self.heads`` and
    ``self.width`` (exported as the constants 4 and 32)."""

    def __init__(self, width: int = 32, heads: int = 4):
        super().__init__()
        self.width, self.heads = width, heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.out = nn.Linear(width, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, self.heads, self.width // self.heads).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, self.width))
        x = x + self.fc2(torch.relu(self.fc1(x)))
        return self.out(x)


def constant_size_attention():
    return ConstantSizeAttention(), torch.randn(4, 6, 32)


class FusedQKVAttention(nn.Module):
    """timm's ``Attention``: one ``qkv`` Linear, reshaped to ``(b, t, 3, heads, head_dim)``,
    permuted and unbound into q, k and v; then an MLP."""

    def __init__(self, width: int = 32, heads: int = 4):
        super().__init__()
        self.width, self.heads = width, heads
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.out = nn.Linear(width, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        x = x + self.fc2(nn.functional.gelu(self.fc1(x)))
        return self.out(x)


def fused_qkv_attention():
    return FusedQKVAttention(), torch.randn(4, 6, 32)


class GatedMLP(nn.Module):
    """Phi-3's MLP: one Linear computes the gate and the up projection, ``chunk``-ed in two
    (no heads), then ``down``; twice, then an output layer."""

    def __init__(self, width: int = 32, hidden: int = 64):
        super().__init__()
        self.gate_up = nn.ModuleList(nn.Linear(width, 2 * hidden, bias=False) for _ in range(2))
        self.down = nn.ModuleList(nn.Linear(hidden, width, bias=False) for _ in range(2))
        self.out = nn.Linear(width, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for gate_up, down in zip(self.gate_up, self.down):
            gate, up = gate_up(x).chunk(2, dim=-1)
            x = x + down(nn.functional.silu(gate) * up)
        return self.out(x)


def gated_mlp():
    return GatedMLP(), torch.randn(4, 6, 32)
