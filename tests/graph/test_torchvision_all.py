"""Every torchvision classification builder captures with torch.fx, with no fallback leaves.

Models are built on the meta device (no memory, no init cost) except RegNets, whose
initialisation cannot run on meta tensors; they are built for real. ~3 minutes: marked slow.
"""

from __future__ import annotations

import pytest
import torch
import torchvision

from outcore.graph.capture import capture

NAMES = torchvision.models.list_models(module=torchvision.models)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_torchvision_builder_captures(name):
    kw = {"aux_logits": False, "init_weights": False} if name in ("inception_v3",
                                                                   "googlenet") else {}
    builder = torchvision.models.get_model_builder(name)
    device = "cpu" if name.startswith("regnet") else "meta"
    with torch.device(device):
        model = builder(weights=None, **kw)
    size = 299 if name == "inception_v3" else 224
    g = capture(model, torch.randn(1, 3, size, size, device=device), name=name)
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
