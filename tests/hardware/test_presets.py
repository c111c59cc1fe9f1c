"""Device and link presets: every preset loads, names are forgiving, unknown names say the fix."""

from __future__ import annotations

import json
import math

import pytest

from outcore.errors import UsageError
from outcore.hardware.presets import (
    device_preset,
    link_names,
    link_preset,
    normalize,
    preset_names,
    preset_source,
    save_device_preset,
    spec_from_dict,
    spec_to_dict,
)
from outcore.hardware.spec import DeviceSpec, LinkSpec

GPU_PRESETS = ("v100-sxm2-16gb", "v100-sxm2-32gb", "a100-sxm4-40gb", "a100-sxm4-80gb",
               "h100-sxm5-80gb", "mi250x-gcd")


def test_all_required_presets_are_shipped():
    assert set(GPU_PRESETS) | {"cpu"} <= set(preset_names())


@pytest.mark.parametrize("name", sorted(set(GPU_PRESETS) | {"cpu"}))
def test_every_preset_loads_with_positive_figures_and_a_source(name):
    spec = device_preset(name)
    assert isinstance(spec, DeviceSpec)
    assert spec.name == name
    for value in (spec.memory_bytes, spec.peak_flops, spec.mem_bandwidth, spec.launch_s,
                  spec.host_bandwidth):
        assert math.isfinite(value) and value > 0
    assert 0 < spec.efficiency <= 1
    source = preset_source(name)
    assert len(source) > 40
    if name != "cpu":
        assert "data sheet" in source
        assert spec.peak_flops_tc > spec.peak_flops  # tensor/matrix units are faster


def test_data_sheet_figures():
    gib = 2**30
    a100_80 = device_preset("a100-80gb")
    assert a100_80.memory_bytes == 80 * gib and a100_80.mem_bandwidth == 2039e9
    assert a100_80.peak_flops == 19.5e12 and a100_80.peak_flops_tc == 312e12
    assert device_preset("a100").mem_bandwidth == 1555e9
    v100 = device_preset("v100")
    assert v100.peak_flops == 15.7e12 and v100.mem_bandwidth == 900e9
    assert v100.memory_bytes == 16 * gib and device_preset("v100-32gb").memory_bytes == 32 * gib
    h100 = device_preset("h100")
    assert h100.peak_flops == 67e12 and h100.mem_bandwidth == 3350e9
    gcd = device_preset("mi250x")
    assert gcd.memory_bytes == 64 * gib  # one of the two dies of the 128 GB package
    assert gcd.mem_bandwidth == pytest.approx(3276.8e9 / 2)


@pytest.mark.parametrize("spelling", ["A100", "a100_40gb", " A100-SXM4-40GB ", "a100 sxm4"])
def test_names_are_case_insensitive_with_aliases(spelling):
    assert device_preset(spelling) == device_preset("a100-sxm4-40gb")


def test_normalize():
    assert normalize(" H100_SXM ") == "h100-sxm"
    assert normalize("A100--80GB") == "a100-80gb"


def test_unknown_device_lists_the_known_ones():
    with pytest.raises(UsageError) as e:
        device_preset("tpu-v9")
    message = str(e.value)
    assert "tpu-v9" in message
    for name in GPU_PRESETS:
        assert name in message
    assert "outcore.hardware.probe" in message


def test_device_spec_passes_through():
    spec = DeviceSpec("mine", 1e9, 1e12, 1e11)
    assert device_preset(spec) is spec


def test_round_trip_through_json(tmp_path):
    spec = device_preset("h100")
    again = spec_from_dict(json.loads(json.dumps(spec_to_dict(spec))))
    assert again == spec
    path = save_device_preset(spec, tmp_path / "mine.json")
    assert device_preset(str(path)) == spec


def test_missing_preset_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        device_preset(str(tmp_path / "nope.json"))


def test_user_preset_directory_overrides_shipped_cpu(tmp_path, monkeypatch):
    mine = DeviceSpec("cpu", 8e9, 1.5e11, 2e10, launch_s=3e-6, efficiency=1.0,
                      extra={"source": "measured elsewhere"})
    save_device_preset(mine, tmp_path / "cpu.json")
    monkeypatch.setenv("OUTCORE_PRESETS", str(tmp_path))
    assert device_preset("CPU").peak_flops == 1.5e11
    assert "cpu" in preset_names()
    monkeypatch.delenv("OUTCORE_PRESETS")
    assert device_preset("cpu").peak_flops != 1.5e11


def test_link_presets():
    assert {"nvlink2", "nvlink3", "nvlink4", "pcie3-x16", "pcie4-x16", "ib-edr", "ib-hdr",
            "10gbe", "100gbe"} <= set(link_names())
    for name in link_names():
        link = link_preset(name)
        assert isinstance(link, LinkSpec) and link.bandwidth > 0 and link.latency_s > 0
        assert len(preset_source(name)) > 30
    assert link_preset("IB_EDR").bandwidth == 12.5e9
    assert link_preset("ib-hdr").bandwidth == 25e9
    assert link_preset("10GbE").bandwidth == 1.25e9
    assert link_preset("nvlink").bandwidth > link_preset("pcie4").bandwidth
    assert link_preset("100gbe").time(12.5e9) == pytest.approx(1.0, rel=1e-3)


def test_unknown_link_lists_the_known_ones():
    with pytest.raises(UsageError) as e:
        link_preset("carrier-pigeon")
    assert "ib-edr" in str(e.value) and "nvlink3" in str(e.value)
