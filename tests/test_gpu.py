"""What only a GPU can check (``gpu``: skipped without CUDA; ``benchmarks/gpu_check.py`` runs
them on a lent GPU).

Receive buffers follow CUDA's autocast rules, which differ from the CPU's (CUDA computes layer
norm in float32 under bf16-mixed, the CPU in bfloat16): ``value_metas`` with a CUDA device makes
its fake-tensor pass on that device. A worker's caching allocator is capped at its plan's
limit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from outcore.core.values import value_metas
from outcore.runtime.worker import cap_allocator

pytestmark = pytest.mark.gpu


def test_bf16_metas_follow_the_devices_autocast():
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)))
    x = torch.randn(2, 8)
    norm = [n.name for n in gm.graph.nodes if n.op == "call_module"][-1]
    linear = [n.name for n in gm.graph.nodes if n.op == "call_module"][0]
    on_cpu = value_metas(gm, (x,), precision="bf16-mixed")
    on_gpu = value_metas(gm, (x,), precision="bf16-mixed", device=torch.device("cuda"))
    assert on_cpu[linear].tensor_leaves()[0].dtype == torch.bfloat16
    assert on_gpu[linear].tensor_leaves()[0].dtype == torch.bfloat16
    assert on_cpu[norm].tensor_leaves()[0].dtype == torch.bfloat16
    assert on_gpu[norm].tensor_leaves()[0].dtype == torch.float32
    # the model's parameters are where they were, unchanged
    assert all(p.device.type == "cpu" for p in gm.parameters())


def test_the_allocator_is_capped_at_the_plans_limit():
    dev = torch.device("cuda")
    total = torch.cuda.get_device_properties(dev).total_memory
    try:
        assert cap_allocator(dev, 2**30) == pytest.approx(2**30 / total)
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(2 * 2**30, dtype=torch.uint8, device=dev)
        assert cap_allocator(dev, None) is None
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
        torch.cuda.empty_cache()
