"""A model for ``tests/tensor/test_plan_tensor_export.py`` (loaded by file path, as users name
theirs): attention that reshapes with its head count and width as constants, which a
``torch.export`` graph bakes in and the graph-level split must divide by ``tp``."""

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
