"""Tensor parallelism on 4 ranks equals single-process training: tp = 4, and tp = 2 x depth = 2
(Megatron layout on one mesh dimension, FSDP on the other). One launch for all cases."""

from __future__ import annotations

import pytest

from tests.parallel.tensor.test_tensor_parallel import check, launch

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(400)]

CASES = {
    "mlp-tp4-sgd": ("train_pair", ("mlp", "1d", "sgd"), 4),
    "transformer-tp4-sgd": ("train_pair", ("transformer", "1d", "sgd"), 10),
    "mlp-tp2xdepth2": ("train_pair", ("mlp", "1d", "sgd", 3, 2), 4),
    "transformer-tp2xdepth2": ("train_pair", ("transformer", "1d", "sgd", 3, 2), 4),
}


@pytest.fixture(scope="module")
def four_ranks():
    return launch(CASES, 4)


@pytest.mark.parametrize("key", list(CASES))
def test_four_ranks_equal_single_process(four_ranks, key):
    check(four_ranks[key], min_split=CASES[key][2])
