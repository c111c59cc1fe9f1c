"""A small U-Net (two levels, long skip connections) for the layout search tests."""

import torch
from torch import nn


class SmallUNet(nn.Module):
    def __init__(self, c: int = 8):
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU())
        self.down2 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.mid = nn.Sequential(nn.Conv2d(2 * c, 2 * c, 3, padding=1), nn.ReLU())
        self.up = nn.Upsample(scale_factor=2)
        self.up2 = nn.Sequential(nn.Conv2d(4 * c, c, 3, padding=1), nn.ReLU())
        self.up1 = nn.Conv2d(2 * c, 2, 1)

    def forward(self, x):
        a = self.down1(x)
        b = self.down2(self.pool(a))
        m = self.mid(self.pool(b))
        u = self.up2(torch.cat([self.up(m), b], dim=1))
        return self.up1(torch.cat([self.up(u), a], dim=1))


def make():
    torch.manual_seed(0)
    return SmallUNet(), torch.randn(8, 3, 32, 32)
