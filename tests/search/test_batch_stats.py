"""Batch statistics as on one device (PlanRequest.batch_stats): when the layout search chooses
the layout of a batch-norm model, the micro-batches the user asks for are those of the whole
batch, and model copies take whole ones; ``per-copy`` counts them per copy, as DDP does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import outcore
from outcore.errors import UsageError
from outcore.graph.batch import at_microbatch
from outcore.search.runnable import has_batch_statistics


def _graph(norm: type[nn.Module] = nn.BatchNorm2d, batch: int = 8):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), norm(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), norm(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    return outcore.estimate(outcore.capture(model, torch.randn(batch, 3, 8, 8)), "cpu")


def _group_norm(c: int) -> nn.Module:
    return nn.GroupNorm(2, c)


def test_copies_take_whole_micro_batches_of_a_batch_norm_model():
    g = _graph()
    assert has_batch_statistics(g)
    req = outcore.plan_request(4, None, microbatches=2, search_layout=True)
    p = outcore.plan(g, req)
    records = p.extra["candidates"]
    # every layout tried splits the batch into the 2 micro-batches asked for: 4 samples each
    assert {r["samples"] for r in records} == {4}
    assert p.layout.copies * p.microbatches == 2
    # layouts of 4 copies would split a micro-batch: not among them
    assert max(r["dp"] * r["replicas"] for r in records) == 2
    note = [n for n in p.notes if n.startswith("batch statistics")]
    assert note == ["batch statistics: over each of 2 micro-batches of 4 samples, as one "
                    "device training the batch in 2 micro-batches takes them; model copies "
                    "take whole micro-batches (batch_stats global)"]


def test_per_copy_counts_micro_batches_per_copy():
    p = outcore.plan(_graph(), outcore.plan_request(4, None, microbatches=2, search_layout=True,
                                                    batch_stats="per-copy"))
    records = p.extra["candidates"]
    assert {r["samples"] for r in records} > {4}  # dp copies each split their share in 2
    assert any(r["samples"] == 1 for r in records)
    chunks = p.layout.copies * p.microbatches
    assert any(n.startswith(f"batch statistics: over each of {chunks} micro-batch")
               and n.endswith("(batch_stats per-copy)") for n in p.notes)


def test_models_without_batch_statistics_keep_micro_batches_per_copy():
    g = _graph(_group_norm)
    assert not has_batch_statistics(g)
    p = outcore.plan(g, outcore.plan_request(4, None, microbatches=2, search_layout=True))
    assert any(r["samples"] == 1 for r in p.extra["candidates"])
    assert not any(n.startswith("batch statistics") for n in p.notes)


def test_a_given_layout_says_which_samples_its_statistics_see():
    g = at_microbatch(_graph(), 2)
    p = outcore.plan(g, outcore.plan_request(4, None, dp=2, microbatches=2))
    assert "batch statistics: over each of 4 micro-batches of 2 samples, as one device " \
           "training the batch in 4 micro-batches takes them" in p.notes


def test_unknown_batch_statistics_are_refused():
    with pytest.raises(UsageError, match="unknown batch statistics 'mine'"):
        outcore.plan_request(2, None, batch_stats="mine")
