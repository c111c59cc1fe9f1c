"""Every torchvision classification builder captures with torch.fx, with no fallback leaves.

Models are built on the meta device (no memory, no init cost); a RegNet's block widths are
computed on the CPU (its builder reads tensor values, which meta tensors do not have). About a
minute: marked slow.
"""

from __future__ import annotations

import pytest
import torch
import torchvision

from outcore.graph.capture import capture

NAMES = torchvision.models.list_models(module=torchvision.models)


@pytest.fixture
def widths_on_cpu(monkeypatch):
    """RegNet builders compute their block widths with tensors and read them back: on the CPU
    (regnet_y_128gf built for real took 10 s of this sweep's 78, and 2.5 GB)."""
    from torchvision.models import regnet
    made = regnet.BlockParams.from_init_params.__func__

    def on_cpu(cls, *args, **kwargs):
        with torch.device("cpu"):
            return made(cls, *args, **kwargs)
    monkeypatch.setattr(regnet.BlockParams, "from_init_params", classmethod(on_cpu))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_torchvision_builder_captures(name, widths_on_cpu):
    kw = {"aux_logits": False, "init_weights": False} if name in ("inception_v3",
                                                                   "googlenet") else {}
    builder = torchvision.models.get_model_builder(name)
    with torch.device("meta"):
        model = builder(weights=None, **kw)
    size = 299 if name == "inception_v3" else 224
    g = capture(model, torch.randn(1, 3, size, size, device="meta"), name=name)
    assert "forced_leaves" not in g.meta, f"{name} needed fallback leaves"
    assert g.total_param_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert g.num_nodes > 20


def test_representative_builders_capture():
    """A fast subset for every run: one per family."""
    for name in ("resnet18", "vgg11", "mobilenet_v3_small", "vit_b_32", "inception_v3",
                 "densenet121", "swin_t"):
        kw = {"aux_logits": False, "init_weights": False} if name == "inception_v3" else {}
        with torch.device("meta"):
            model = torchvision.models.get_model_builder(name)(weights=None, **kw)
        size = 299 if name == "inception_v3" else 224
        g = capture(model, torch.randn(1, 3, size, size, device="meta"))
        assert "forced_leaves" not in g.meta and g.num_nodes > 20, name
