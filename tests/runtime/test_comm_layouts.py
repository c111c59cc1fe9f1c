"""The communication profile of tensor-parallel and sharded runs: every collective they run
inside their pieces is measured and predicted, with counts that agree and no bandwidth a link
cannot have."""

from __future__ import annotations

import pytest

import outcore

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

LM = "outcore:transformer:layers=1,d_model=64,heads=4,seq=8,vocab=256"
ARGS = dict(steps=2, costs="estimate:cpu", batch_size=4, optimizer="sgd", lr=0.01)


def _rows(report):
    rows = {r["kind"]: r for r in report.comm}
    for r in rows.values():  # gloo on this host moves well under a terabyte a second
        assert r["measured_bandwidth"] is None or r["measured_bandwidth"] < 1e12, r
    return rows


def test_tensor_parallel_collectives_are_measured_and_predicted(tmp_path):
    report = outcore.train(LM, 2, tp=2, run_dir=str(tmp_path), **ARGS)
    assert report.plan.layout.tp == 2
    row = _rows(report)["tp allreduce"]
    assert row["count"] > 0 and row["bytes"] > 0 and row["measured_s"] > 0
    assert row["predicted_count"] == row["count"]
    assert row["predicted_bytes"] == pytest.approx(row["bytes"], rel=0.01)
    assert row["predicted_s"] > 0


def test_sharded_gathers_and_scatters_replace_an_empty_all_reduce(tmp_path):
    report = outcore.train(LM, 2, dp=2, shard=2, run_dir=str(tmp_path), **ARGS)
    assert report.plan.layout.depth == 2
    rows = _rows(report)
    # each copy holds its own shard: nothing is all-reduced (was a 0-second prediction and an
    # all-reduce of the whole bucket "measured" at terabytes a second)
    assert "allreduce" not in rows
    for kind in ("shard allgather", "shard reduce_scatter"):
        row = rows[kind]
        assert row["count"] > 0 and row["count"] == row["predicted_count"], row
        assert row["predicted_bytes"] == pytest.approx(row["bytes"], rel=0.05), row
        assert row["predicted_s"] > 0


def test_spatial_halos_statistics_and_the_join_are_measured_and_predicted(tmp_path):
    """Every tile rank's halo exchanges, batch-norm statistics and the join's gather and
    scatter (a tile rank runs them in lock-step with its spatial stage's rank)."""
    report = outcore.train("outcore:resnet_k:depth=11,width=8", 2, sp=2,
                           input_shape=(4, 3, 32, 32), run_dir=str(tmp_path), **ARGS)
    assert report.plan.layout.sp == 2
    rows = _rows(report)
    for kind in ("sp halo", "sp allreduce", "sp gather", "sp scatter"):
        row = rows[kind]
        assert row["count"] > 0 and row["bytes"] > 0 and row["predicted_s"] > 0, row
        assert row["predicted_count"] > 0, row
    # both tiles exchange their halos forward and backward, the same rows on each side
    halo = rows["sp halo"]
    assert halo["predicted_bytes"] == pytest.approx(halo["bytes"], rel=0.25), halo
