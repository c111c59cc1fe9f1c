"""A rank builds only its part of a model (outcore.zoo.weightless.built_in_part): the parameters
it keeps have exactly the values the whole model built with the same seed has, the others take
no memory, and a build that cannot be done so says why."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from outcore.errors import ModelError
from outcore.zoo import build_model
from outcore.zoo.weightless import built_in_part, registered, weightless

MODELS = [
    "outcore:mlp", "outcore:transformer", "outcore:resnet_k:depth=11,width=4",
    "torchvision:resnet18", "timm:vit_tiny_patch16_224:image_size=64,drop_path_rate=0.1",
    "timm:resnet18", "hf:gpt2", "hf:llama", "hf:t5", "hf:pvt",
]


@pytest.mark.parametrize("name", MODELS)
def test_kept_parameters_equal_the_whole_models(name):
    spec, whole = build_model(name, seed=3)
    state = {k: v.detach().clone() for k, v in whole.named_parameters(remove_duplicate=False)}
    buffers = {k: v.clone() for k, v in whole.named_buffers()}
    _, light = build_model(name, seed=3, weights=False)
    order = registered(light)
    assert order is not None
    names = sorted(state)
    for keep in (set(names[::2]), set(names[1::3]), {names[-1]}):
        torch.manual_seed(3)
        part = built_in_part(spec.build, keep, order)
        params = dict(part.named_parameters(remove_duplicate=False))
        for k in names:
            if k in keep:
                assert torch.equal(params[k], state[k]), k
            elif not any(params[k] is params[j] for j in keep):  # tied to a kept one
                assert params[k].device.type == "meta", k
        for k, b in part.named_buffers():
            assert torch.equal(b, buffers[k]), k
        # the random stream ends where the whole build leaves it
        after = torch.get_rng_state()
        torch.manual_seed(3)
        spec.build()
        assert torch.equal(after, torch.get_rng_state())


def test_initialisers_that_skip_meta_tensors_still_draw_for_them():
    # PyTorch's trunc_normal_ (drawn by rejection), orthogonal_ and sparse_ return at once on a
    # meta tensor: a part that skipped their draws gave the next kept parameter other values
    def build():
        net = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16),
                            nn.Linear(16, 16))
        nn.init.trunc_normal_(net[0].weight, std=0.5)
        nn.init.orthogonal_(net[1].weight)
        nn.init.sparse_(net[2].weight, 0.5)
        nn.init.normal_(net[3].weight)  # after them: the stream it draws from moved on
        return net

    torch.manual_seed(1)
    whole = dict(build().named_parameters())
    torch.manual_seed(1)
    order = registered(weightless(build))
    torch.manual_seed(1)
    part = dict(built_in_part(build, {"3.weight"}, order).named_parameters())
    assert part["0.weight"].device.type == "meta"
    assert torch.equal(part["3.weight"], whole["3.weight"])


def test_a_part_allocates_only_what_it_keeps():
    def build():
        return nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)])

    torch.manual_seed(0)
    order = registered(weightless(build))
    torch.manual_seed(0)
    part = built_in_part(build, {"0.weight", "0.bias"}, order)
    real = [p for p in part.parameters() if p.device.type != "meta"]
    assert sum(p.numel() for p in real) == 256 * 256 + 256


def test_a_build_that_registers_other_parameters_is_refused():
    calls = [0]

    def build():
        calls[0] += 1
        return nn.Sequential(*[nn.Linear(4, 4) for _ in range(calls[0])])

    order = registered(weightless(build))
    with pytest.raises(ModelError, match="other parameters"):
        built_in_part(build, {"0.weight"}, order)
