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

# Adam is used on models without attention-key biases: a key bias's gradient vanishes (softmax
# is shift-invariant), so Adam's normalised step turns its rounding noise into full-size updates
# and no two summation orders agree (tests/runtime/test_equivalence.py uses SGD there too).

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
         ("transformer", "1d", 2, "sgd", 10), ("transformer", "1d", 4, "sgd", 10),
         ("mlp", "depth", 2, "adam", 1), ("transformer", "depth", 2, "sgd", 1)]


@pytest.mark.parametrize("name,mode,tp,optimizer,min_split", CASES,
                         ids=[f"{c[0]}-{c[1]}-tp{c[2]}-{c[3]}" for c in CASES])
def test_tensor_parallel_equals_single_process(name, mode, tp, optimizer, min_split):
    results = run_local(train_pair, tp, (name, mode, optimizer), timeout_s=60,
                        overall_timeout_s=180)
    check(results, min_split=min_split)


HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")
@pytest.mark.parametrize("name,min_split", [("gpt2", 2), ("llama", 10)])
def test_hugging_face_lm_equals_single_process(name, min_split):
    """A language model written without outcore in mind, captured by torch.export: GPT-2
    (its Conv1D layers stay whole; the tied embedding / output matrix is split by vocabulary)
    and a Llama-style decoder (attention q/k/v -> o and SwiGLU gate/up -> down pairs)."""
    results = run_local(train_pair, 2, (name, "1d", "sgd"), timeout_s=60,
                        overall_timeout_s=180)
    check(results, min_split=min_split)
    if name == "llama":
        assert results[0]["pairs"] == 4


def test_auto_parallelize_pairs_attention_and_mlp():
    """Built inside ``auto_parallelize``: q/k/v -> o (4 heads, 2 per rank) and fc1 -> fc2
    pair; the head count the module reshapes with is divided."""
    from tests.tensor.workers import train_auto
    results = run_local(train_auto, 2, (), timeout_s=60, overall_timeout_s=180)
    check(results, min_split=7)
    assert results[0]["pairs"] == 2 and results[0]["heads"] == 2


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_tensor_times_depth_grid_on_four_ranks(name):
    """tp = 2 (Megatron layout) x depth = 2 (FSDP sharding of the split model) on 4 ranks:
    torchtitan's 2-D composition, each depth group fed half of the batch."""
    results = run_local(train_pair, 4, (name, "1d", "sgd", 3, 2), timeout_s=90,
                        overall_timeout_s=240)
    check(results, min_split=4)
