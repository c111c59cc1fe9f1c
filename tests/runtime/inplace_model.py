"""A residual block written with ``a += b`` (as Hugging Face Falcon writes ``mlp_output +=
attention_output``): captured through torch.export it holds ``aten.add_`` on a value that another
rank may produce."""

import torch
from torch import nn


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.fc1(x)
        a += torch.tanh(self.fc2(x))
        return self.head(torch.relu(a))


def make():
    return Residual(), torch.randn(8, 16)
