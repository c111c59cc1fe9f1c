"""The profiler times the runtime's optimizer action after a backward; the simulator scales its
CPU optimizer model by it."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from outcore.cost.profile import profile
from outcore.graph.capture import capture
from outcore.hardware.cluster import make_cluster
from outcore.hardware.presets import device_preset
from outcore.plan import make_plan
from outcore.plan.layout import Layout
from outcore.schedule.lower import lower
from outcore.sim.simulate import optimizer_scale, simulate


def _scale_and_step(g, cluster, dp: int = 1) -> tuple[float, float]:
    """(the simulator's optimizer scale, the simulated iteration) of ``g`` on one device, or
    on ``dp`` data-parallel copies of it."""
    layout = Layout.replicate("mp", 1, dp=dp) if dp > 1 else Layout()
    p = make_plan(g, np.zeros(g.num_nodes, np.int64), strategy="single", devices=dp,
                  memory_bytes=None, cluster=cluster, optimizer="adam", layout=layout)
    low = lower(g, p)
    return optimizer_scale(g, low.costs, low.cluster, low.copies), simulate(p, g).iteration_s


def test_the_optimizer_step_is_timed_and_scales_the_model():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                        nn.Linear(32, 4))
    x = torch.randn(8, 16)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    g = profile(capture(net, x, path="export"), net, x, device="cpu", warmup=1, repeat=3)
    measured = g.meta["profile"]["adam_step_s"]
    assert measured > 0
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # lr 0
    assert all(p.grad is None for p in net.parameters())
    cpu = make_cluster(1, None, device=device_preset("cpu"))
    assert 0.5 <= _scale_and_step(g, cpu)[0] <= 4.0
    # a step twice as long: twice the scale, a longer iteration. The steps are set at 1.5x and
    # 3x the modelled one, inside the clip whatever this machine measured
    modelled = _modelled_step_s(g, cpu)
    scale, it = _scale_and_step(_with_step(g, 1.5 * modelled), cpu)
    scale2, it2 = _scale_and_step(_with_step(g, 3.0 * modelled), cpu)
    assert abs(scale - 1.5) < 1e-9 and abs(scale2 - 3.0) < 1e-9
    assert it2 > it
    slow = _with_step(g, 2 * measured)
    # no CPU profile, or an accelerator: the model as it is
    gpu = make_cluster(1, None, device=device_preset("a100"))
    assert _scale_and_step(slow, gpu)[0] == 1.0
    bare = g.replace(meta={k: v for k, v in g.meta.items() if k != "profile"})
    assert _scale_and_step(bare, cpu)[0] == 1.0


def _with_step(g, step_s: float):
    """``g`` with its profiled optimizer step set to ``step_s``."""
    return g.replace(meta={**g.meta, "profile": {**g.meta["profile"], "adam_step_s": step_s}})


def _modelled_step_s(g, cluster) -> float:
    """The modelled step the simulator divides the measured one by, read off a step the clip
    leaves alone (the scale is measured / modelled, clipped to [0.5, 4])."""
    step = g.meta["profile"]["adam_step_s"]
    for _ in range(20):
        scale = _scale_and_step(_with_step(g, step), cluster)[0]
        if 0.5 < scale < 4.0:
            return step / scale
        step = step / 8 if scale >= 4.0 else step * 8
    raise AssertionError("no step inside the clip")


def _profiled_mlp():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    return profile(capture(net, x, path="export"), net, x, device="cpu", warmup=1, repeat=3), net


def test_data_parallel_copies_are_priced_against_one_copy_of_the_model():
    """The profiled step updated one copy of the model: every data-parallel copy steps its
    own, at the one-copy scale (pricing both copies' parameters against it halved it)."""
    g, net = _profiled_mlp()
    prof = g.meta["profile"]
    assert prof["adam_tensors"] == len(list(net.parameters()))
    assert prof["adam_param_bytes"] == sum(p.numel() * 4 for p in net.parameters())
    cpu = make_cluster(2, None, device=device_preset("cpu"))
    one, _ = _scale_and_step(g, cpu)
    two, _ = _scale_and_step(g, cpu, dp=2)
    assert two == one
    # a profile from before the profiler recorded what it stepped: the plan's parameters over
    # its copies give the same scale
    old = g.replace(meta={**g.meta, "profile": {k: v for k, v in prof.items()
                                                 if k not in ("adam_tensors",
                                                              "adam_param_bytes")}})
    assert _scale_and_step(old, cpu, dp=2)[0] == one
