"""Profiling layer by layer (``outcore.cost.profile_layers``): a model built without its weights
is timed one layer at a time on the device, identical layers timed once, and ``model_graph``
falls back to it when the whole model's training state does not fit the device."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import outcore
from outcore.cost.profile_layers import _hollow, profile_by_layer
from outcore.graph.capture import capture
from outcore.zoo import build_model
from outcore.zoo.weightless import fake_inputs

MODEL = "outcore:transformer:layers=4"


def _weightless(model: str):
    spec, net = build_model(model, weights=False)
    return spec, net, capture(net, fake_inputs(net, spec.example_inputs), name=model)


def test_identical_layers_are_timed_once_on_a_model_without_weights():
    spec, net, g = _weightless(MODEL)
    timed = profile_by_layer(g, net, spec.example_inputs, warmup=1, repeat=2)
    prof = timed.meta["profile"]
    assert timed.meta["costs"] == "profiled" and prof["nodes_timed"] == "by_layer"
    same = prof["same_as"]
    # the four decoder layers are one layer four times: most nodes reuse a twin's time
    assert prof["reused"] == len(same) > 3 * prof["timed"], prof["timed"]
    index = {timed.name_of(i): i for i in range(timed.num_nodes)}
    for name, twin in same.items():
        assert name != twin and twin not in same  # a reused time is a timed node's
        assert timed.fwd_s[index[name]] == timed.fwd_s[index[twin]]
        assert timed.bwd_s[index[name]] == timed.bwd_s[index[twin]]
    linear = [i for i in range(timed.num_nodes) if timed.op_of(i) == "linear"]
    assert linear and all(timed.fwd_s[i] > 0 and timed.bwd_s[i] > 0 for i in linear)
    # nothing was built for the model itself: its parameters still have no values
    assert all(_hollow(p) for p in net.parameters())


def test_a_real_model_is_left_as_it_was_and_timed_like_the_whole_profile():
    spec, net = build_model("timm:resnet18:image_size=32")
    before = {k: v.detach().clone() for k, v in net.state_dict().items()}
    g = capture(net, spec.example_inputs, name="r18")
    by_layer = profile_by_layer(g, net, spec.example_inputs, warmup=1, repeat=3)
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in net.parameters())
    whole = outcore.profile(g, net, spec.example_inputs, warmup=1, repeat=3)
    a = float(by_layer.fwd_s.sum() + by_layer.bwd_s.sum())
    b = float(whole.fwd_s.sum() + whole.bwd_s.sum())
    # alone against inside whole steps, on a shared machine: the same order of magnitude
    assert 0.25 < a / b < 4, (a, b)
    conv = [i for i in range(g.num_nodes) if g.op_of(i) == "conv2d"]
    assert np.all(by_layer.fwd_s[conv] > 0)


def test_model_graph_profiles_by_layer_when_the_model_does_not_fit(monkeypatch, caplog):
    import outcore.hardware.probe as probe
    monkeypatch.setattr(probe, "free_memory_bytes", lambda device: 1024.0)
    with caplog.at_level(logging.WARNING, logger="outcore.api"):
        g = outcore.model_graph("hf:gpt2:num_hidden_layers=3", costs="profile", repeat=2,
                                warmup=1)
    assert g.meta["profile"]["nodes_timed"] == "by_layer"
    assert g.meta["profile"]["reused"] > 0
    assert "profiling it layer by layer" in caplog.text
    assert g.total_compute_s > 0


def test_profile_by_layer_is_a_cost_source():
    g = outcore.model_graph(MODEL, costs="profile-by-layer", repeat=2, warmup=1)
    assert g.meta["profile"]["nodes_timed"] == "by_layer"
    with pytest.raises(outcore.errors.UsageError, match="profile-by-layer"):
        outcore.model_graph(MODEL, costs="profiles")
