"""Capture: torch.fx graphs of torchvision and zoo models, module paths, bytes, fallbacks."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn

import outcore
from outcore.errors import CaptureError, ModelError
from outcore.graph import collapse, from_dict, to_dict
from outcore.graph.algorithms import topological_order
from outcore.graph.capture import capture
from outcore.zoo import resolve_model, zoo_names


def _capture(spec: str, batch: int = 2, **kw):
    s = resolve_model(spec, batch_size=batch, **kw)
    torch.manual_seed(0)
    m = s.build()
    return capture(m, s.example_inputs, name=spec), m


def test_resnet50_layers_params_and_blocks():
    g, m = _capture("torchvision:resnet50", input_shape=(2, 3, 224, 224))
    assert g.num_nodes == 177
    assert g.total_param_bytes == sum(p.numel() * 4 for p in m.parameters())
    i = g.names.index("layer1_0_conv1")
    assert g.modules[i] == "layer1.0.conv1" and g.ops[i] == "conv2d"
    assert g.attr(i, "shape") == [2, 64, 56, 56]
    assert g.out_bytes[i] == 2 * 64 * 56 * 56 * 4
    # every residual add joins two paths
    adds = [k for k in range(g.num_nodes) if g.ops[k] == "add"]
    assert len(adds) == 16 and all(g.in_degree[k] == 2 for k in adds)
    d1 = collapse(g, 1)
    assert list(d1.names) == ["x", "conv1", "bn1", "relu", "maxpool", "layer1", "layer2",
                              "layer3", "layer4", "avgpool", "flatten", "fc", "output"]
    assert d1.total_param_bytes == g.total_param_bytes
    assert d1.fwd_s.sum() == pytest.approx(g.fwd_s.sum())
    d2 = collapse(g, 2)
    assert "layer3.5" in d2.names and d2.num_nodes == 25
    assert d1.saved_bytes.sum() == g.saved_bytes.sum()


def test_saved_bytes_are_what_autograd_keeps():
    """The sum of per-node saved bytes equals what autograd saves for the whole model."""
    from torch.multiprocessing.reductions import StorageWeakRef
    g, m = _capture("outcore:diamond", batch=4)
    seen = {}
    params = {StorageWeakRef(p.untyped_storage()) for p in m.parameters()}

    def pack(t):
        k = StorageWeakRef(t.untyped_storage())
        if k not in params:
            seen[k] = t.untyped_storage().nbytes()
        return t

    x = resolve_model("outcore:diamond", batch_size=4).example_inputs
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(*x)
    assert g.saved_bytes.sum() == sum(seen.values()) > 0


@pytest.mark.parametrize("name", zoo_names())
def test_every_zoo_model_captures_and_round_trips(name):
    g, m = _capture(f"outcore:{name}")
    assert g.num_nodes > 3
    assert g.total_param_bytes == sum(p.numel() * p.element_size() for p in m.parameters())
    order = topological_order(g)
    assert order.size == g.num_nodes
    h = from_dict(to_dict(g))
    np.testing.assert_array_equal(h.src, g.src)
    assert h.names == g.names and h.modules == g.modules


def test_transformer_heads_are_parallel_branches():
    g, _ = _capture("outcore:transformer:layers=1,heads=4")
    heads = collapse(g, 4)
    idx = [heads.names.index(f"blocks.0.heads.{k}") for k in range(4)]
    # no head feeds another: they are siblings between the layer norm and the concatenation
    for a in idx:
        for b in idx:
            assert not ((heads.src == a) & (heads.dst == b)).any()
    sources = {int(heads.src[(heads.dst == i)][0]) for i in idx}
    assert len(sources) == 1 and heads.names[sources.pop()] == "blocks_0_ln1"


def test_two_inputs_two_outputs_and_skips():
    g, _ = _capture("outcore:two_tower")
    assert [g.names[i] for i in range(g.num_nodes) if g.ops[i] == "input"] == ["a", "b"]
    out = g.names.index("output")
    assert g.in_degree[out] == 2
    d, _ = _capture("outcore:diamond")
    cat = d.names.index("cat")
    assert d.in_degree[cat] == 2  # the long skip from the first layer joins here


def test_lstm_grid_has_time_and_layer_edges():
    g, _ = _capture("outcore:lstm_lm:unroll=True,seq=4,layers=3")
    cells = [i for i in range(g.num_nodes) if g.ops[i] == "lstmcell"]
    assert len(cells) == 12


class Wobbly(nn.Module):
    """Data-dependent control flow: fx cannot trace this module."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.a(x)
        return -self.a(x)


class HasWobbly(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.wobbly = Wobbly()
        self.post = nn.Linear(4, 2)

    def forward(self, x):
        return self.post(self.wobbly(self.pre(x)))


def test_untraceable_module_becomes_a_named_leaf(caplog):
    with caplog.at_level(logging.WARNING):
        g = capture(HasWobbly(), torch.randn(3, 4))
    assert "wobbly" in caplog.text
    assert g.meta["forced_leaves"] == ["wobbly"]
    i = g.names.index("wobbly")
    assert g.ops[i] == "wobbly" and g.param_bytes[i] == (16 + 4) * 4


def test_untraceable_root_is_a_clear_error():
    with pytest.raises(CaptureError, match="cannot trace Wobbly"):
        capture(Wobbly(), torch.randn(3, 4))


def test_model_failing_on_the_input_names_the_shape():
    with pytest.raises(ModelError, match="shape 3x5.*--input-shape"):
        capture(nn.Linear(4, 2), torch.randn(3, 5))


class BranchesThenBreaks(nn.Module):
    """fx cannot trace it (a branch on a value at the root) and its own addition fails on
    an input of 3 tokens (a position table of 5, as a ViT's fixed for one image size)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.pos = nn.Parameter(torch.zeros(1, 5, 4))

    def forward(self, x):
        y = self.lin(x) + self.pos
        return y * 2 if y.sum() > 0 else y


def test_a_model_no_tracer_captures_is_named_when_it_fails_by_itself(capfd):
    with pytest.raises(ModelError, match="shape 2x3x4: RuntimeError.*--input-shape"):
        capture(BranchesThenBreaks(), torch.randn(2, 3, 4))
    assert "Traceback" not in capfd.readouterr().err  # fake mode's log is held back
    # the same model on an input it takes is refused for its branch, as before
    with pytest.raises(CaptureError, match="cannot trace BranchesThenBreaks"):
        capture(BranchesThenBreaks(), torch.randn(2, 5, 4))


def test_shared_module_params_counted_once():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(torch.tanh(self.lin(x)))

    g = capture(Tied(), torch.randn(2, 4))
    calls = [i for i in range(g.num_nodes) if g.ops[i] == "linear"]
    assert [int(g.param_bytes[i]) for i in calls] == [80, 0]
    assert g.attr(calls[1], "shared_params") == ["lin.weight", "lin.bias"]
    assert collapse(g, 1).num_nodes == g.num_nodes  # the two calls stay two blocks


def test_saved_inputs_are_recorded_and_a_sliced_input_counts_at_its_own_size():
    net = torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.Linear(512, 32))
    batch = torch.randn(512, 32)
    g = capture(net, batch[:128])  # a view of a 4x larger storage
    saved = {g.name_of(v): int(g.saved_bytes[v]) for v in range(g.num_nodes)}
    assert saved["_0"] == 128 * 32 * 4  # its input, not the whole batch's storage
    assert saved["_1"] == 128 * 512 * 4
    assert g.attr(1, "saved_inputs") == ["input_1"] and g.attr(2, "saved_inputs") == ["_0"]
    savers, producers = g.saved_input_pairs
    assert savers.tolist() == [1, 2] and producers.tolist() == [0, 1]
    # collapsed to one block: it saves the model input; _1 saving _0 is inside the block
    whole = collapse(g, 0)
    assert [a.get("saved_inputs") for a in whole.attrs] == [None, ["input_1"], None]


@pytest.mark.parametrize("fake", [True, False])
def test_capture_leaves_the_models_buffers_as_they_were(fake):
    """Capture runs the model once in training mode: batch norm's counter counts even under
    fake tensors, and a real run moves its running statistics; the model comes back as it was
    (its docstring's promise; a plain PyTorch copy of it must train the same)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    before = {k: v.clone() for k, v in net.state_dict().items()}
    capture(net, torch.randn(2, 3, 8, 8), fake=fake)
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_a_view_of_a_larger_tensor_records_the_storage_it_keeps():
    """A chunk of a layer's output views the whole output: what keeps the chunk (a
    checkpointed piece keeping its input) keeps all of it. The capture records the share."""

    class Split(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 16)

        def forward(self, x):
            a, b = self.fc(x).chunk(2, dim=1)
            return torch.cat([a, torch.relu(b)], dim=1)

    g = capture(Split(), torch.randn(4, 8))
    share = {g.name_of(v): g.attr(v, "storage_share") for v in range(g.num_nodes)}
    halves = [name for name, s in share.items() if s == 2.0]
    assert len(halves) == 2 and all(name.startswith("getitem") for name in halves)
    assert share["fc"] is None and share["relu"] is None
    from outcore.schedule.costs import _storage_share
    assert sorted(_storage_share(g).tolist()).count(2.0) == 2


def test_a_tensor_saved_again_names_its_producer_at_each_later_saver():
    """A ReLU saves its output, which the two convolutions after it save too: their saved bytes
    do not count it again, and each records the producer (``resaved_inputs``), so the memory
    model keeps it where the ReLU's piece recomputes what it saved."""

    class Fork(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)

        def forward(self, x):
            h = torch.relu(self.stem(x))
            return self.a(h) + self.b(h)

    g = capture(Fork(), torch.randn(2, 3, 8, 8))
    idx = {g.name_of(v): v for v in range(g.num_nodes)}
    assert g.saved_bytes[idx["relu"]] == 2 * 4 * 8 * 8 * 4  # its output, counted once
    assert g.saved_bytes[idx["a"]] == g.saved_bytes[idx["b"]] == 0
    assert g.attr(idx["a"], "resaved_inputs") == ["relu"] == g.attr(idx["b"], "resaved_inputs")
    savers, producers = g.resaved_input_pairs
    assert sorted(savers.tolist()) == sorted([idx["a"], idx["b"]])
    assert producers.tolist() == [idx["relu"]] * 2


def test_views_name_the_storage_they_share_and_buffers_need_no_gradient():
    """Chunks and transposes of a layer's output share its storage (``storage_root``: what
    holds any of them holds all of it, once); a slice of a mask buffer requires no gradient,
    so no piece holds it as an autograd leaf (``requires_gradient``)."""
    from outcore.schedule.backward import requires_gradient

    class Views(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 16)
            self.register_buffer("mask", torch.tril(torch.ones(16, 16)))

        def forward(self, x):
            a, b = self.fc(x).chunk(2, dim=1)
            m = self.mask[: x.shape[0], :8]
            return a.t().sum() + (b * m).sum()

    g = capture(Views(), torch.randn(4, 8))
    of_op = {g.op_of(v): v for v in range(g.num_nodes)}  # each op here is called once
    root = g.storage_root
    fc = of_op["linear"]
    chunks = [v for v in range(g.num_nodes) if g.op_of(v) == "getitem"]
    assert len(chunks) == 2 and all(root[v] == fc for v in chunks)
    assert root[of_op["t"]] == fc and root[fc] == fc
    needs = requires_gradient(g)
    mask_slices = [v for v in range(g.num_nodes) if g.op_of(v) == "slice"]
    assert mask_slices and not needs[mask_slices].any()
    assert needs[fc] and needs[of_op["t"]] and needs[of_op["mul"]]


def test_a_layers_buffers_are_held_with_its_parameters():
    """Batch norm's running statistics are held all run long (the measured baseline counts
    them): the capture records them per layer and the plan's static memory adds them."""
    from outcore.schedule.costs import buffer_bytes

    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    g = capture(net, torch.randn(2, 3, 8, 8))
    buffers = sum(b.numel() * b.element_size() for b in net.buffers())
    assert buffers == 8 * 4 * 2 + 8 and buffer_bytes(g).sum() == buffers
    plan = outcore.plan(g, 1, optimizer="sgd-momentum")
    static = outcore.lower(plan, g).costs.static_bytes[0]
    assert static == 3 * int(g.param_bytes.sum()) + buffers


@pytest.mark.parametrize("rnn", [nn.LSTM, nn.GRU])
def test_a_recurrent_layer_saves_in_fake_mode_what_it_saves_for_real(rnn):
    """oneDNN's recurrent kernels save a workspace for their backward that their fake
    kernels do not make (an LSTM layer: 0.2 of 2.4 MiB in timm's sequencer2d_s): the
    recording counts the real one, also when the model is built without its weights."""
    from outcore.zoo.weightless import weightless

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(8, 32)
            self.rnn = rnn(32, 32, batch_first=True, bidirectional=True)
            self.out = nn.Linear(64, 4)

        def forward(self, x):
            return self.out(self.rnn(self.inp(x))[0])

    torch.manual_seed(0)
    x = torch.randn(4, 12, 8)
    real = capture(Net(), x, fake=False)
    fake = capture(Net(), x)
    i = real.names.index("rnn")
    assert real.saved_bytes[i] > 4 * 12 * 64 * 4  # more than its output: the workspace
    assert fake.saved_bytes[i] == real.saved_bytes[i]
    assert capture(weightless(Net), x).saved_bytes[i] == real.saved_bytes[i]
    if rnn is nn.LSTM:  # and the scratch its backward takes beyond the gradients
        assert fake.attr(i, "bwd_scratch_share") > 0


def test_a_leaf_that_fails_on_zeros_is_captured_unmeasured():
    """A leaf is measured on zeros; one that cannot take them (a Cholesky factor of a zero
    matrix) keeps what the recording saw, and the capture goes on."""

    class Factor(nn.Module):
        def forward(self, h):
            if h.sum() > -1e30:  # a branch on a value: torch.fx makes this a leaf
                h = h * 1.0
            return torch.linalg.cholesky(h.T @ h + 0.0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(4, 4)
            self.factor = Factor()

        def forward(self, x):
            return self.factor(self.inp(x)).sum(0, keepdim=True)

    torch.manual_seed(0)
    g = capture(Net(), torch.randn(16, 4))
    i = g.names.index("factor")
    assert g.meta["forced_leaves"] == ["factor"] and g.attr(i, "bwd_scratch_share") is None


def test_a_write_to_a_parameters_data_in_the_forward_exports_on_a_model_without_weights(
        caplog):
    """Gemma 3n clamps ``prediction_coefs.weight.data`` in its forward while training:
    torch.export makes the ``.data`` a constant, which on a model built without its weights
    (every rank's, before it builds its part) is a fake tensor that export refuses with real
    inputs. It is exported in the model's own fake mode; the constant, only written, becomes
    real zeros, and a warning says the write does not reach the parameter."""
    from outcore.graph.capture.export import export_trace
    from outcore.zoo.weightless import weightless

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(4, 8)
            self.coefs = nn.Linear(2, 2, bias=False)

        def forward(self, x):
            if self.training:
                self.coefs.weight.data.clamp_(-1.0, 1.0)
            return self.inp(x).sum(-1, keepdim=True) * self.coefs.weight.sum()

    model = weightless(Net)
    with caplog.at_level(logging.WARNING):
        gm, _ = export_trace(model, (torch.randn(3, 4),))
    constants = [n for n in gm.graph.nodes if n.op == "get_attr" and "lifted" in str(n.target)]
    assert len(constants) == 1 and [str(u.target) for u in constants[0].users] == \
        ["aten.clamp_.default"]
    value = getattr(gm, str(constants[0].target))
    assert type(value) is torch.Tensor and value.shape == (2, 2) and not value.any()
    assert "does not reach the parameter" in caplog.text


def test_a_graph_that_carries_no_gradient_to_the_parameters_is_refused():
    """torch.export traces an ``autograd.Function``'s forward, not the function: one that
    computes under ``no_grad`` (Reformer's reversible layers) leaves an output no gradient
    reaches, and training it would update nothing. Capture refuses it; torch.fx keeps the
    function as one call, whose output does require a gradient."""

    class Rev(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            with torch.no_grad():
                y = x @ w
            ctx.save_for_backward(x, w)
            return y

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g @ w.T, x.T @ g

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return Rev.apply(x, self.w)

    x = torch.randn(3, 4)
    with pytest.raises(CaptureError, match="carries no gradient from the parameters"):
        capture(Net(), (x,), path="export")
    assert capture(Net(), (x,), path="fx").num_nodes >= 3
    frozen = Net().requires_grad_(False)  # nothing to train: nothing refused
    assert capture(frozen, (x,), path="export").num_nodes >= 2
