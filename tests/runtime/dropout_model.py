"""A small MLP with dropout (module and functional) for the placement-independence test."""

import torch
import torch.nn.functional as F
from torch import nn


class DropMLP(nn.Module):
    def __init__(self, p: float = 0.3):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.drop = nn.Dropout(p)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 4)
        self.p = p

    def forward(self, x):
        x = self.drop(torch.tanh(self.a(x)))
        x = F.dropout(torch.tanh(self.b(x)), self.p, self.training)
        return self.c(x)


def drop_mlp():
    return DropMLP(), torch.randn(8, 16, generator=torch.Generator().manual_seed(0))


def no_drop_mlp():
    return DropMLP(p=0.0), torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
