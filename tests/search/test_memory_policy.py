"""The planner's choice of memory policies (pure: no torch)."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.errors import InfeasibleError, UsageError
from outcore.graph import build
from outcore.hardware.cluster import from_dict as cluster_from_dict
from outcore.hardware.spec import DeviceSpec, flat_cluster
from outcore.plan import make_plan
from outcore.search.memory_policy import choose
from outcore.sim import simulate

MB = 2**20


def chain(n=16, saved=4 * MB, params=MB // 4):
    """A chain whose saved activations dominate: 16 x 4 MiB saved, 1/4 MiB params each."""
    return build("chain", fwd_s=[1e-3] * n, bwd_s=[2e-3] * n, src=list(range(n - 1)),
                 dst=list(range(1, n)), edge_bytes=[MB // 4] * (n - 1),
                 saved_bytes=[saved] * n, out_bytes=[MB // 4] * n, param_bytes=[params] * n,
                 batch_size=1)


def cluster(memory, host_is_device):
    dev = DeviceSpec("cpu" if host_is_device else "gpu", memory, 1e12, 1e11,
                     host_bandwidth=1e10, host_is_device=host_is_device)
    return flat_cluster(1, memory_bytes=memory, device=dev)


def plan_for(g, memory, host_is_device=True):
    cl = cluster(memory, host_is_device)
    doc = {"bandwidth": 16e9, "latency_s": 0, "host_bandwidth": 1e10,
           "host_is_device": host_is_device}
    p = make_plan(g, np.zeros(g.num_nodes, dtype=int), strategy="single", devices=1,
                  memory_bytes=memory, cluster=cluster_from_dict(doc, devices=1,
                                                                 memory_bytes=memory))
    return p, cl


def test_fitting_plan_is_left_alone():
    g = chain()
    p, cl = plan_for(g, 1024 * MB)
    assert choose(g, p, cluster=cl) is p


def test_checkpointing_makes_a_cpu_run_fit():
    g = chain()
    before = simulate(*plan_for(g, None)[:1], g).peak_bytes[0]
    p, cl = plan_for(g, 40 * MB)
    assert before > 40 * MB
    q = choose(g, p, cluster=cl)
    pol = q.policies
    assert set(pol.policies) == {"checkpoint"}  # offloading frees nothing on a CPU host
    r = simulate(q, g, cluster=cl)
    assert r.peak_bytes[0] <= 40 * MB
    # recomputation costs time: the backward of every checkpointed piece reruns its forward
    assert r.iteration_s > simulate(p, g, cluster=cl).iteration_s


def test_offloading_is_chosen_on_an_accelerator_when_cheaper():
    g = chain()
    p, cl = plan_for(g, 40 * MB, host_is_device=False)
    q = choose(g, p, mode="offload", cluster=cl)
    pol = q.policies
    assert set(pol.policies) <= {"offload-activations", "offload-params"} and pol.policies
    assert simulate(q, g, cluster=cl).peak_bytes[0] <= 40 * MB


def test_offload_only_cannot_help_a_cpu_run():
    g = chain()
    p, cl = plan_for(g, 40 * MB)
    with pytest.raises(InfeasibleError, match="even with every allowed memory policy"):
        choose(g, p, mode="offload", cluster=cl)


def test_none_and_impossible_limits_fail_clearly():
    g = chain()
    p, cl = plan_for(g, 40 * MB)
    with pytest.raises(InfeasibleError, match="--memory-policy none"):
        choose(g, p, mode="none", cluster=cl)
    p, cl = plan_for(g, 12 * MB)  # less than the parameters and optimizer state alone
    with pytest.raises(InfeasibleError, match="needs"):
        choose(g, p, cluster=cl)
    with pytest.raises(UsageError, match="unknown memory policy"):
        choose(g, p, mode="swap", cluster=cl)


def test_a_plan_already_slower_than_a_bound_is_not_fitted():
    """Branch and bound: policies only add time, so a plan whose simulation without them
    already exceeds the bound comes back as it is (not fitting); below the bound it is fitted
    and the simulation returned is the fitted plan's."""
    from outcore.search.memory_policy import choose_simulated
    g = chain()
    p, cl = plan_for(g, 40 * MB)
    plain = simulate(p, g, cluster=cl)
    q, sim = choose_simulated(g, p, cluster=cl, give_up_above_s=plain.iteration_s * 0.99)
    assert q is p and not sim.fits
    q, sim = choose_simulated(g, p, cluster=cl, give_up_above_s=plain.iteration_s * 10)
    assert q.policies is not None and sim.fits
    again = simulate(q, g, cluster=cl)
    assert again.iteration_s == sim.iteration_s and again.iteration_s > plain.iteration_s


def test_the_search_gives_up_in_the_round_that_passes_its_bound(monkeypatch):
    """A plan that needs several rounds of policies stops at the first round whose simulated
    time reaches ``give_up_above_s`` (it cannot win: later rounds only add policies), not
    after its last round (the generator's RNN on 2 devices, 4 micro-batches, at 1.1 of the
    fair share: two rounds to fit, each keeping the last one's policies and slower, then one
    that drops what the fitted plan has room for)."""
    import outcore
    from outcore.graph.generators import make
    from outcore.placers import placements
    from outcore.placers.context import make_context
    from outcore.search.memory_policy import choose_simulated

    g = make("rnn", 1000)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    req = outcore.plan_request(2, 1.1 * one / 2, bandwidth="16GB/s", microbatches=4)
    a = placements(g, 2, strategy="contiguous", cluster=req.cluster.slots(1),
                   optimizer=req.optimizer, microbatches=4)[0].assignment
    p = make_plan(g, a, strategy="contiguous", devices=2, memory_bytes=req.memory_bytes,
                  microbatches=4, cluster=req.cluster)
    times = _counting(monkeypatch)
    q, sim = choose_simulated(g, p, cluster=req.cluster)
    assert sim.fits and len(times) >= 4 and times[:3] == sorted(times[:3]), times
    rounds = times[:]
    bound = (rounds[0] + rounds[1]) / 2  # passed by the first round's plan, which does not fit
    times.clear()
    q, sim = choose_simulated(g, p, cluster=req.cluster, give_up_above_s=bound)
    assert not sim.fits and sim.iteration_s >= bound, (rounds, times)
    assert times == rounds[:2]


def _counting(monkeypatch):
    from outcore.search import memory_policy
    real, times = memory_policy.simulate, []

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        times.append(out.iteration_s)
        return out

    monkeypatch.setattr(memory_policy, "simulate", counted)
    return times


@pytest.mark.parametrize("devices,microbatches", [(2, 4), (4, 2)])
def test_policies_are_priced_by_what_they_free_at_the_simulated_peak(monkeypatch, devices,
                                                                     microbatches):
    """Each round takes the options cheapest per byte they free at the device's simulated
    peak (their piece's micro-batches held there), so a few rounds fit the plan: the
    generator's 1000-node RNN at its fair share took 49 (2 devices) and 7 (4 devices)
    simulations when every option was counted at every micro-batch in flight (1.15x the
    placers' fair share here: the simulator also holds the gradients of the shared weights
    each step's piece hands back, which the placers' model does not count)."""
    import outcore
    from outcore.graph.generators import make
    from outcore.placers import placements
    from outcore.placers.context import make_context
    from outcore.search.memory_policy import choose_simulated

    g = make("rnn", 1000)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    req = outcore.plan_request(devices, one / devices * 1.15, bandwidth="16GB/s",
                               microbatches=microbatches)
    a = placements(g, devices, strategy="contiguous", cluster=req.cluster.slots(1),
                   optimizer=req.optimizer, microbatches=microbatches)[0].assignment
    p = make_plan(g, a, strategy="contiguous", devices=devices, memory_bytes=req.memory_bytes,
                  microbatches=microbatches, cluster=req.cluster)
    times = _counting(monkeypatch)
    q, sim = choose_simulated(g, p, cluster=req.cluster)
    assert sim.fits and q.policies is not None
    assert len(times) <= 6, times
    assert simulate(q, g, cluster=req.cluster).iteration_s == sim.iteration_s


def test_options_a_fitted_plan_has_room_for_are_dropped_when_that_is_faster(monkeypatch):
    """Once every device fits, the options taken last on a device with room to spare are
    dropped when the simulator finds the plan still fits and is faster: the RNN generator's
    600 nodes on 4 devices at 1.44x the placers' fair share, 2 micro-batches, 102.0 -> 99.0
    ms."""
    import outcore
    from outcore.graph.generators import make
    from outcore.placers import placements
    from outcore.placers.context import make_context
    from outcore.search import memory_policy

    g = make("rnn", 600)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    req = outcore.plan_request(4, 1.44 * one / 4, bandwidth="16GB/s", microbatches=2)
    a = placements(g, 4, strategy="contiguous", cluster=req.cluster.slots(1),
                   optimizer=req.optimizer, microbatches=2)[0].assignment
    p = make_plan(g, a, strategy="contiguous", devices=4, memory_bytes=req.memory_bytes,
                  microbatches=2, cluster=req.cluster)
    trimmed, sim = memory_policy.choose_simulated(g, p, cluster=req.cluster)
    monkeypatch.setattr(memory_policy, "_trimmed", lambda g, plan, fitted, *rest: fitted)
    untrimmed, before = memory_policy.choose_simulated(g, p, cluster=req.cluster)
    assert sim.fits and before.fits
    assert sim.iteration_s < 0.98 * before.iteration_s, (sim.iteration_s, before.iteration_s)
    assert len(trimmed.policies.policies) < len(untrimmed.policies.policies)
