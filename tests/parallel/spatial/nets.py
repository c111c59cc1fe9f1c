"""Small image networks for the spatial tests: a ResNet-style classifier and a U-Net."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """ResNet basic block; the stride-2 version has a 1x1 stride-2 shortcut."""

    def __init__(self, cin: int, cout: int, stride: int = 1, dilation: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, padding=dilation, dilation=dilation,
                               bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += idt
        return self.relu(out)


class ResNetStyle(nn.Module):
    """Stem (3x3 conv, BN, 3x3/2 max pool), a block, a stride-2 block, a dilated block, an
    average pool with ceil_mode, global average pool, linear classifier."""

    def __init__(self, cin: int = 3, width: int = 8, classes: int = 5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(cin, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        self.layer1 = Block(width, width)
        self.layer2 = Block(width, 2 * width, stride=2)
        self.layer3 = Block(2 * width, 2 * width, dilation=2)
        self.pool = nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.pool(self.layer3(self.layer2(self.layer1(self.stem(x)))))
        return self.fc(torch.flatten(self.gap(x), 1))


class UNet(nn.Module):
    """Two-level U-Net: conv blocks, 2x2 max pools (odd sizes floor), a transposed convolution
    with output_padding and a bilinear upsampling back, skip connections concatenated."""

    def __init__(self, cin: int = 3, width: int = 8, classes: int = 3,
                 up_mode: str = "bilinear"):
        super().__init__()
        w = width
        self.enc1 = nn.Sequential(nn.Conv2d(cin, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(),
                                  nn.Conv2d(w, w, 3, padding=1), nn.ReLU())
        self.pool1 = nn.MaxPool2d(2)
        self.enc2 = nn.Sequential(nn.Conv2d(w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w),
                                  nn.ReLU())
        self.pool2 = nn.MaxPool2d(2)
        self.mid = nn.Sequential(nn.Conv2d(2 * w, 2 * w, 3, padding=2, dilation=2), nn.ReLU())
        self.up2 = nn.ConvTranspose2d(2 * w, 2 * w, 2, stride=2, output_padding=1)
        self.dec2 = nn.Sequential(nn.Conv2d(4 * w, 2 * w, 3, padding=1), nn.ReLU())
        self.up1 = nn.Upsample(scale_factor=2, mode=up_mode)
        self.dec1 = nn.Sequential(nn.Conv2d(3 * w, w, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool1(e1))
        m = self.mid(self.pool2(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.head(d1)
