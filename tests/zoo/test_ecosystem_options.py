"""Options of ecosystem names: ``task=`` as set by ``--task``, and ``dtype=float64``."""

from __future__ import annotations

import pytest
import torch

from outcore.errors import UsageError
from outcore.zoo import build_model
from outcore.zoo.ecosystem import with_task


def test_with_task_sets_the_option_of_ecosystem_names_only():
    assert with_task("timm:resnet18", "regression") == "timm:resnet18:task=regression"
    assert with_task("hf:bert:hidden_size=32,task=masked_lm", "classification") == \
        "hf:bert:hidden_size=32,task=classification"
    assert with_task("outcore:mlp", "regression") == "outcore:mlp"
    with pytest.raises(UsageError, match="unknown task"):
        with_task("timm:resnet18", "segmentation")


def test_timm_float64_and_regression_head():
    pytest.importorskip("timm")
    spec, net = build_model("timm:resnet18:image_size=32,dtype=float64,task=regression",
                            batch_size=2)
    assert spec.example_inputs[0].dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in net.parameters())
    assert net(*spec.example_inputs).shape == (2, 1) and spec.task == "regression"
    with pytest.raises(UsageError, match="dtype=float16 is not supported"):
        build_model("timm:resnet18:dtype=float16", batch_size=2)
