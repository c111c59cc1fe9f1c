"""A batch-norm model trains on 2 devices with one device's losses, whatever layout the search
picks (batch statistics over the same samples: PlanRequest.batch_stats ``global``)."""

from __future__ import annotations

import pytest

import outcore

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]

MODEL = "outcore:resnet_k:depth=11,width=4"
ARGS = dict(input_shape=(4, 3, 64, 64), batch_size=4, microbatches=2, steps=3,
            optimizer="sgd", lr=0.05, costs="estimate:cpu", timeline=False)


def test_batch_norm_losses_equal_one_device_on_the_searched_layout(tmp_path):
    one = outcore.train(MODEL, 1, run_dir=str(tmp_path / "one"), **ARGS)
    two = outcore.train(MODEL, 2, layout="auto", run_dir=str(tmp_path / "two"), **ARGS)
    assert two.plan.layout.copies * two.plan.microbatches == 2
    assert two.losses == pytest.approx(one.losses, rel=1e-5)
    # a given dp 2 layout counts micro-batches per copy (DDP's statistics): 4 micro-batches
    # of one sample, another run's losses (the check can tell them apart)
    ddp = outcore.train(MODEL, 2, dp=2, run_dir=str(tmp_path / "ddp"), **ARGS)
    assert ddp.plan.layout.copies * ddp.plan.microbatches == 4
    assert ddp.losses != pytest.approx(one.losses, rel=1e-4)
    assert any(n.startswith("batch statistics: over each of 4 micro-batches of 1 sample")
               for n in ddp.plan.notes)
