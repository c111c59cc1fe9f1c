"""An AmoebaNet-like network of multi-branch cells, built from code.

Shaped after AmoebaNet-A (Real et al., "Regularized Evolution for Image Classifier Architecture
Search", AAAI 2019, figure 4): every cell reads the outputs of the two previous cells, runs five
pairs of operations (separable convolutions, pooling, identity) as parallel branches, adds each
pair, and concatenates the unused results. This is the kind of graph where partitions that are not
a chain (ParDNN) and sub-graph parallelism (SUPER) pay off. Channels and cell counts are
configurable; the operation choices are fixed, not evolved.
"""

from __future__ import annotations

import torch
from torch import nn


class SepConv(nn.Module):
    """ReLU, depthwise k×k, pointwise 1×1, BatchNorm."""

    def __init__(self, ch: int, k: int, stride: int = 1):
        super().__init__()
        self.relu = nn.ReLU()
        self.depthwise = nn.Conv2d(ch, ch, k, stride=stride, padding=k // 2, groups=ch,
                                   bias=False)
        self.pointwise = nn.Conv2d(ch, ch, 1, bias=False)
        self.bn = nn.BatchNorm2d(ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.pointwise(self.depthwise(self.relu(x))))


class ReLUConvBN(nn.Module):
    """ReLU, 1×1 convolution (optionally strided), BatchNorm: adapts a cell input."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv = nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)
        self.bn = nn.BatchNorm2d(out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(self.relu(x)))


def _op(name: str, ch: int, stride: int) -> nn.Module:
    if name == "sep3":
        return SepConv(ch, 3, stride)
    if name == "sep5":
        return SepConv(ch, 5, stride)
    if name == "sep7":
        return SepConv(ch, 7, stride)
    if name == "avg3":
        return nn.AvgPool2d(3, stride=stride, padding=1, count_include_pad=False)
    if name == "max3":
        return nn.MaxPool2d(3, stride=stride, padding=1)
    if name == "id":
        return nn.Identity() if stride == 1 else ReLUConvBN(ch, ch, stride)
    raise ValueError(name)


# (input a, op a, input b, op b) for the five pairs; inputs 0 and 1 are the two previous cells,
# 2.. are earlier pairs of this cell. Normal and reduction cells as in AmoebaNet-A (simplified).
NORMAL = [(0, "avg3", 0, "max3"), (0, "sep3", 1, "id"), (1, "avg3", 0, "sep5"),
          (3, "sep3", 1, "avg3"), (4, "avg3", 1, "sep3")]
REDUCTION = [(0, "max3", 1, "sep3"), (1, "sep7", 0, "max3"), (1, "sep7", 1, "avg3"),
             (2, "max3", 0, "sep3"), (3, "sep5", 1, "avg3")]


class Cell(nn.Module):
    """One AmoebaNet cell: five two-branch pairs over two inputs; output = concat of leaves."""

    def __init__(self, prev_prev_ch: int, prev_ch: int, ch: int, reduction: bool,
                 prev_reduction: bool):
        super().__init__()
        self.pre0 = ReLUConvBN(prev_prev_ch, ch, stride=2 if prev_reduction else 1)
        self.pre1 = ReLUConvBN(prev_ch, ch)
        genotype = REDUCTION if reduction else NORMAL
        self.genotype = genotype
        self.ops = nn.ModuleList()
        for a, op_a, b, op_b in genotype:
            self.ops.append(_op(op_a, ch, 2 if reduction and a < 2 else 1))
            self.ops.append(_op(op_b, ch, 2 if reduction and b < 2 else 1))
        used = {x for a, _, b, _ in genotype for x in (a, b)}
        self.concat = [i for i in range(2, 2 + len(genotype)) if i not in used]
        self.out_ch = ch * len(self.concat)

    def forward(self, s0: torch.Tensor, s1: torch.Tensor) -> torch.Tensor:
        states = [self.pre0(s0), self.pre1(s1)]
        for k, (a, _, b, _) in enumerate(self.genotype):
            states.append(self.ops[2 * k](states[a]) + self.ops[2 * k + 1](states[b]))
        return torch.cat([states[i] for i in self.concat], dim=1)


class AmoebaNet(nn.Module):
    """Stem, then ``stages`` groups of ``cells`` normal cells each followed by a reduction cell."""

    def __init__(self, cells: int = 2, stages: int = 2, channels: int = 16,
                 num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels))
        self.cells = nn.ModuleList()
        pp, p, ch, prev_red = channels, channels, channels, False
        for s in range(stages + 1):
            for _ in range(cells):
                cell = Cell(pp, p, ch, False, prev_red)
                self.cells.append(cell)
                pp, p, prev_red = p, cell.out_ch, False
            if s < stages:
                ch *= 2
                cell = Cell(pp, p, ch, True, False)
                self.cells.append(cell)
                pp, p, prev_red = p, cell.out_ch, True
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(p, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s0 = s1 = self.stem(x)
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1)
        return self.fc(torch.flatten(self.pool(self.relu(s1)), 1))


def amoebanet(cells: int = 2, stages: int = 2, channels: int = 16,
              num_classes: int = 10) -> nn.Module:
    """AmoebaNet-like classifier: ``(stages + 1) * cells + stages`` cells."""
    return AmoebaNet(cells, stages, channels, num_classes)
