"""A tensor two pieces of one rank take, one of which writes into it in place: ``h`` feeds
``x_branch`` (``h * 2 + t``, early in program order, but late in the cut: ``t`` comes back from
rank 0 after a round trip through rank 1) and ``y_branch`` (``relu_(h)``, later in program
order, first in the cut). Eager semantics: ``x_branch`` sees ``h`` before the in-place ReLU."""

import torch
from torch import nn


class RelayInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.side = nn.Linear(16, 32)
        self.w = nn.Linear(32, 32)
        self.t = nn.Linear(32, 32)
        self.a = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = self.inp(x) * 1.0
        t = self.t(torch.tanh(self.w(self.side(x))))
        x_branch = h * 2.0 + t
        y_branch = self.a(torch.relu_(h))
        return self.head(x_branch + y_branch)


def make():
    return RelayInPlace(), torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
