"""Tensor-parallel training equals single-process training (losses and every parameter).

Every worker keeps a deep copy of the model as the single-process reference, trains both on the
same batches (SGD or Adam, 3 steps), and returns both; all 2-rank cases share one launch of
gloo workers (tests/parallel/tensor/test_tensor_parallel_4ranks.py has the 4-rank ones)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from outcore.runtime.launch import run_local
from tests.parallel.tensor.workers import run_cases

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]

RTOL = 1e-5
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

# Adam is used on models without attention-key biases: a key bias's gradient vanishes (softmax
# is shift-invariant), so Adam's normalised step turns its rounding noise into full-size updates
# and no two summation orders agree (tests/runtime/test_equivalence.py uses SGD there too).
CASES = {  # key: (worker function, its arguments, least number of modules split)
    "mlp-1d-adam": ("train_pair", ("mlp", "1d", "adam"), 4),
    "transformer-1d-sgd": ("train_pair", ("transformer", "1d", "sgd"), 10),
    "mlp-depth-adam": ("train_pair", ("mlp", "depth", "adam"), 1),
    "transformer-depth-sgd": ("train_pair", ("transformer", "depth", "sgd"), 1),
    "auto_parallelize": ("train_auto", (), 7),
    "fixed-width": ("split_fixed_width", (), 0),
}
if HAS_TRANSFORMERS:
    CASES["gpt2"] = ("train_pair", ("gpt2", "1d", "sgd"), 2)
    CASES["llama"] = ("train_pair", ("llama", "1d", "sgd"), 10)


def check(results, *, min_split: int):
    for r in results:
        assert "error" not in r, r.get("error")
        np.testing.assert_allclose(r["losses"], r["ref_losses"], rtol=RTOL, atol=0)
        assert set(r["state"]) == set(r["ref_state"])
        for k, v in r["state"].items():
            ref = r["ref_state"][k]
            scale = max(ref.abs().max().item(), 1e-3)
            err = (v - ref).abs().max().item()
            assert err <= RTOL * scale, \
                f"rank {r['rank']} {k}: error {err:.3g} > {RTOL} x {scale:.3g}"
        assert len(r["split"]) >= min_split, r["split"]
        # the run must have moved the parameters, or the comparison proves nothing
        assert r["losses"][0] != r["losses"][-1]


def launch(cases: dict, ranks: int) -> dict:
    per_rank = run_local(run_cases, ranks, ([(k, fn, args) for k, (fn, args, _) in
                                             cases.items()],), timeout_s=90,
                         overall_timeout_s=360)
    return {k: [r[k] for r in per_rank] for k in cases}


@pytest.fixture(scope="module")
def two_ranks():
    return launch(CASES, 2)


def test_a_wrong_split_is_refused(two_ranks):
    """A module merging heads back with a hard-coded width cannot run split by heads: the
    output check raises ModelError naming the layout instead of training something else."""
    for r in two_ranks["fixed-width"]:
        assert r["refused"] and "q, k, v -> o" in r["refused"], r


@pytest.mark.parametrize("key", [k for k in CASES if k != "fixed-width"])
def test_tp2_equals_single_process(two_ranks, key):
    """mlp / transformer: tp = 2 Megatron layout (1d) and FSDP depth sharding; auto_parallelize
    around a model with q/k/v -> o attention (4 heads, 2 per rank) and an MLP pair; Hugging Face
    GPT-2 (its Conv1D layers stay whole; the tied embedding / output matrix is split by
    vocabulary) and a Llama-style decoder (q/k/v -> o and SwiGLU gate/up -> down pairs),
    captured by torch.export."""
    check(two_ranks[key], min_split=CASES[key][2])
    if key == "llama":
        assert two_ranks[key][0]["pairs"] == 4
    if key == "auto_parallelize":
        assert two_ranks[key][0]["pairs"] == 2 and two_ranks[key][0]["heads"] == 2


def test_hugging_face_cases_ran_or_were_skipped_for_a_reason():
    if not HAS_TRANSFORMERS:
        pytest.skip("transformers is not installed (pip install outcore[hf])")
    assert {"gpt2", "llama"} <= set(CASES)
