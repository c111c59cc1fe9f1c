"""Capture paths (torch.fx and torch.export, chosen per model) and the models users bring."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from outcore.cost.profile import profile
from outcore.errors import ModelError
from outcore.graph.capture import capture, retrace
from outcore.graph.coarsen import collapse


class Optional(nn.Module):
    """forward with an optional argument (timm ViT's ``attn_mask=None``)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, mask=None, scale: bool = False):
        y = self.lin(x)
        if mask is not None:
            y = y + mask
        return y * 2 if scale else y


def test_optional_forward_arguments_keep_their_defaults():
    g = capture(Optional(), torch.randn(2, 4))
    assert [g.name_of(i) for i in range(g.num_nodes) if g.op_of(i) == "input"] == ["x"]
    assert g.meta["capture"]["path"] == "fx"


class Constant(nn.Module):
    """Creates a tensor constant in forward (as timm's Swin does): fx stores it on the model."""

    def forward(self, x):
        return x + torch.tensor([1.0, 2.0])


def test_tracing_twice_gives_the_same_node_names():
    m = Constant()
    x = torch.randn(3, 2)
    g = capture(m, x)
    again = retrace(m, (x,), g.meta).gm
    assert [n.name for n in again.graph.nodes] == [g.name_of(i) for i in range(g.num_nodes)]
    assert not [k for k in vars(m) if k.startswith("_tensor_constant")]


class BNAct(nn.Module):
    """Batch norm through F.batch_norm on its own buffers (timm's BatchNormAct2d): the fx graph
    reads the running statistics with get_attr nodes."""

    def __init__(self, c=4):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))
        self.register_buffer("running_mean", torch.zeros(c))
        self.register_buffer("running_var", torch.ones(c))

    def forward(self, x):
        y = self.conv(x)
        y = F.batch_norm(y, self.running_mean, self.running_var, self.weight, self.bias,
                         training=True)
        return F.relu(y).mean((2, 3))


def test_profiles_batch_norm_buffers_in_training_mode():
    m = BNAct()
    x = torch.randn(4, 3, 8, 8)
    g = profile(capture(m, x), m, x, device="cpu", warmup=0, repeat=1)
    bn = [i for i in range(g.num_nodes) if g.op_of(i) == "batch_norm"]
    assert bn and g.bwd_s[bn[0]] > 0


def test_batch_norm_on_a_micro_batch_of_one_says_so():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.BatchNorm1d(4))
    with pytest.raises(ModelError, match="micro-batch of 1"):
        capture(m, torch.randn(1, 3, 8, 8))


def test_export_path_keeps_the_module_hierarchy():
    """A Hugging Face model is exported: its nodes carry module paths, so collapsing by depth
    gives attention / MLP / norm blocks, never one leaf for the whole transformer."""
    pytest.importorskip("transformers")
    from outcore.zoo import resolve_model

    spec = resolve_model("hf:gpt2:hidden_size=32,num_hidden_layers=2", batch_size=2)
    torch.manual_seed(0)
    model = spec.build()
    g = capture(model, spec.example_inputs)
    assert g.meta["capture"] == {"path": "export", "leaves": [], "n_inputs": 1,
                                 "output": "logits", "batch": 2}
    blocks = collapse(g, 4)
    names = {blocks.name_of(i) for i in range(blocks.num_nodes)}
    assert {"transformer.h.0.attn", "transformer.h.0.mlp", "transformer.h.1.ln_2"} <= names
    # the tied embedding / output weight is counted once
    total = sum(p.numel() * 4 for p in model.parameters())
    assert int(g.param_bytes.sum()) == total
    # the runtime re-exports for a micro-batch of 1: the same node names, and the graph runs it
    x1 = spec.example_inputs[0][:1]
    again = retrace(model, (x1,), g.meta).gm
    assert [n.name for n in again.graph.nodes] == [g.name_of(i) for i in range(g.num_nodes)]
    torch.testing.assert_close(again(x1), model(x1).logits)


def test_fx_failure_falls_back_to_export():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            if x.shape[0] > 1:  # fx cannot trace control flow on shapes; export specialises
                return {"logits": self.lin(x), "extra": x}
            return {"logits": x, "extra": x}

    g = capture(Branchy(), torch.randn(2, 4))
    assert g.meta["capture"]["path"] == "export"
    assert g.meta["capture"]["output"] == "logits"
    assert "linear" in [g.op_of(i) for i in range(g.num_nodes)]


@pytest.mark.parametrize("dropout,path", [(0.1, "export"), (0.0, "fx")])
def test_a_torch_nn_leaf_with_dropout_inside_is_exported(dropout, path):
    """torch.fx keeps every ``torch.nn`` module as one leaf, so an ``nn.TransformerEncoderLayer``'s
    dropouts (and its attention's) would draw from one generator, differently on every
    layout: capture exports such a model, whose dropouts become nodes of their own."""
    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=dropout, batch_first=True)

        def forward(self, x):
            return self.layer(x).sum(1)

    g = capture(Encoder(), torch.randn(2, 5, 16))
    assert g.meta["capture"]["path"] == path
    ops = [g.op_of(i) for i in range(g.num_nodes)]
    if path == "export":  # both feed-forward dropouts, the residual ones and the attention's
        assert sum("dropout" in op for op in ops) >= 3, ops
        assert any("scaled_dot_product_attention" in op for op in ops), ops


class OwnLinear(nn.Linear):
    """A Linear subclass that multiplies by the transposed weight itself (Falcon's
    ``FalconLinear``)."""

    def forward(self, x):
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


class OwnMLP(nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.up, self.down = OwnLinear(8, 16, bias=bias), OwnLinear(16, 8, bias=bias)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


@pytest.mark.parametrize("bias", [True, False])
def test_a_linear_subclass_that_multiplies_itself_exports_as_a_linear(bias):
    """Exported, ``x @ W.T (+ b)`` of an nn.Linear subclass is one aten.linear call recorded
    under nn.Linear: the tensor-parallel pairing finds the MLP pair; outputs are unchanged."""
    from outcore.cost.tensor import plan_layout
    from outcore.graph.capture.export import export_trace

    torch.manual_seed(0)
    net, x = OwnMLP(bias), torch.randn(4, 3, 8)
    g = capture(net, x, path="export")
    linears = [i for i in range(g.num_nodes) if g.op_of(i) == "linear"]
    assert [g.module_of(i) for i in linears] == ["up", "down"]
    assert not any(g.op_of(i) in ("matmul", "numpy_T", "t") for i in range(g.num_nodes))
    assert g.meta["module_types"]["up"] == "Linear"
    layout = plan_layout(g, 2)
    assert [(p.columns, p.rows) for p in layout.pairs] == [(("up",), ("down",))]
    gm, _ = export_trace(net, (x,))
    torch.testing.assert_close(gm(x), net(x), rtol=1e-6, atol=1e-6)


class ForeignWeight(nn.Linear):
    """Multiplies by another module's weight: not its own Linear, left alone."""

    def __init__(self, other: nn.Linear):
        super().__init__(4, 4, bias=False)
        self.other = [other]

    def forward(self, x):
        return x @ self.other[0].weight.T


def test_a_linear_subclass_using_another_weight_is_not_rewritten():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4, bias=False)
            self.b = ForeignWeight(self.a)

        def forward(self, x):
            return self.b(x)

    g = capture(Net(), torch.randn(2, 4), path="export")
    assert "linear" not in {g.op_of(i) for i in range(g.num_nodes)}


class PreTrainedModel(nn.Module):
    """Stands for transformers' base class (outcore recognises Hugging Face models by it)."""


class PlainBranch(nn.Module):
    """Branches on a tensor's value (Longformer's ``if is_global_attn:``): torch.export
    cannot guard on it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, mask):
        if (mask > 1).any():
            x = x * 2
        return self.lin(x).sum(-1)


class BranchOnValue(PlainBranch, PreTrainedModel):
    """The same, as a Hugging Face model."""


def test_a_branch_on_a_tensor_value_is_exported_as_the_example_takes_it(caplog, capsys,
                                                                       monkeypatch):
    """export fails on the branch; the draft export takes it as the example does, a warning
    names it, the graph equals the model on such data at any batch, and torch's partial graph
    is not printed."""
    from outcore.graph.capture import export
    from outcore.graph.capture.export import export_trace

    monkeypatch.setattr(export, "_WARNED", set())  # warned once per process
    torch.manual_seed(0)
    net = BranchOnValue()
    x, mask = torch.randn(4, 8), torch.ones(4, 8, dtype=torch.long)
    with caplog.at_level("WARNING", logger="outcore.graph.capture.export"):
        gm, _ = export_trace(net, (x, mask))
    assert "if (mask > 1).any(): -> False" in caplog.text
    assert "def forward" not in capsys.readouterr().err
    for rows in (4, 6):
        xs, ms = torch.randn(rows, 8), torch.ones(rows, 8, dtype=torch.long)
        torch.testing.assert_close(gm(xs, ms), net(xs, ms), rtol=0, atol=0)
    assert not any("assert" in str(n.target) for n in gm.graph.nodes)


def test_a_branch_on_a_value_of_a_model_not_hugging_faces_is_refused(capsys):
    """Outside Hugging Face models a branch on a value is taken to follow the data (``if
    x.sum() > 0``): specialising it would train another program on other batches. The error
    is one line; torch's partial graph is not printed."""
    from outcore.errors import CaptureError
    from outcore.graph.capture.export import export_trace

    with pytest.raises(CaptureError, match="GuardOnDataDependentSymNode"):
        export_trace(PlainBranch(), (torch.randn(4, 8), torch.ones(4, 8, dtype=torch.long)))
    assert "def forward" not in capsys.readouterr().err


def test_an_export_failure_not_on_a_value_is_still_refused():
    from outcore.errors import CaptureError
    from outcore.graph.capture.export import export_trace

    class Holder:
        def __init__(self, t):
            self.t = t

    class Bad(nn.Module):
        def forward(self, x):
            return Holder(x * 2)  # not a pytree: export refuses the output

    with pytest.raises(CaptureError, match="torch.export cannot capture Bad"):
        export_trace(Bad(), (torch.randn(2, 3),))


class Steps(nn.Module):
    """Reads a 4-D tensor step by step (Mamba's scan: ``discrete_A[:, :, i]``), which exports
    as two whole-dimension slices before each select."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):  # x: [b, 4, 6, 8]
        a = torch.exp(self.lin(x))
        s = torch.zeros_like(a[:, :, 0])
        for i in range(a.shape[2]):
            s = a[:, :, i] * s + 1
        return s.sum(-1)


def test_whole_dimension_slices_are_not_kept():
    """The exported graph keeps no slice that spans a whole dimension (each one's backward
    makes a zero tensor of its input's size); values and gradients equal the model's, at the
    captured batch and another."""
    from outcore.graph.capture.export import export_trace

    torch.manual_seed(0)
    net = Steps()
    gm, _ = export_trace(net, (torch.randn(2, 4, 6, 8),))
    slices = [n for n in gm.graph.nodes if n.target is torch.ops.aten.slice.Tensor]
    assert not slices
    assert sum(n.target is torch.ops.aten.select.int for n in gm.graph.nodes) == 7  # and a[:, :, 0]
    for rows in (2, 3):
        x = torch.randn(rows, 4, 6, 8)
        out = gm(x)
        torch.testing.assert_close(out, net(x), rtol=0, atol=0)
        got = torch.autograd.grad(out.sum(), gm.get_submodule("lin").weight)[0]
        want = torch.autograd.grad(net(x).sum(), net.lin.weight)[0]
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_slice_that_cuts_stays():
    from outcore.graph.capture.export import export_trace

    class Cut(nn.Module):
        def forward(self, x):
            return x[:, 1:] * 2 + x[:, :3].sum()

    gm, _ = export_trace(Cut(), (torch.randn(2, 5),))
    assert sum(n.target is torch.ops.aten.slice.Tensor for n in gm.graph.nodes) == 2
    x = torch.randn(4, 5)
    torch.testing.assert_close(gm(x), Cut()(x))


def test_a_branch_on_a_value_is_taken_on_a_model_built_without_its_weights(caplog, monkeypatch):
    """Planning builds the model without its weights and captures it on fake inputs: the draft
    export runs it on stand-in weights and the inputs' own values, and the graph is the one
    the model with weights gives."""
    from outcore.graph.capture import export
    from outcore.graph.capture.export import export_trace
    from outcore.zoo.weightless import fake_inputs, weightless

    monkeypatch.setattr(export, "_WARNED", set())  # warned once per process
    torch.manual_seed(0)
    net = weightless(BranchOnValue)
    x, mask = torch.randn(4, 8), torch.ones(4, 8, dtype=torch.long)
    with caplog.at_level("WARNING", logger="outcore.graph.capture.export"):
        gm, _ = export_trace(net, fake_inputs(net, (x, mask)))
    assert "-> False" in caplog.text
    real, _ = export_trace(BranchOnValue(), (x, mask))
    assert [n.name for n in gm.graph.nodes] == [n.name for n in real.graph.nodes]
    assert all(type(p).__name__ == "FakeTensor" or p.device.type == "meta"
               for p in net.parameters())  # its own parameters are back
