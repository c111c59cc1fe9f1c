"""Models built without their weights (outcore.zoo.weightless): the graph is the one the real
model gives, the parameters take no memory, and a model too big for the process plans."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from outcore.graph.capture import capture
from outcore.zoo import build_model
from outcore.zoo.weightless import fake_inputs

MODELS = [
    "outcore:transformer", "outcore:lstm_lm", "outcore:amoebanet", "torchvision:resnet18",
    # timm reads its drop-path rates back at build time (torch.linspace(...).item())
    "timm:vit_tiny_patch16_224:image_size=64,drop_path_rate=0.1",
    "hf:llama", "hf:gpt2", "hf:t5",
]


def _layers(g):
    return [(g.name_of(i), g.op_of(i), int(g.param_bytes[i]), int(g.out_bytes[i]),
             int(g.saved_bytes[i])) for i in range(g.num_nodes)]


@pytest.mark.parametrize("name", MODELS)
def test_the_weightless_graph_is_the_real_models(name):
    spec, real = build_model(name)
    want = capture(real, spec.example_inputs, name=name)
    spec, net = build_model(name, weights=False)
    assert all(isinstance(p, FakeTensor) for p in net.parameters())
    got = capture(net, fake_inputs(net, spec.example_inputs), name=name)
    assert _layers(got) == _layers(want)
    assert (got.src.tolist(), got.dst.tolist()) == (want.src.tolist(), want.dst.tolist())
    assert got.meta["capture"] == want.meta["capture"]


def test_shared_parameters_stay_shared():
    _, real = build_model("hf:gpt2")
    _, net = build_model("hf:gpt2", weights=False)
    assert real.lm_head.weight is real.transformer.wte.weight
    assert net.lm_head.weight is net.transformer.wte.weight
    assert sum(p.numel() for p in net.parameters()) == sum(p.numel() for p in real.parameters())


READS_BACK = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.scale = float(self.fc.weight.abs().max())  # reads a parameter's value

    def forward(self, x):
        return self.fc(x) * self.scale

def make():
    return Net(), torch.randn(2, 8)
"""


def test_a_model_that_reads_its_parameters_at_build_is_built_whole(tmp_path):
    (tmp_path / "reads.py").write_text(READS_BACK)
    name = f"{tmp_path / 'reads.py'}:make"
    spec, net = build_model(name, weights=False)
    assert not any(isinstance(p, FakeTensor) for p in net.parameters())
    _, real = build_model(name)
    torch.testing.assert_close(net.fc.weight, real.fc.weight)  # the same seed, the same init


MLP = """
import torch
from torch import nn

def make():  # 24 layers of WIDTH x WIDTH: 1.5 GiB of weights at 4096
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(24)]), torch.randn(4, WIDTH)
"""

PLAN = """
import json, resource, sys
import outcore
g = outcore.model_graph(sys.argv[1], costs="estimate:a100")
p = outcore.plan(g, 2, "4GiB", device="a100")
print(json.dumps({"params": float(g.param_bytes.sum()), "devices": p.devices_used,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def test_a_model_larger_than_the_process_needs_is_planned_without_its_weights(tmp_path):
    """The graph and an estimated plan of a 1.5 GiB model take the process no more than the
    same of a 400 KiB one, but for one layer's transient (64 MiB): torch and outcore's own
    imports are the rest."""
    out = {}
    for width in (64, 4096):
        (tmp_path / f"mlp{width}.py").write_text(MLP.replace("WIDTH", str(width)))
        r = subprocess.run([sys.executable, "-c", PLAN, f"{tmp_path / f'mlp{width}.py'}:make"],
                           capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-2000:]
        out[width] = json.loads(r.stdout.strip().splitlines()[-1])
    assert out[4096]["params"] == 24 * (4096 * 4096 + 4096) * 4
    assert out[4096]["rss"] - out[64]["rss"] < 160 * 2**20, out


CACHED = """
import torch
from torch import nn

MODEL = []

def make():  # keeps the first model it built
    if not MODEL:
        MODEL.append(nn.Linear(8, 4))
    return MODEL[0], torch.randn(2, 8)
"""


def test_a_function_that_keeps_its_first_model_is_named(tmp_path):
    """outcore reads the example from a build without weights; a function that hands out the
    model it built then would train meta tensors: refused with the reason."""
    from outcore.errors import ModelError

    (tmp_path / "cached.py").write_text(CACHED)
    with pytest.raises(ModelError, match="return a new model on each call"):
        build_model(f"{tmp_path / 'cached.py'}:make")
