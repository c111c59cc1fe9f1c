"""A model whose second part reads the first part's output again at its very end, for the
memory tests: the gradient it makes there for that input is handed back only when the
part's backward ends, so it is held through the whole backward of the part. Used by name:
tests/runtime/handed_model.py:late_reader."""

import torch
from torch import nn


class LateReader(nn.Module):
    def __init__(self, width: int = 256, hidden: int = 1024):
        super().__init__()
        self.first = nn.Linear(16, width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)
        self.out = nn.Linear(width, 8)

    def forward(self, inp):
        x = self.first(inp)
        h = self.down(torch.relu(self.up(x)))
        return self.out(h * x)  # x read again last: its gradient is the backward's first


def late_reader():
    return LateReader(), torch.randn(8, 64, 16, generator=torch.Generator().manual_seed(0))
