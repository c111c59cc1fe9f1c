"""Spatial parallelism equals the serial model: every layer on its own (float64, to 1e-9), and
whole networks trained for several SGD steps (float32, 1e-5 relative): a ResNet-style classifier
and a U-Net, 2 and 4 tiles over the height, the width or both, odd image sizes (tiles of unequal
height and width), stride-2 convolutions and pooling windows crossing tile borders.

Workers are real gloo processes (``run_local``); the reference is plain PyTorch in this process.
"""

from __future__ import annotations

import pytest

from outcore.runtime.launch import run_local
from tests.parallel.spatial.workers import (
    LAYERS,
    gather_worker,
    reference,
    subgroup_worker,
    suite_worker,
)

pytestmark = [pytest.mark.dist, pytest.mark.timeout(180)]

SHAPE = (2, 3, 30, 34)   # 30 x 34: 2x2 pools give 15 x 17, then 7 x 8 — odd, unequal tiles


def assert_same_training(results, ref, rtol=1e-5):
    ref_losses, ref_grads, ref_state, ref_bufs = ref
    for r in results:
        for got, want in zip(r["losses"], ref_losses):
            assert abs(got - want) <= rtol * abs(want), f"rank {r['rank']}: losses " \
                                                        f"{r['losses']} != {ref_losses}"
        for label, mine, theirs in (("gradient", r["grads"], ref_grads),
                                    ("parameter", r["state"], ref_state),
                                    ("buffer", r["bufs"], ref_bufs)):
            assert set(mine) == set(theirs)
            for k, want in theirs.items():
                scale = max(want.double().abs().max().item(), 1e-3)
                err = (mine[k].double() - want.double()).abs().max().item()
                assert err <= rtol * scale, f"rank {r['rank']} {label} {k}: error {err:.3g}"


SUITES = [
    # grid, ranks, checks: every layer alone; training with the join at a module (None: the
    # model's output is gathered)
    ("2x1", 2, [("layers",), ("train", "resnet", "fc"), ("train", "unet", None)]),
    pytest.param("1x2", 2, [("layers",), ("train", "resnet", "gap")], marks=pytest.mark.slow),
    pytest.param("2x2", 4, [("layers",), ("train", "resnet", "fc"), ("train", "unet", None)],
                 marks=pytest.mark.slow),
    pytest.param("4x1", 4, [("train", "resnet", "layer3"), ("train", "unet-nearest", None)],
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize("grid,ranks,jobs", SUITES, ids=["2x1", "1x2", "2x2", "4x1"])
def test_spatial_equals_serial(grid, ranks, jobs):
    """join="fc": the global average pool runs on tiles and the classifier replicated;
    "gap": tiles gathered before the global pool; "layer3": the dilated block runs whole."""
    steps = 3
    results = run_local(suite_worker, ranks, (grid, jobs, SHAPE, steps), timeout_s=60,
                        overall_timeout_s=170)
    assert len(results) == ranks
    for job in jobs:
        per_rank = [r[job] for r in results]
        if job[0] == "layers":
            for errs_of in per_rank:
                assert set(errs_of) == set(LAYERS)
                for layer, errs in errs_of.items():
                    bad = {k: v for k, v in errs.items() if not v <= 1e-9}
                    assert not bad, f"{layer} on {grid}: relative errors {bad}"
        else:
            assert_same_training(per_rank, reference(job[1], SHAPE, steps))


def test_gather_to_all_and_to_one_rank():
    """The join's gather: the whole tensor (on every rank, or on rank 1 only with an empty
    tensor elsewhere) and each tile's gradient back (2x1 grid of 13 x 11: tiles 7 and 6 rows)."""
    results = run_local(gather_worker, 2, ("2x1", 1), timeout_s=60, overall_timeout_s=120)
    for r in results:
        assert r[(None, "value")] == 0 and r[(None, "grad")] == 0
        assert r[(1, "grad")] == 0
        # rank 1: largest difference from the whole tensor; rank 0: elements of what it got
        assert r[(1, "value")] == 0


@pytest.mark.slow
def test_tile_groups_inside_a_larger_world():
    """World of 4, tile groups {0, 2} and {1, 3}: messages go to the right global ranks."""
    results = run_local(subgroup_worker, 4, ("resnet", "1x2", SHAPE, 2, "fc"), timeout_s=60,
                        overall_timeout_s=150)
    assert [r["tile"] for r in results] == [0, 0, 1, 1]
    assert_same_training(results, reference("resnet", SHAPE, 2))
