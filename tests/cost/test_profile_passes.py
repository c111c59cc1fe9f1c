"""The profiler calibrates each pass on its own: the nodes' forward times add up to a timed
step's forward, their backward times to its backward (a forward right after a backward runs
colder than one repeated at once, which one scale for both passes spread over the backwards)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from outcore.cost.profile import profile, time_step
from outcore.graph.capture import capture


def _net_and_input():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(),
                        nn.Linear(64, 4))
    return net, torch.randn(8, 16)


def test_each_pass_adds_up_to_the_timed_step_pass():
    net, x = _net_and_input()
    g = profile(capture(net, x, path="export"), net, x, device="cpu", warmup=1, repeat=3)
    prof = g.meta["profile"]
    assert prof["step_fwd_s"] > 0 and prof["step_bwd_s"] > 0
    assert float(np.sum(g.fwd_s)) == pytest.approx(prof["step_fwd_s"], rel=1e-9)
    assert float(np.sum(g.bwd_s)) == pytest.approx(prof["step_bwd_s"], rel=1e-9)
    assert prof["step_s"] == pytest.approx(prof["step_fwd_s"] + prof["step_bwd_s"])
    # without calibration the node times are left as timed
    raw = profile(capture(net, x, path="export"), net, x, device="cpu", warmup=1, repeat=3,
                  calibrate=False)
    assert raw.meta["profile"]["scale_fwd"] == raw.meta["profile"]["scale_bwd"] == 1.0
    assert float(np.sum(raw.fwd_s)) > 0 and float(np.sum(raw.bwd_s)) > 0


def test_time_step_splits_forward_and_backward():
    net, x = _net_and_input()
    fwd, bwd = time_step(net, (x,), torch.device("cpu"), warmup=1, repeat=5)
    assert fwd > 0 and bwd > 0
    assert all(p.grad is None for p in net.parameters())  # left as found
