"""The pure geometry of a torch layer predicts the output size torch computes (no processes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from outcore.cost.spatial import output_hw
from outcore.parallel.spatial.layers import geometry_of

LAYERS = [nn.Conv2d(2, 2, 3, 2, 1), nn.Conv2d(2, 2, 4, padding="same"),
          nn.Conv2d(2, 2, 5, padding=6, dilation=3), nn.MaxPool2d(3, 2, 1, ceil_mode=True),
          nn.MaxPool2d(3, 2, 1, dilation=2), nn.AvgPool2d(3, 2, 1, ceil_mode=True),
          nn.ConvTranspose2d(2, 2, 3, 2, 1, output_padding=1), nn.Upsample(scale_factor=3),
          nn.Upsample(scale_factor=2, mode="bilinear"), nn.BatchNorm2d(2), nn.ReLU(),
          nn.AdaptiveAvgPool2d(1)]


@pytest.mark.parametrize("layer", LAYERS, ids=[repr(m) for m in LAYERS])
def test_geometry_predicts_torch_output_size(layer):
    hw = (13, 11)
    y = layer(torch.zeros(1, 2, *hw))
    assert output_hw(geometry_of(layer), hw) == tuple(y.shape[2:])


def test_unsupported_layer_has_no_geometry():
    assert geometry_of(nn.Linear(2, 2)) is None
