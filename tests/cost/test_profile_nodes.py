"""Per-node profiling of ops autograd refuses when their float inputs require grad (a mixture of
experts' routing: ``cumsum(mask, dtype=int32)``, as in Mixtral): timed forward only."""

from __future__ import annotations

import torch
from torch import nn

from outcore.cost.profile import profile
from outcore.graph.capture import capture


class Routed(nn.Module):
    """Counts tokens per expert from a float mask (outside autograd in the model), as Mixtral's
    router does, beside a differentiable path."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.out = nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            mask = (self.gate(x) > 0).float()
        counts = torch.cumsum(mask, 0, dtype=torch.int32)
        return self.out(x) * (counts[-1:] + 1).float()


def test_an_op_autograd_refuses_on_grad_inputs_is_timed_forward_only():
    net, x = Routed(), torch.randn(6, 8)
    net(x).sum().backward()  # plain PyTorch trains it
    g = profile(capture(net, x, path="export"), net, x, device="cpu", warmup=0, repeat=1)
    cumsum = [i for i in range(g.num_nodes) if g.op_of(i) == "cumsum"]
    assert cumsum and all(g.fwd_s[i] > 0 and g.bwd_s[i] == 0 for i in cumsum)
    linears = [i for i in range(g.num_nodes) if g.op_of(i) == "linear"]
    assert linears and all(g.bwd_s[i] > 0 for i in linears if g.module_of(i) == "out")


class Scaled(nn.Module):
    """Scales its input before the first layer: nothing before ``lin`` needs a gradient in
    training (the data is not trained), so neither the scaling's backward nor the first
    layer's gradient with respect to its input is ever computed."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.out = nn.Linear(64, 64), nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.lin(x * 2.0))
        return self.out(h) + h.detach().sum(1, keepdim=True) * 0.5  # a detached side path


def test_nodes_are_timed_without_the_gradients_training_does_not_compute():
    net, x = Scaled(), torch.randn(32, 64)
    g = profile(capture(net, x), net, x, device="cpu", warmup=1, repeat=3)
    by_name = {g.name_of(i): i for i in range(g.num_nodes)}
    scaled = [i for n, i in by_name.items() if n.startswith("mul")]  # on the data, detached
    assert len(scaled) == 2
    assert all(g.fwd_s[i] > 0 and g.bwd_s[i] == 0 for i in scaled)
    # the layers after the data still have their backward (weights, and the input of `out`)
    assert g.bwd_s[by_name["lin"]] > 0 and g.bwd_s[by_name["out"]] > 0
