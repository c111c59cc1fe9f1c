"""A small MLP with dropout (module and functional) for the placement-independence test."""

import torch
import torch.nn.functional as F
from torch import nn


class DropMLP(nn.Module):
    def __init__(self, p: float = 0.3, inplace: bool = False):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.drop = nn.Dropout(p, inplace=inplace)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 4)
        self.p, self.inplace = p, inplace

    def forward(self, x):
        # a linear layer's output: no backward reads it, so dropout may also write it
        x = torch.tanh(self.drop(self.a(x)))
        x = F.dropout(self.b(x), self.p, self.training, self.inplace)
        return self.c(x)


def drop_mlp():
    return DropMLP(), torch.randn(8, 16, generator=torch.Generator().manual_seed(0))


def no_drop_mlp():
    return DropMLP(p=0.0), torch.randn(8, 16, generator=torch.Generator().manual_seed(0))


def inplace_drop_mlp():
    """Dropout that writes its input (torchvision's MNASNet and EfficientNet classifiers)."""
    return DropMLP(inplace=True), torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
