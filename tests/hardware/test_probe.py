"""The probe measures the live CPU in a few seconds and respects the thread setting."""

from __future__ import annotations

import math

import torch

from outcore.hardware.probe import main, measure_cpu


def test_measure_cpu_quick_returns_a_plausible_spec():
    before = torch.get_num_threads()
    spec = measure_cpu(threads=1, quick=True)
    assert torch.get_num_threads() == before  # restored
    assert spec.name == "cpu" and spec.extra["threads"] == 1 and spec.extra["measured"]
    assert 1e8 < spec.peak_flops < 1e13  # 0.1 GFLOP/s .. 10 TFLOP/s for one thread
    assert 1e8 < spec.mem_bandwidth < 1e12
    assert 0 < spec.launch_s < 1e-2
    assert spec.efficiency == 1.0 and spec.memory_bytes > 0
    assert all(math.isfinite(v) for v in (spec.peak_flops, spec.mem_bandwidth, spec.launch_s))
    assert "measured by outcore.hardware.probe" in spec.extra["source"]


def test_probe_command_writes_a_loadable_preset(tmp_path):
    from outcore.hardware.presets import device_preset
    out = tmp_path / "cpu.json"
    assert main(["--threads", "1", "--quick", "--out", str(out)]) == 0
    spec = device_preset(str(out))
    assert spec.name == "cpu" and spec.peak_flops > 0
