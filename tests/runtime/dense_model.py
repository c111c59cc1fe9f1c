"""A tiny DenseNet-like model (as timm's and torchvision's DenseNet): each layer of a block
takes the list of all earlier features, concatenates them, and applies batch norm, an in-place
ReLU and a convolution; blocks are joined by a transition (batch norm, in-place ReLU, 1x1
convolution, average pool). Used by name: tests/runtime/dense_model.py:tiny_densenet."""

import torch
from torch import nn


class DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int):
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.act = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(cin, growth, 3, padding=1, bias=False)

    def forward(self, features):
        x = torch.cat(features, 1) if isinstance(features, (list, tuple)) else features
        return self.conv(self.act(self.norm(x)))


class DenseBlock(nn.Module):
    def __init__(self, cin: int, growth: int, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(cin + k * growth, growth) for k in range(layers))

    def forward(self, x):
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.act = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(cin, cout, 1, bias=False)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x):
        return self.pool(self.conv(self.act(self.norm(x))))


class TinyDenseNet(nn.Module):
    def __init__(self, growth: int = 4, layers: int = 3, classes: int = 5):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.block1 = DenseBlock(8, growth, layers)
        c = 8 + layers * growth
        self.trans = Transition(c, 8)
        self.block2 = DenseBlock(8, growth, layers)
        c = 8 + layers * growth
        self.norm = nn.BatchNorm2d(c)
        self.act = nn.ReLU(inplace=True)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = self.block2(self.trans(self.block1(self.stem(x))))
        return self.head(self.act(self.norm(x)).mean((2, 3)))


def tiny_densenet():
    return TinyDenseNet(), torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(0))
