"""Analytical (roofline) estimate: finite costs on real graphs, the FLOP/byte rules, fallbacks."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from outcore.cost.analytical import (
    MATRIX_OPS,
    ZERO_COST_OPS,
    estimate,
    layer_times,
    matrix_flops,
    needs_grad,
    roofline_s,
    work,
)
from outcore.graph.coarsen import collapse
from outcore.graph.ir import build
from outcore.hardware.presets import device_preset
from outcore.hardware.spec import DeviceSpec

SPEC = DeviceSpec("test", memory_bytes=1e10, peak_flops=1e12, mem_bandwidth=1e11,
                  peak_flops_tc=8e12, launch_s=1e-5, efficiency=0.5)
ZOO = ["outcore:resnet_k", "outcore:amoebanet", "outcore:transformer", "outcore:lstm_lm",
       "outcore:mlp", "outcore:diamond", "outcore:two_tower", "outcore:wide_resnet"]


@pytest.fixture(scope="module")
def graphs():
    from outcore.graph.capture import capture
    from outcore.zoo import resolve_model
    out = {}
    for name in ZOO + ["torchvision:resnet18"]:
        spec = resolve_model(name, batch_size=2)
        out[name] = capture(spec.build(), spec.example_inputs, name=name)
    return out


@pytest.mark.parametrize("device", ["v100", "h100", "mi250x", "cpu"])
def test_costs_finite_and_non_negative_on_every_zoo_graph(graphs, device):
    for name, g in graphs.items():
        e = estimate(g, device)
        assert np.isfinite(e.fwd_s).all() and np.isfinite(e.bwd_s).all(), name
        assert (e.fwd_s >= 0).all() and (e.bwd_s >= 0).all(), name
        assert e.meta["costs"] == f"estimated:{device_preset(device).name}"
        for i in range(e.num_nodes):
            op = e.op_of(i)
            if op in ZERO_COST_OPS:
                assert e.fwd_s[i] == 0 and e.bwd_s[i] == 0, (name, op)
            elif op in ("conv2d", "linear", "relu", "batchnorm2d", "matmul", "lstm"):
                assert e.fwd_s[i] > 0 and e.bwd_s[i] > 0, (name, op)
        assert e.meta["estimate"]["nodes"]["fallback"] == 0  # captured graphs carry attrs
        assert e.total_compute_s > 0


def test_input_graph_is_not_modified(graphs):
    g = graphs["outcore:mlp"]
    estimate(g, SPEC)
    assert g.total_compute_s == 0 and g.meta["costs"] == "none"


def test_faster_device_is_never_slower(graphs):
    g = graphs["torchvision:resnet18"]
    v100, h100 = estimate(g, "v100"), estimate(g, "h100")
    assert (h100.fwd_s <= v100.fwd_s).all() and (h100.bwd_s <= v100.bwd_s).all()
    assert h100.total_compute_s < 0.8 * v100.total_compute_s


def test_conv_flops_match_capture(graphs):
    g = graphs["torchvision:resnet18"]
    for i in range(g.num_nodes):
        if g.op_of(i) == "conv2d":
            a = g.attrs[i]
            assert matrix_flops("conv2d", a["config"], a["in_shapes"], a["shape"]) == a["flops"]


def test_backward_flop_rules():
    conv = {"in_shapes": [[2, 8, 16, 16]], "shape": [2, 16, 16, 16], "flops": 1e6,
            "config": {"in_channels": 8, "out_channels": 16, "kernel_size": [3, 3]}}
    w = work("conv2d", conv, param_bytes=4608, out_bytes=32768)
    assert w.bwd_flops == 2 * w.fwd_flops and w.matrix  # grad input + grad weight
    first = work("conv2d", conv, param_bytes=4608, out_bytes=32768, needs_input_grad=False)
    assert first.bwd_flops == first.fwd_flops  # weight gradient only
    mm = work("matmul", {"in_shapes": [[4, 8], [8, 4]], "shape": [4, 4]}, param_bytes=0,
              out_bytes=64)
    assert mm.fwd_flops == 2 * 4 * 8 * 4 and mm.bwd_flops == 2 * mm.fwd_flops
    relu = work("relu", {"in_shapes": [[4, 8]], "shape": [4, 8]}, param_bytes=0, out_bytes=128)
    assert relu.bwd_flops == relu.fwd_flops == 32
    assert relu.fwd_bytes == 256 and relu.bwd_bytes == 384  # + the output gradient


@settings(max_examples=60, deadline=None)
@given(flops=st.floats(0, 1e15), nbytes=st.floats(0, 1e12), df=st.floats(0, 1e14),
       db=st.floats(0, 1e11), kernels=st.integers(0, 4))
def test_roofline_is_monotone_in_flops_and_bytes(flops, nbytes, df, db, kernels):
    t = roofline_s(flops, nbytes, kernels, SPEC)
    assert t >= kernels * SPEC.launch_s
    assert roofline_s(flops + df, nbytes, kernels, SPEC) >= t
    assert roofline_s(flops, nbytes + db, kernels, SPEC) >= t
    assert t == pytest.approx(max(flops / 5e11, nbytes / 1e11) + kernels * 1e-5)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 512), fin=st.integers(1, 2048), fout=st.integers(1, 2048),
       extra=st.integers(1, 2048))
def test_linear_time_grows_with_features(rows, fin, fout, extra):
    def times(out_features):
        attrs = {"in_shapes": [[rows, fin]], "shape": [rows, out_features],
                 "config": {"in_features": fin, "out_features": out_features}}
        return layer_times("linear", attrs, SPEC, param_bytes=4 * (fin + 1) * out_features,
                           out_bytes=4 * rows * out_features)
    small, big = times(fout), times(fout + extra)
    assert big[0] >= small[0] and big[1] >= small[1]


@settings(max_examples=40, deadline=None)
@given(elements=st.integers(1, 10**7), extra=st.integers(1, 10**7))
def test_elementwise_time_grows_with_bytes(elements, extra):
    def times(n):
        return layer_times("relu", {"in_shapes": [[n]], "shape": [n]}, SPEC, param_bytes=0,
                           out_bytes=4 * n)
    assert times(elements + extra)[0] >= times(elements)[0]
    assert times(elements + extra)[1] >= times(elements)[1]


def test_half_precision_matrix_work_uses_tensor_cores():
    attrs = {"in_shapes": [[4096, 4096]], "shape": [4096, 4096], "flops": 2 * 4096**3,
             "config": {"in_features": 4096, "out_features": 4096}}
    fp32 = layer_times("linear", {**attrs, "dtype": "float32"}, "a100", param_bytes=2**26,
                       out_bytes=2**26)
    fp16 = layer_times("linear", {**attrs, "dtype": "float16"}, "a100", param_bytes=2**25,
                       out_bytes=2**25)
    assert fp16[0] < fp32[0] / 8  # 312 vs 19.5 TFLOP/s


def test_hand_built_graph_without_attrs_is_memory_bound():
    g = build("hand", fwd_s=[0.0, 0.0, 0.0], src=[0, 1], dst=[1, 2],
              edge_bytes=[1e6, 2e6], param_bytes=[0, 4e5, 0])
    e = estimate(g, SPEC)
    assert e.meta["estimate"]["nodes"]["fallback"] == 3
    # out_bytes default to the largest outgoing edge: node 0 writes 1e6, node 1 writes 2e6
    assert e.fwd_s[0] == pytest.approx(2 * 1e6 / 1e11 + 1e-5)
    assert e.fwd_s[1] == pytest.approx((2 * 2e6 + 4e5) / 1e11 + 1e-5)
    assert e.fwd_s[2] == pytest.approx(1e-5)  # sink without output bytes: launch only
    assert (e.bwd_s > 0).all()  # no op names: every node is assumed to need a gradient


def test_nodes_with_nothing_to_differentiate_have_no_backward():
    ops = ["input", "relu", "linear", "relu", "output"]
    attrs = [{"shape": [2, 8]}, {"in_shapes": [[2, 8]], "shape": [2, 8]},
             {"in_shapes": [[2, 8]], "shape": [2, 4], "flops": 128,
              "config": {"in_features": 8, "out_features": 4}},
             {"in_shapes": [[2, 4]], "shape": [2, 4]}, {"shape": [2, 4]}]
    g = build("chain", fwd_s=[0.0] * 5, src=[0, 1, 2, 3], dst=[1, 2, 3, 4],
              edge_bytes=[64, 64, 32, 32], out_bytes=[64, 64, 32, 32, 32],
              param_bytes=[0, 0, 144, 0, 0], ops=ops, attrs=attrs)
    out_grad, in_grad = needs_grad(g)
    assert out_grad.tolist() == [False, False, True, True, True]
    assert in_grad.tolist() == [False, False, False, True, True]
    e = estimate(g, SPEC)
    assert e.bwd_s[1] == 0  # relu on the input: nothing upstream needs a gradient
    assert e.bwd_s[2] > 0 and e.bwd_s[3] > 0
    lin = work("linear", attrs[2], param_bytes=144, out_bytes=32, needs_input_grad=False)
    assert e.bwd_s[2] == pytest.approx(roofline_s(lin.bwd_flops, lin.bwd_bytes, 1, SPEC))


def test_a_detached_value_needs_no_gradient_downstream():
    ops = ["input", "linear", "detach", "relu", "output"]
    g = build("chain", fwd_s=[0.0] * 5, src=[0, 1, 2, 3], dst=[1, 2, 3, 4],
              edge_bytes=[64, 32, 32, 32], out_bytes=[64, 32, 32, 32, 32],
              param_bytes=[0, 144, 0, 0, 0], ops=ops)
    out_grad, in_grad = needs_grad(g)
    assert out_grad.tolist() == [False, True, False, False, False]
    assert in_grad.tolist() == [False, False, True, False, False]


def test_collapsed_graph_falls_back_and_warns(graphs, caplog):
    g = collapse(graphs["outcore:resnet_k"], 1)
    with caplog.at_level(logging.WARNING, logger="outcore.cost.analytical"):
        e = estimate(g, SPEC)
    assert "collapse" in caplog.text
    assert np.isfinite(e.fwd_s).all() and e.total_compute_s > 0


def test_every_matrix_op_with_shapes_gets_flops(graphs):
    for g in graphs.values():
        for i in range(g.num_nodes):
            if g.op_of(i) in MATRIX_OPS and "in_shapes" in g.attrs[i]:
                w = work(g.op_of(i), g.attrs[i], param_bytes=float(g.param_bytes[i]),
                         out_bytes=float(g.out_bytes[i]))
                assert w.fwd_flops > 0, (g.name, g.op_of(i))


def test_estimate_with_a_regression_model_uses_it(graphs):
    from outcore.cost.regression import CostModel, WorkFit
    fit = WorkFit((1e-3, 0.0, 0.0))  # every covered layer: 1 ms
    model = CostModel({"linear": {"fwd": fit, "bwd": fit}})
    g = graphs["outcore:mlp"]
    e = estimate(g, SPEC, model=model)
    lin = [i for i in range(g.num_nodes) if g.op_of(i) == "linear"]
    assert e.meta["estimate"]["nodes"]["regression"] == len(lin)
    assert e.fwd_s[lin[1]] == pytest.approx(1e-3) and e.bwd_s[lin[1]] == pytest.approx(1e-3)
    assert e.bwd_s[lin[0]] == pytest.approx(0.5e-3)  # first layer: weight gradient only
