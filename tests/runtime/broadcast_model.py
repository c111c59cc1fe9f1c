"""A model whose memory peak is the backward of a product of two broadcast inputs (Mamba's
``A[None, :, None, :] * dt[:, :, :, None]``): both inputs' gradients are made at the
product's size before they are summed down to the inputs' shapes."""

import torch
from torch import nn


class Outer(nn.Module):
    def __init__(self, width: int = 64, state: int = 16):
        super().__init__()
        self.proj = nn.Linear(state, width)
        self.a = nn.Parameter(torch.randn(1, width, 1, state) * 0.1)
        self.out = nn.Linear(state, 1)

    def forward(self, x):  # x: [b, l, state]
        dt = self.proj(x).transpose(1, 2).unsqueeze(-1)  # [b, width, l, 1]
        return self.out(self.a * dt).mean((1, 3))  # the product: [b, width, l, state]


def outer():
    return Outer(), torch.randn(8, 32, 16)
