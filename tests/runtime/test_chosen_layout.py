"""outcore train without micro-batches or layout options trains with what the plan chose
(the issue's held-out U-Net: one device, 59 % of its plain footprint)."""

from __future__ import annotations

from pathlib import Path

import pytest

import outcore

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]

UNET = f"{Path(__file__).parents[1] / 'partition' / 'unet_model.py'}:make"


def test_train_uses_the_micro_batches_the_plan_chose(tmp_path):
    g = outcore.model_graph(UNET, costs="estimate:cpu")
    plain = outcore.plan(g, outcore.plan_request(1, None))
    memory = 0.59 * max(plain.predicted["peak_bytes"])
    report = outcore.train(UNET, 1, memory=memory, costs="estimate:cpu", steps=2,
                           run_dir=str(tmp_path / "auto"), trace=False)
    assert report.plan.microbatches > 1 and report.plan.policies is None
    assert report.config.microbatches == report.plan.microbatches
    assert report.plan.graph["batch_size"] * report.plan.microbatches == 8
    assert max(report.peak_bytes) <= memory
    fixed = outcore.train(UNET, 1, memory=memory, costs="estimate:cpu", steps=2,
                          microbatches=report.plan.microbatches,
                          run_dir=str(tmp_path / "fixed"), trace=False)
    assert fixed.losses == report.losses


def test_train_without_layout_options_lets_the_plan_choose(tmp_path):
    report = outcore.train(UNET, 2, costs="estimate:cpu", steps=1, search_layout=True,
                           run_dir=str(tmp_path / "run"))
    # the run's communication profile lists the kinds it measured beside the link model
    kinds = {c["kind"]: c for c in report.comm}
    assert kinds and all(c["count"] > 0 and c["bytes"] >= 0 for c in kinds.values())
    assert any(c["predicted_s"] is not None for c in kinds.values())
    cands = report.plan.extra["candidates"]
    assert sum(r["outcome"] == "chosen" for r in cands) == 1
    assert {(r["dp"], r["parallel"]) for r in cands} >= {(1, "mp"), (2, "mp"), (1, "mast")}
    assert report.config.microbatches == report.plan.microbatches
