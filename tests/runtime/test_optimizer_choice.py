"""The workers' optimizers: PyTorch's multi-tensor (foreach) implementation for plain
parameters on every device (PyTorch would loop in Python on CPU), and PyTorch's own choice when
tensor-parallel shards (DTensors) sit beside plain tensors (its multi-tensor kernels refuse the
mixture; the tensor-parallel tests train such plans)."""

from __future__ import annotations

import pytest
import torch

from outcore.config import TrainConfig
from outcore.runtime.worker import make_optimizer


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_plain_parameters_get_the_multi_tensor_optimizer(name):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = make_optimizer(TrainConfig.make(model="outcore:mlp", optimizer=name))(model.parameters())
    assert opt.defaults["foreach"] is True
    assert len(opt.param_groups[0]["params"]) == 4  # a generator of parameters is taken whole
    model(torch.randn(3, 4)).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_an_unknown_optimizer_is_refused():
    from outcore.errors import UsageError
    with pytest.raises(UsageError, match="unknown optimizer"):
        make_optimizer(TrainConfig.make(model="outcore:mlp", optimizer="lamb"))
