"""The CPU memory tracker measures without changing what it measures: a tracked backward grows
the process as much as an untracked one, and reports the parameters and gradients it holds."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent('''
    import json, torch
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode
    from outcore.hardware.memtrack import MemoryTracker
    torch.set_num_threads(1)
    with FakeTensorMode():  # the imports a worker's runtime makes anyway (its value metas)
        torch.ones(2) + 1

    def high_water_mib():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024

    def step(track):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4096, 4096, bias=False), nn.Linear(4096, 4096, bias=False))
        x = torch.randn(8, 4096)
        open("/proc/self/clear_refs", "w").write("5")  # the high-water mark starts again
        base = high_water_mib()
        peak = None
        if track:
            with MemoryTracker(torch.device("cpu"), list(net.parameters())) as mt:
                net(x).sum().backward()
            peak = mt.peak_bytes
        else:
            net(x).sum().backward()
        return high_water_mib() - base, peak

    step(False)  # first-time allocations out of the way
    print(json.dumps([step(track) for track in (False, True, False, True)]))
''')


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
@pytest.mark.timeout(120)
def test_tracking_leaves_the_process_memory_as_it_is():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=110)
    assert r.returncode == 0, r.stderr[-2000:]
    (plain1, _), (tracked1, peak1), (plain2, _), (tracked2, peak2) = json.loads(
        r.stdout.strip().splitlines()[-1])
    grads_mib = 2 * 4096 * 4096 * 4 / 2**20  # two 64 MiB gradients
    for plain, tracked in ((plain1, tracked1), (plain2, tracked2)):
        assert abs(tracked - plain) < 8, (plain, tracked)  # a copy of a gradient is 64 MiB
        assert plain < grads_mib + 16
    for peak in (peak1, peak2):  # the weights (the baseline) and their gradients
        assert abs(peak / 2**20 - 2 * grads_mib) < 2, peak


def test_tracking_leaves_autograd_summing_in_place():
    """A tensor two layers read gets two gradients, which autograd adds into one of them; an
    operator-watching tracker (any ``TorchDispatchMode``) made it add out of place, a third
    tensor the untracked program never holds."""
    import torch
    from torch import nn

    from outcore.hardware.memtrack import MemoryTracker

    def summed_in_place(track: bool) -> bool:
        torch.manual_seed(0)
        a, b = nn.Linear(256, 128), nn.Linear(256, 128)
        x = torch.randn(32, 256, requires_grad=True)
        ptrs: list = []
        a.register_full_backward_hook(lambda m, gi, go: ptrs.append(gi[0].data_ptr()))
        b.register_full_backward_hook(lambda m, gi, go: ptrs.append(gi[0].data_ptr()))
        y = torch.relu(x)
        y.register_hook(lambda g: ptrs.append(("sum", g.data_ptr())))
        loss = a(y).sum() + b(y).sum()
        if track:
            with MemoryTracker(torch.device("cpu"), [*a.parameters(), *b.parameters()]) as mt:
                loss.backward()
            # the weights, their gradients, and at most the two branches' gradients of y and
            # x's (the sum in place): nothing measured is a copy
            weights = 2 * (256 * 128 + 128) * 4
            assert 2 * weights < mt.peak_bytes <= 2 * weights + 3 * 32 * 256 * 4 + 4096
        else:
            loss.backward()
        assert len(ptrs) == 3
        return ptrs[-1][1] in ptrs[:-1]

    assert summed_in_place(False)
    assert summed_in_place(True)
