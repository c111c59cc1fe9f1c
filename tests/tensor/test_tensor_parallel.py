"""Tensor-parallel training equals single-process training (losses and every parameter).

Each case spawns 2 or 4 gloo workers; every worker keeps a deep copy of the model as the
single-process reference, trains both on the same batches, and returns both."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from outcore.runtime.launch import run_local
from tests.tensor.workers import train_pair

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

RTOL = 1e-5


def check(results, *, min_split: int):
    for r in results:
        np.testing.assert_allclose(r["losses"], r["ref_losses"], rtol=RTOL, atol=0)
        assert set(r["state"]) == set(r["ref_state"])
        for k, v in r["state"].items():
            ref = r["ref_state"][k]
            scale = max(ref.abs().max().item(), 1e-3)
            err = (v - ref).abs().max().item()
            assert err <= RTOL * scale, f"rank {r['rank']} {k}: error {err:.3g} > {RTOL} x {scale:.3g}"
        assert len(r["split"]) >= min_split, r["split"]
        # the run must have moved the parameters, or the comparison proves nothing
        assert r["losses"][0] != r["losses"][-1]


CASES = [("mlp", "1d", 2, "adam", 4), ("mlp", "1d", 4, "sgd", 4),
         ("transformer", "1d", 2, "adam", 10), ("transformer", "1d", 4, "sgd", 10),
         ("mlp", "depth", 2, "adam", 1), ("transformer", "depth", 2, "sgd", 1)]


@pytest.mark.parametrize("name,mode,tp,optimizer,min_split", CASES,
                         ids=[f"{c[0]}-{c[1]}-tp{c[2]}-{c[3]}" for c in CASES])
def test_tensor_parallel_equals_single_process(name, mode, tp, optimizer, min_split):
    results = run_local(train_pair, tp, (name, mode, optimizer), timeout_s=60,
                        overall_timeout_s=180)
    check(results, min_split=min_split)
