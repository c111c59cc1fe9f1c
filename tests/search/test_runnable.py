"""The layout search proposes only layouts the model can run (outcore.search.runnable): a
batch norm with one value per channel per sample needs two samples per micro-batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import outcore
from outcore.errors import UsageError
from outcore.graph.batch import at_microbatch
from outcore.search.runnable import runnable


def _graph(pool: bool, batch: int = 4):
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()]
    if pool:  # BN after a global pool: one value per channel per sample
        layers += [nn.AdaptiveAvgPool2d(1), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8, 4)]
    else:
        layers += [nn.BatchNorm2d(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)]
    g = outcore.capture(nn.Sequential(*layers), torch.randn(batch, 3, 8, 8))
    return outcore.estimate(g, "cpu")


def test_batch_norm_over_one_value_per_channel_needs_two_samples():
    need = runnable(_graph(pool=True), rescaled=True)
    assert need.min_samples == 2 and "batch norm" in need.reason
    assert need.refusal(2) is None and "a micro-batch of 1 sample" in need.refusal(1)
    # over a feature map a single sample has many values per channel: it runs
    assert runnable(_graph(pool=False), rescaled=True).min_samples == 1


def test_the_search_rules_out_micro_batches_of_one_and_says_why():
    g = _graph(pool=True)
    # micro-batches per copy (batch_stats global would give every copy whole ones of 2)
    req = outcore.plan_request(2, None, microbatches=2, search_layout=True,
                               batch_stats="per-copy")
    p = outcore.plan(g, req)
    assert g.batch_size // (p.layout.copies * p.microbatches) >= 2
    records = p.extra["candidates"]
    refused = [r for r in records if r["outcome"].startswith("cannot run")]
    assert refused and all(r["samples"] == 1 for r in refused)
    assert all(r["samples"] >= 2 for r in records if r not in refused)
    # the same graph without that batch norm may take micro-batches of one
    free = outcore.plan(_graph(pool=False), req)
    assert not any(r["outcome"].startswith("cannot run") for r in free.extra["candidates"])
    # and --explain shows the reason
    whys = [r["why"] for r in outcore.api.explain(p)]
    assert any("batch norm" in w for w in whys)


def test_no_runnable_layout_is_refused_with_the_fix():
    g = _graph(pool=True, batch=2)
    with pytest.raises(UsageError, match="no layout of 2 devices .* at least 2 samples"):
        outcore.plan(g, outcore.plan_request(2, None, microbatches=2, search_layout=True))
    # a given layout on a graph of one sample: refused at planning, not in the workers
    small = at_microbatch(_graph(pool=True), 1)
    with pytest.raises(UsageError, match="cannot train on a micro-batch of 1 sample"):
        outcore.plan(small, outcore.plan_request(2, None, microbatches=1))


def test_a_graph_torch_export_captured_at_a_larger_batch_needs_two_samples():
    g = _graph(pool=False)
    exported = g.replace(meta={**g.meta, "capture": {**g.meta["capture"], "path": "export"}})
    need = runnable(exported, rescaled=True)
    assert need.min_samples == 2 and not need.strict
    assert "torch.export specialises" in need.reason
    # planned at the batch it was captured at, or captured at one sample: nothing to re-export
    assert runnable(exported, rescaled=False).min_samples == 1
    assert runnable(at_microbatch(exported, 1), rescaled=True).min_samples == 1


def test_a_preference_rules_layouts_out_only_while_others_remain():
    """A graph torch.export captured may still run at one sample (the run places the layout
    again on the graph captured there): with other layouts it is not tried; alone it is."""
    g = _graph(pool=False)
    exported = g.replace(meta={**g.meta, "capture": {**g.meta["capture"], "path": "export"}})
    p = outcore.plan(exported, outcore.plan_request(2, None, microbatches=2, search_layout=True,
                                                    batch_stats="per-copy"))
    assert g.batch_size // (p.layout.copies * p.microbatches) >= 2
    assert any(r["outcome"].startswith("not tried: a micro-batch of 1 sample")
               for r in p.extra["candidates"])
    two = at_microbatch(exported, 2)  # dp 2 of a batch of 2: one sample each, the only layout
    p = outcore.plan(two, outcore.plan_request(2, None, dp=2, microbatches="auto"))
    assert p.layout.dp == 2
