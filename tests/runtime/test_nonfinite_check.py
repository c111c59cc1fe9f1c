"""The optimizer action's check for NaN and inf (``outcore.hardware.nonfinite.any_nonfinite``):
one multi-tensor kernel per device; it must find a single bad value in any dtype, pass large
finite values, and leave every gradient as it was."""

from __future__ import annotations

import pytest
import torch

from outcore.hardware.nonfinite import any_nonfinite


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_finds_one_bad_value_and_changes_nothing(dtype):
    torch.manual_seed(0)
    grads = [torch.randn(16, 16, dtype=dtype), torch.randn(7, dtype=dtype),
             torch.randn(3, 5, dtype=dtype)[:, 1:4]]  # a non-contiguous view too
    before = [g.clone() for g in grads]
    assert not any_nonfinite(grads)
    assert all(torch.equal(g, b) for g, b in zip(grads, before))
    big = torch.finfo(dtype).max / 2
    grads[0][3, 3] = big  # large but finite: a max-norm or sum would not overflow it away
    assert not any_nonfinite(grads)
    for bad in (float("nan"), float("inf"), float("-inf")):
        grads[2][1, 1] = bad
        assert any_nonfinite(grads)
        grads[2][1, 1] = 0.0
    assert not any_nonfinite([])
