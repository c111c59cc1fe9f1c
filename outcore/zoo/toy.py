"""Tiny models for tests and examples: a chain, a diamond with a skip, two inputs and outputs."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """A chain of Linear + Tanh layers: the sequential case."""

    def __init__(self, width: int = 32, layers: int = 4, in_features: int = 16,
                 num_classes: int = 10):
        super().__init__()
        dims = [in_features] + [width] * layers
        self.layers = nn.Sequential(*(nn.Sequential(nn.Linear(a, b), nn.Tanh())
                                      for a, b in zip(dims[:-1], dims[1:])))
        self.out = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.layers(x))


class Diamond(nn.Module):
    """Fork into two branches of different length, join, plus a long skip to the head."""

    def __init__(self, width: int = 32, in_features: int = 16, num_classes: int = 10):
        super().__init__()
        self.inp = nn.Linear(in_features, width)
        self.left = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
        self.right = nn.Sequential(nn.Linear(width, width), nn.Tanh())
        self.join = nn.Linear(width, width)
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        j = torch.tanh(self.join(self.left(h) + self.right(h)))
        return self.head(torch.cat([j, h], dim=1))


class TwoTower(nn.Module):
    """Two inputs, each through its own tower, a shared fusion layer, two outputs."""

    def __init__(self, width: int = 32, in_features: int = 16, num_classes: int = 10):
        super().__init__()
        self.tower_a = nn.Sequential(nn.Linear(in_features, width), nn.Tanh())
        self.tower_b = nn.Sequential(nn.Linear(in_features, width), nn.Tanh())
        self.fuse = nn.Linear(width, width)
        self.head_a = nn.Linear(width, num_classes)
        self.head_b = nn.Linear(width, num_classes)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fa, fb = self.tower_a(a), self.tower_b(b)
        z = torch.tanh(self.fuse(fa * fb))
        return self.head_a(z + fa), self.head_b(z + fb)


def mlp(width: int = 32, layers: int = 4, in_features: int = 16, num_classes: int = 10):
    return MLP(width, layers, in_features, num_classes)


def diamond(width: int = 32, in_features: int = 16, num_classes: int = 10):
    return Diamond(width, in_features, num_classes)


def two_tower(width: int = 32, in_features: int = 16, num_classes: int = 10):
    return TwoTower(width, in_features, num_classes)
