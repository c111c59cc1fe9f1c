"""A graph captured on the CPU runs on any device (issue 48.1): no call of it is pinned to the
device of capture, and its constants move with the module.

Checked without a GPU: the captured graph runs under FakeTensorMode with every parameter,
buffer and input a fake CUDA tensor (fake tensors need no device; a CPU tensor made inside the
graph meets them and fails as on a real GPU: "Expected all tensors to be on the same device").
Before ``outcore.graph.capture.device``, every Hugging Face model below failed so (GPT-2's
position ids, Llama's rotary frequencies, masks made on the CPU)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils.stateless import _reparametrize_module

from outcore.core.values import _fake_on
from outcore.graph.capture import trace_model
from outcore.graph.capture.device import ANCHOR, OnModuleDevice
from outcore.zoo import build_model

MODELS = [
    "hf:gpt2:n_layer=2,n_embd=64,n_head=2,vocab_size=256,seq=16",
    "hf:llama:hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
    "num_key_value_heads=2,vocab_size=256,seq=16",
    "hf:bert:hidden_size=64,num_hidden_layers=2,num_attention_heads=2,intermediate_size=128,"
    "vocab_size=256,seq=16",
    "hf:t5:d_model=64,num_layers=2,num_heads=2,d_ff=128,vocab_size=256,seq=16",
    "outcore:transformer",
    "torchvision:resnet18",
]


def _outputs_on(gm, inputs, device: torch.device) -> list[torch.device]:
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        state = {k: _fake_on(t, device) for k, t in [*gm.named_parameters(remove_duplicate=False),
                                                    *gm.named_buffers(remove_duplicate=False)]}
        xs = [mode.from_tensor(x).to(device) for x in inputs]
        with _reparametrize_module(gm, state, tie_weights=True):
            out = gm(*xs)
    leaves = out if isinstance(out, (tuple, list)) else [out]
    return [t.device for t in leaves if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("name", MODELS, ids=[m.split(":")[1] for m in MODELS])
def test_a_cpu_capture_runs_on_another_device(name):
    spec, model = build_model(name, batch_size=2, seed=0)
    traced, _ = trace_model(model, spec.example_inputs)
    devices = _outputs_on(traced.gm, spec.example_inputs, torch.device("cuda"))
    assert devices and all(d.type == "cuda" for d in devices)


def test_the_rewritten_calls_give_the_captured_result_where_they_were_captured():
    """On the device of capture the graph computes what the model does; the calls that took a
    fixed device now read the module's (GPT-2: its position ids)."""
    name = MODELS[0]
    spec, model = build_model(name, batch_size=2, seed=0)
    traced, _ = trace_model(model, spec.example_inputs)
    gm = traced.gm
    rewritten = [n for n in gm.graph.nodes if isinstance(n.target, OnModuleDevice)]
    assert rewritten and all(str(n.target).startswith("aten.") for n in rewritten)
    assert getattr(gm, ANCHOR).device.type == "cpu"
    model.eval()
    gm.eval()
    with torch.no_grad():
        want = model(*spec.example_inputs).logits
        got = gm(*spec.example_inputs)
    got = got[0] if isinstance(got, (tuple, list)) else got
    torch.testing.assert_close(got, want)
    gm.to("meta")  # the anchor moves with the module; so does every device the calls use
    assert getattr(gm, ANCHOR).device.type == "meta"
