"""AxoNN's 2-D tensor parallelism (``tensor_parallel(mode="2d", grid=(rows, cols))``) on 4
ranks equals single-process training: losses and every parameter (gathered whole) within 1e-5
relative after three SGD steps with momentum, on a 2 x 2 grid (an MLP's two pairs; the zoo
transformer's MLP pairs; attention with q/k/v -> o, its 4 heads split over the 2 columns) and a
1 x 4 grid (Megatron's 1-D layout as the grid's special case)."""

from __future__ import annotations

import pytest

from tests.parallel.tensor.test_tensor_parallel import check, launch

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(400)]

CASES = {
    "mlp-2x2": ("train_grid", ("mlp", 2, 2), 4),
    "transformer-2x2": ("train_grid", ("transformer", 2, 2), 4),
    "attn-2x2": ("train_grid", ("attn", 2, 2), 6),
    "mlp-1x4": ("train_grid", ("mlp", 1, 4), 4),
}


@pytest.fixture(scope="module")
def four_ranks():
    return launch(CASES, 4)


@pytest.mark.parametrize("key", list(CASES))
def test_grid_equals_single_process(four_ranks, key):
    check(four_ranks[key], min_split=CASES[key][2])
    assert all(r["pairs"] >= 1 for r in four_ranks[key])
