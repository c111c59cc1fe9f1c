"""Regression cost model: recovers known laws, picks forms by CV, round-trips JSON."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from outcore.cost.regression import (
    CostModel,
    Sample,
    WorkFit,
    family_of,
    fit,
    samples_from_graph,
    variables,
)
from outcore.errors import FormatError, UsageError


def conv_sample(n, cin, cout, k, size, t_fwd, t_bwd, groups=1):
    config = {"in_channels": cin, "out_channels": cout, "kernel_size": [k, k], "stride": [1, 1],
              "padding": [k // 2, k // 2], "groups": groups}
    return Sample("conv2d", config, ((n, cin, size, size),), (n, cout, size, size), t_fwd, t_bwd)


def conv_grid(law, sizes=(8, 16, 32, 64), channels=(8, 16, 32, 64), kernels=(1, 3, 5)):
    out = []
    for n, cin, cout, k, s in itertools.product((1, 4), channels, channels, kernels, sizes):
        fwd, bwd = law(n, cin, cout, k, s)
        out.append(conv_sample(n, cin, cout, k, s, fwd, bwd))
    return out


def power_law(n, cin, cout, k, s):
    base = 2e-11 * n * cin * cout * k * k * s * s
    return base, 2.2 * base * (cin ** -0.1)


def quadratic_law(n, cin, cout, k, s):
    lc, lo, ls = math.log(cin), math.log(cout), math.log(s)
    y = -20 + 1.1 * lc + 0.9 * lo + 2 * ls + 0.05 * lc * lo - 0.03 * ls ** 2 + math.log(n * k * k)
    return math.exp(y), 2 * math.exp(y + 0.02 * lc ** 2)


def test_power_law_is_recovered_exactly():
    train = conv_grid(power_law, sizes=(8, 32, 64), channels=(8, 32, 64))
    model = fit(train, forms=("log1",))
    for n, cin, cout, k, s in [(2, 16, 16, 3, 16), (8, 128, 256, 7, 112), (1, 3, 8, 1, 7)]:
        fwd, bwd = model.predict_sample(conv_sample(n, cin, cout, k, s, 1, 1))
        true = power_law(n, cin, cout, k, s)
        assert fwd == pytest.approx(true[0], rel=1e-6)  # also far outside the training range
        assert bwd == pytest.approx(true[1], rel=1e-6)


def test_quadratic_log_law_is_recovered_by_the_cv_chosen_form():
    model = fit(conv_grid(quadratic_law))
    assert model.cv["conv2d"]["fwd"]["chosen"] in ("log2", "log3")
    errors = []
    for n, cin, cout, k, s in [(2, 12, 24, 3, 12), (4, 48, 20, 5, 40), (1, 10, 60, 1, 24)]:
        pred = model.predict_sample(conv_sample(n, cin, cout, k, s, 1, 1))
        true = quadratic_law(n, cin, cout, k, s)
        errors += [abs(p - t) / t for p, t in zip(pred, true)]
    assert max(errors) < 0.01


def test_additive_roofline_law_is_recovered_by_work_form():
    def law(n, cin, cout, k, s):
        found = variables("conv2d", {"in_channels": cin, "out_channels": cout,
                                     "kernel_size": [k, k]}, [(n, cin, s, s)], (n, cout, s, s))
        assert found is not None
        _, flops, nbytes = found
        return 2e-5 + flops / 5e10 + nbytes / 1e10, 4e-5 + flops / 2.5e10
    model = fit(conv_grid(law), forms=("work",))
    for case in [(2, 24, 40, 3, 20), (8, 64, 64, 5, 64)]:
        pred = model.predict_sample(conv_sample(*case, 1, 1))
        assert pred == pytest.approx(law(*case), rel=1e-6)


def test_seed_raw_polynomial_recovers_a_raw_polynomial():
    def law(n, cin, cout, k, s):  # a polynomial in the raw variables (degree 2)
        t = 1e-4 + 1e-7 * cin * cout + 3e-6 * k * k + 2e-7 * s * s * n
        return t, 2 * t
    model = fit(conv_grid(law), forms=("raw2",))
    pred = model.predict_sample(conv_sample(4, 24, 40, 3, 20, 1, 1))
    assert pred == pytest.approx(law(4, 24, 40, 3, 20), rel=1e-3)


def test_model_round_trips_through_json(tmp_path):
    model = fit(conv_grid(quadratic_law))
    path = model.save(tmp_path / "model.json")
    again = CostModel.load(path)
    assert again.to_dict() == json.loads(path.read_text())
    for case in [(2, 12, 24, 3, 12), (1, 200, 300, 7, 300)]:
        s = conv_sample(*case, 1, 1)
        assert again.predict_sample(s) == model.predict_sample(s)
    assert again.summary() == model.summary()


def test_bad_model_file_is_a_format_error(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(FormatError, match="cost model"):
        CostModel.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{not json")
    with pytest.raises(FormatError):
        CostModel.load(tmp_path / "y.json")


def test_uncovered_ops_and_dtypes_predict_none():
    model = fit(conv_grid(power_law))
    assert model.predict("linear", {"in_features": 4, "out_features": 4}, [(2, 4)], (2, 4)) \
        is None
    s = conv_sample(2, 16, 16, 3, 16, 1, 1)
    assert model.predict(s.op, s.config, s.in_shapes, s.out_shape, dtype="float16") is None
    assert model.covers("conv2d") and not model.covers("conv2d", {"groups": 4})


def test_families():
    assert family_of("conv2d") == "conv2d"
    assert family_of("conv2d", {"groups": 32}) == "conv2d_grouped"
    assert family_of("bmm") == "matmul" and family_of("ReLU") == "relu"


def test_small_family_gets_a_single_rate():
    samples = [Sample("relu", {}, ((n,),), (n,), 1e-9 * 8 * n, 2e-9 * 8 * n)
               for n in (1000, 4000)]
    model = fit(samples)
    assert model.cv["relu"]["fwd"]["chosen"] == "rate"
    fwd, bwd = model.predict("relu", {}, [(3000,)], (3000,))
    assert fwd == pytest.approx(1e-9 * 8 * 3000) and bwd == pytest.approx(2e-9 * 8 * 3000)


def test_unknown_form_and_empty_input_are_usage_errors():
    with pytest.raises(UsageError, match="form"):
        fit(conv_grid(power_law), forms=("spline",))
    with pytest.raises(UsageError):
        fit([])


def test_samples_from_a_profiled_graph():
    from outcore.graph.capture import capture
    from outcore.zoo import resolve_model
    spec = resolve_model("outcore:mlp", batch_size=4)
    g = capture(spec.build(), spec.example_inputs)
    with pytest.raises(UsageError, match="profile"):
        samples_from_graph(g)
    fake = g.replace(fwd_s=np.full(g.num_nodes, 1e-4), bwd_s=np.full(g.num_nodes, 2e-4),
                     meta={**g.meta, "costs": "profiled"})
    samples = samples_from_graph(fake)
    ops = [s.op for s in samples]
    assert ops.count("linear") == 5 and ops.count("tanh") == 4
    assert all(s.fwd_s == 1e-4 and s.bwd_s == 2e-4 for s in samples)
    lin = next(s for s in samples if s.op == "linear")
    assert lin.config["in_features"] == 16 and lin.in_shapes == ((4, 16),)
    assert Sample.from_dict(json.loads(json.dumps(lin.to_dict()))) == lin
    model = fit(samples)
    assert model.cv["linear"]["fwd"]["chosen"] == "work"  # 5 samples: too few to choose a form
    assert model.predict_sample(lin) == pytest.approx((1e-4, 2e-4))  # the constant c0


def test_calibration_grids_are_distinct_and_in_range():
    from outcore.cost.calibrate import conv2d_grid, linear_grid, op_grid
    convs = conv2d_grid(60, seed=3)
    assert len(convs) == 60 and len({str(c) for c in convs}) == 60
    assert all(2e4 <= c.work <= 1.2e9 for c in convs)
    assert any(c.config["groups"] > 1 for c in convs)
    assert conv2d_grid(60, seed=3) == convs  # seeded
    lins = linear_grid(30)
    assert len(lins) == 30 and all(1e4 <= c.work <= 1e9 for c in lins)
    ops = op_grid(4)
    assert {c.op for c in ops} == {"maxpool2d", "avgpool2d", "batchnorm2d", "relu", "add"}


def test_measure_layers_on_tiny_layers():
    import torch

    from outcore.cost.calibrate import LayerConfig, measure_layers
    layers = [LayerConfig("conv2d", {"in_channels": 3, "out_channels": 4, "kernel_size": 3,
                                     "padding": 1}, ((1, 3, 8, 8),)),
              LayerConfig("linear", {"in_features": 8, "out_features": 4}, ((2, 8),)),
              LayerConfig("add", {}, ((2, 8), (2, 8)))]
    torch.set_num_threads(1)
    samples = measure_layers(layers, warmup=1, repeat=2)
    assert [s.op for s in samples] == ["conv2d", "linear", "add"]
    assert samples[0].out_shape == (1, 4, 8, 8) and samples[0].config["kernel_size"] == [3, 3]
    assert all(s.fwd_s > 0 and s.bwd_s > 0 for s in samples)
    assert samples[1].param_bytes == (8 * 4 + 4) * 4
    assert variables(samples[0].op, samples[0].config, samples[0].in_shapes,
                     samples[0].out_shape) is not None


def test_workfit_never_predicts_non_positive_time():
    f = WorkFit((0.0, 0.0, 0.0))
    assert (f.predict(np.ones((2, 1)), np.zeros(2), np.zeros(2)) > 0).all()
