"""What the copies of a layout hold: every data-parallel copy runs one device's program, and a
sharded layout's plan fits its limit with the parameters it gathers."""

from __future__ import annotations

import numpy as np
import pytest

import outcore

KW = dict(microbatches=1, optimizer="sgd-momentum", device="cpu", memory_policy="checkpoint")


@pytest.fixture(scope="module")
def lm():
    return outcore.model_graph("outcore:resnet_k:depth=11", batch_size=4, costs="estimate:cpu")


def test_a_data_parallel_copy_holds_what_one_device_holds(lm):
    """Under the same memory policies a copy's simulated peak is one device's. The copies'
    layers name the inputs they save without the copy's prefix; read as no saved inputs at
    all, a checkpointed piece of a copy kept none of its inputs (GoogLeNet on 2 copies was
    predicted 4 % under its measured peak)."""
    free = max(outcore.plan(lm, outcore.plan_request(1, None, **KW)).predicted["peak_bytes"])
    one = outcore.plan(lm, outcore.plan_request(1, 0.95 * free, **KW))
    assert one.policies is not None and one.policies.counts().get("checkpoint")
    dp = outcore.plan(lm, outcore.plan_request(2, None, dp=2, **KW))
    copies = outcore.simulate(dp.replace(policies=one.policies), lm)
    np.testing.assert_allclose(copies.peak_bytes, [max(one.predicted["peak_bytes"])] * 2)


def test_a_sharded_layout_is_placed_again_when_its_gathers_pass_the_limit(lm):
    """The placement of a sharded copy budgets each layer's shard, not the parameters a piece
    gathers while it runs: where the sharded plan passes the limit, the copy is placed again
    under the limit less what sharding added, and the plan fits (it was refused)."""
    kw = dict(KW, dp=2, depth=2)
    free = max(outcore.plan(lm, outcore.plan_request(2, None, **kw)).predicted["peak_bytes"])
    limit = 0.95 * free
    p = outcore.plan(lm, outcore.plan_request(2, limit, **kw))
    assert any(n.startswith("sharded: placed again") for n in p.notes)
    assert max(p.predicted["peak_bytes"]) <= limit
    assert max(outcore.simulate(p, lm).peak_bytes) <= limit


def test_each_copy_saves_its_own_layers_outputs(lm):
    """The layers of a copied graph save the outputs of their own copy's layers (the names
    the capture recorded are the uncopied ones)."""
    from outcore.plan.replicas import expand

    p = outcore.plan(lm, outcore.plan_request(2, None, dp=2, **KW))
    big, _, copies = expand(lm, p)
    savers, producers = lm.saved_input_pairs
    assert copies == 2 and savers.size
    big_savers, big_producers = big.saved_input_pairs
    n = lm.num_nodes
    np.testing.assert_array_equal(big_savers, np.concatenate([savers, savers + n]))
    np.testing.assert_array_equal(big_producers, np.concatenate([producers, producers + n]))
