"""ResNet-k and wide ResNet, built from code (random init, no downloads).

ResNet-k follows the pre-activation bottleneck ResNet of He et al., "Identity Mappings in Deep
Residual Networks" (ECCV 2016, section 4: depth = 9n + 2 with three stages of n bottleneck blocks),
the family GEMS scales to ResNet-1001 and beyond on 512²–2048² images. Wide ResNet follows
Zagoruyko & Komodakis, "Wide Residual Networks" (BMVC 2016, table 1: depth = 6n + 4, widen factor
k, basic pre-activation blocks).
"""

from __future__ import annotations

import torch
from torch import nn


class PreActBottleneck(nn.Module):
    """BN-ReLU-conv1x1, BN-ReLU-conv3x3, BN-ReLU-conv1x1, plus an identity or projection skip."""

    expansion = 4

    def __init__(self, in_ch: int, mid_ch: int, stride: int = 1):
        super().__init__()
        out_ch = mid_ch * self.expansion
        self.bn1 = nn.BatchNorm2d(in_ch)
        self.conv1 = nn.Conv2d(in_ch, mid_ch, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid_ch)
        self.conv2 = nn.Conv2d(mid_ch, mid_ch, 3, stride=stride, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(mid_ch)
        self.conv3 = nn.Conv2d(mid_ch, out_ch, 1, bias=False)
        self.relu = nn.ReLU()
        self.shortcut = (nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)
                         if stride != 1 or in_ch != out_ch else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(x))
        skip = self.shortcut(out) if not isinstance(self.shortcut, nn.Identity) else x
        out = self.conv1(out)
        out = self.conv2(self.relu(self.bn2(out)))
        out = self.conv3(self.relu(self.bn3(out)))
        return out + skip


class PreActBasic(nn.Module):
    """The wide-ResNet block: BN-ReLU-conv3x3 twice, plus an identity or projection skip."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_ch)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False)
        self.relu = nn.ReLU()
        self.shortcut = (nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)
                         if stride != 1 or in_ch != out_ch else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(x))
        skip = self.shortcut(out) if not isinstance(self.shortcut, nn.Identity) else x
        out = self.conv1(out)
        out = self.conv2(self.relu(self.bn2(out)))
        return out + skip


class _StagedNet(nn.Module):
    def __init__(self, stem_ch: int, stages: list[nn.Sequential], final_ch: int,
                 num_classes: int):
        super().__init__()
        self.stem = nn.Conv2d(3, stem_ch, 3, padding=1, bias=False)
        for i, stage in enumerate(stages):
            self.add_module(f"stage{i + 1}", stage)
        self.num_stages = len(stages)
        self.bn = nn.BatchNorm2d(final_ch)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(final_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i in range(self.num_stages):
            x = getattr(self, f"stage{i + 1}")(x)
        x = self.pool(self.relu(self.bn(x)))
        return self.fc(torch.flatten(x, 1))


def resnet_k(depth: int = 29, width: int = 16, num_classes: int = 10) -> nn.Module:
    """Pre-activation bottleneck ResNet of ``depth = 9n + 2`` layers (29, 56, 110, 164, 1001)."""
    if depth < 11 or (depth - 2) % 9:
        raise ValueError(f"resnet_k depth must be 9n+2 with n >= 1 (11, 20, 29, 110, 1001), "
                         f"got {depth}")
    n = (depth - 2) // 9
    stages, in_ch = [], width
    for s, mid in enumerate((width, width * 2, width * 4)):
        blocks = []
        for b in range(n):
            blocks.append(PreActBottleneck(in_ch, mid, stride=2 if (s > 0 and b == 0) else 1))
            in_ch = mid * PreActBottleneck.expansion
        stages.append(nn.Sequential(*blocks))
    return _StagedNet(width, stages, in_ch, num_classes)


def wide_resnet(depth: int = 16, widen: int = 4, num_classes: int = 10) -> nn.Module:
    """WRN-``depth``-``widen`` (depth = 6n + 4: 10, 16, 22, 28, 40)."""
    if depth < 10 or (depth - 4) % 6:
        raise ValueError(f"wide_resnet depth must be 6n+4 (10, 16, 22, 28, 40), got {depth}")
    n = (depth - 4) // 6
    stages, in_ch = [], 16
    for s, ch in enumerate((16 * widen, 32 * widen, 64 * widen)):
        blocks = []
        for b in range(n):
            blocks.append(PreActBasic(in_ch, ch, stride=2 if (s > 0 and b == 0) else 1))
            in_ch = ch
        stages.append(nn.Sequential(*blocks))
    return _StagedNet(16, stages, in_ch, num_classes)
