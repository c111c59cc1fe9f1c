"""A generated GPT planned with pp x tp on a multi-node A100 cluster and simulated with dp
(pure: no torch; the path benchmarks/axonn_scale.py takes at 4,096 GPUs, here at 32)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import outcore
from outcore.cost.analytical import estimate
from outcore.graph.gpt import GPTShape, make_gpt
from outcore.plan.request import PlanRequest

SHAPE = GPTShape(layers=4, hidden=4096, heads=32, vocab=8192, seq=1024)


def plan_sim(tp: int, pp: int, dp: int):
    g = estimate(make_gpt(SHAPE, batch=2), "a100")
    cl = replace(outcore.cluster_of(tp * pp * dp, per_node=8, device="a100", intra="nvlink3",
                                    inter="ib-hdr", memory_bytes=40 * 2**30), nics_per_node=8)
    req = PlanRequest.make(pp * tp, 40 * 2**30, cluster=cl, tp=tp, strategy="pipeline",
                           microbatches=8)
    p = outcore.plan(g, req)
    return p, outcore.simulate(p, g, dp=dp, cluster=cl)


def test_tp_divides_state_and_compute_across_nodes():
    _, s1 = plan_sim(tp=1, pp=2, dp=8)
    p4, s4 = plan_sim(tp=4, pp=2, dp=2)
    assert p4.layout.tp == 4 and p4.devices == 8
    # every Linear and the embedding split 4 ways: state per rank ~1/4 (LayerNorms stay whole)
    assert s4.costs.param_bytes.sum() == pytest.approx(s1.costs.param_bytes.sum() / 4, rel=0.01)
    # compute per rank ~1/4 too (plus the tensor-parallel all-reduces, over NVLink)
    assert 0.25 < s4.busy_s.sum() / s1.busy_s.sum() < 0.4
    assert s4.iteration_s > 0 and s4.fits
