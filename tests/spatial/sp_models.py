"""Small models for spatial-plan tests (loaded as ``path/to/sp_models.py:function``)."""

import torch
from torch import nn


class Block(nn.Module):
    """A ResNet basic block (functional ReLU and a residual add)."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def small_resnet():
    """Stem (stride-2 convolution, batch norm, ReLU, 3x3 stride-2 max pool), two blocks, head.
    The stem convolution has no bias: batch norm follows, so the bias's gradient is zero up to
    rounding, which Adam would turn into steps of noise."""
    return (nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1, bias=False),
                          nn.BatchNorm2d(4), nn.ReLU(),
                          Block(4), nn.MaxPool2d(3, stride=2, padding=1), Block(4),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)),
            torch.randn(4, 3, 19, 21))
