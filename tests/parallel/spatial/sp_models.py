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


class UNet(nn.Module):
    """Two-level U-Net on odd sizes: 2x2 max pools (floor), two transposed convolutions
    (2x2 stride 2 with output padding; 3x3 stride 2), skip connections concatenated. Biases only
    where no batch norm follows and not on the head: the default loss is a cross-entropy over
    the last dimension (the width), to which a per-channel bias adds a constant (see
    :func:`small_resnet`)."""

    def __init__(self, cin: int = 3, w: int = 4, classes: int = 3):
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(cin, w, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(w), nn.ReLU())
        self.pool1 = nn.MaxPool2d(2)
        self.enc2 = nn.Sequential(nn.Conv2d(w, 2 * w, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(2 * w), nn.ReLU())
        self.pool2 = nn.MaxPool2d(2)
        self.mid = nn.Sequential(nn.Conv2d(2 * w, 2 * w, 3, padding=2, dilation=2), nn.ReLU())
        self.up2 = nn.ConvTranspose2d(2 * w, 2 * w, 2, stride=2, output_padding=1)
        self.dec2 = nn.Sequential(nn.Conv2d(4 * w, 2 * w, 3, padding=1), nn.ReLU())
        self.up1 = nn.ConvTranspose2d(2 * w, w, 3, stride=2)
        self.dec1 = nn.Sequential(nn.Conv2d(2 * w, w, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(w, classes, 1, bias=False)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool1(e1))
        m = self.mid(self.pool2(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.head(d1)


def unet():
    """The U-Net on 19 x 23 images (19 -> 9 -> 4 -> 9 -> 19 rows: tiles of 10/9, 5/4, 2/2 on a
    2x1 grid; 5/5/5/4, 3/2/2/2, 1/1/1/1 on 4x1)."""
    return UNet(), torch.randn(4, 3, 19, 23)
