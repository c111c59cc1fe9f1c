"""A spatial plan's predicted peak per rank against the measured one (the CPU allocator's),
on the huge-image benchmark's network (``benchmarks/spatial_job.py``) at 256 x 256: no rank
over its prediction by more than 5 %, none more than 15 % under it (measured 4 % and 11 %
under: the prediction bounds the scratch memory of 4-channel convolutions from above). When
the tracker watched operator outputs it saw no scratch memory, and both ranks measured 0.6 %
from a prediction without it. Twice, in
whole-suite runs, a rank measured more (the tile rank +4.3 %, the spatial stage +7.7 %): gloo's
worker thread still held a finished gather's or scatter's tensors (``runtime.comm.settled``
now waits for it; reproduced on one core in 4 of 24 runs before, 0 of 16 after). Before the
tile ranks cut their tile out of the batch, the spatial stage measured 9.5 % above the
prediction and the tile rank 11.7 %."""

from __future__ import annotations

import pytest

import outcore

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

NET = '''
import torch
from torch import nn


def net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
'''


def test_tile_ranks_peak_as_predicted(tmp_path):
    model = tmp_path / "net.py"
    model.write_text(NET)
    r = outcore.train(f"{model}:net", 2, sp=2, sp_join="_6", memory_policy="none",
                      input_shape="1x3x256x256", batch_size=1, steps=2, optimizer="sgd",
                      lr=0.01, costs="estimate:cpu", timeline=False, run_dir=str(tmp_path / "run"))
    predicted = r.predicted["peak_bytes"]
    assert len(r.peak_bytes) == len(predicted) == 2
    for measured, pred in zip(r.peak_bytes, predicted):  # a bound, and a close one
        assert 0.85 * pred <= measured <= 1.05 * pred, (r.peak_bytes, predicted)
