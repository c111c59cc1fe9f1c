"""spatialize() in one process: a 1x1 grid runs every spatial layer's region/padding/crop logic
and must equal the serial model; unsupported layers and wrong sizes fail with a fix."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from outcore.errors import UsageError
from outcore.parallel.spatial import spatialize
from tests.parallel.spatial.nets import ResNetStyle, UNet
from tests.parallel.spatial.workers import LAYERS


@pytest.mark.parametrize("src", LAYERS)
def test_single_tile_layer_equals_serial(src):
    torch.manual_seed(1)
    serial = eval(src).double()
    x = torch.randn(2, 4, 13, 11, dtype=torch.float64, requires_grad=True)
    sm = spatialize(copy.deepcopy(serial), "1x1", example=x.detach())
    xs = x.detach().clone().requires_grad_(True)
    y, ys = serial(x), sm(xs)
    w = torch.randn(y.shape, dtype=torch.float64)
    (y * w).sum().backward()
    (ys * w).sum().backward()
    torch.testing.assert_close(ys, y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(xs.grad, x.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("net,join", [(ResNetStyle, "fc"), (UNet, None)])
def test_single_tile_network_equals_serial(net, join):
    torch.manual_seed(0)
    serial = net().double()
    x = torch.randn(2, 3, 30, 34, dtype=torch.float64)
    sm = spatialize(copy.deepcopy(serial), "1x1", example=x, join=join)
    torch.testing.assert_close(sm(x), serial(x), rtol=1e-12, atol=1e-12)


def test_unsupported_layer_before_the_join_names_the_fix():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Dropout(0.1), nn.Flatten(), nn.Linear(4, 2))
    with pytest.raises(UsageError, match=r"layer 1 \(Dropout\).*join='1'"):
        spatialize(model, "1x1", example=torch.empty(1, 3, 3, 3))
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Dropout(0.1), nn.Flatten(), nn.Linear(4, 2))
    sm = spatialize(model, "1x1", example=torch.empty(1, 3, 3, 3), join="1")
    assert sm.spatial_names == ["0"]
    with pytest.raises(UsageError, match="not called by the model"):
        spatialize(nn.Sequential(nn.Conv2d(3, 4, 3)), "1x1", example=torch.empty(1, 3, 3, 3),
                   join="fc")


def test_other_image_size_says_convert_again():
    sm = spatialize(nn.Sequential(nn.Conv2d(3, 4, 3)), "1x1", example=torch.empty(1, 3, 9, 9))
    with pytest.raises(UsageError, match="neither the image"):
        sm(torch.empty(1, 3, 8, 8))
    with pytest.raises(UsageError, match="spatialize\\(\\) again"):
        sm.module[0](torch.empty(1, 3, 8, 8))
