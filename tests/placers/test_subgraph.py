"""The ``subgraph`` strategy (SUPER): branches apart, trunk, memory, fallbacks, properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from outcore.errors import InfeasibleError
from outcore.graph.generators import make_transformer
from outcore.graph.ir import build
from outcore.hardware.spec import LinkSpec, flat_cluster
from outcore.placers import partition, strategies, subgraph
from outcore.placers.context import make_context
from outcore.placers.emulate import emulate
from outcore.placers.subgraph import branch_table, place_branches
from outcore.placers.subgraph.branches import find_branches

GiB = 2**30


def fork_join(works, *, chain=2, edge_bytes=1000, param_bytes=0, heavy_edges=()):
    """Fork 0 -> one chain of ``chain`` nodes per branch -> join; then a tail node.

    Branch b's nodes weigh ``works[b] / chain`` seconds forward each (backward: twice that), so
    the branch's forward + backward work is ``3 * works[b]``. ``heavy_edges``: branches whose
    edges to and from the trunk carry 10**12 bytes.
    """
    fwd, src, dst, eb, params = [0.1], [], [], [], [0]
    join = 1 + chain * len(works)
    for b, w in enumerate(works):
        ids = [1 + b * chain + i for i in range(chain)]
        fwd += [w / chain] * chain
        params += [param_bytes] * chain
        big = 10**12 if b in heavy_edges else edge_bytes
        src += [0] + ids[:-1] + [ids[-1]]
        dst += ids + [join]
        eb += [big] + [edge_bytes] * (chain - 1) + [big]
    fwd += [0.1, 0.1]
    params += [0, 0]
    src.append(join)
    dst.append(join + 1)
    eb.append(edge_bytes)
    return build("fj", fwd_s=fwd, src=src, dst=dst, edge_bytes=eb, param_bytes=params)


def branch_devices(g, a):
    (r,) = find_branches(g).regions
    return [sorted(set(a[b].tolist())) for b in r.branches]


def test_registered_with_a_one_line_description():
    assert "subgraph" in strategies() and "\n" not in strategies()["subgraph"]


def test_branches_go_to_different_devices_when_there_are_enough():
    g = fork_join([4.0] * 4)
    for k in (4, 8):
        r = partition(g, k, strategy="subgraph")
        devs = branch_devices(g, r.assignment)
        assert all(len(d) == 1 for d in devs)
        assert len({d[0] for d in devs}) == 4
        assert r.devices_used == 4
        assert r.notes[0].startswith("1 fork-join regions")
    one = emulate(g, np.zeros(g.num_nodes, np.int64))
    # four branches of 12 s in parallel instead of 48 s in series (plus the trunk)
    assert r.makespan_s < one.makespan_s / 3


def test_fewer_devices_than_branches_balance_the_load():
    g = fork_join([4.0] * 4)
    r = partition(g, 2, strategy="subgraph")
    devs = branch_devices(g, r.assignment)
    assert sorted(np.bincount([d[0] for d in devs]).tolist()) == [2, 2]


def test_longest_branch_first_to_the_device_where_it_finishes_first():
    # works 6, 4, 3 on two devices: 6 on the fork's device (no transfer), 4 then 3 together
    g = fork_join([6.0, 4.0, 3.0])
    r = partition(g, 2, strategy="subgraph")
    fork_dev = r.assignment[0]
    devs = branch_devices(g, r.assignment)
    assert devs[0] == [fork_dev]
    assert devs[1] == devs[2] and devs[1] != [fork_dev]


def test_a_branch_whose_transfers_cost_more_than_it_saves_stays_with_the_fork():
    g = fork_join([4.0, 4.0, 4.0, 0.2], heavy_edges=(3,))
    ctx = make_context(g, 4)
    br = find_branches(g)
    (region,) = br.regions
    a = place_branches(ctx, branch_table(ctx, br.chosen), np.zeros(g.num_nodes, np.int64))
    devs = [sorted(set(a[b].tolist())) for b in region.branches]
    assert devs[3] == [0]  # the 10**12-byte branch stays on the fork's device
    assert [d[0] for d in devs[:3]] == [0, 1, 2]  # equal work: fork's device, then by index


def test_chain_says_so_and_returns_the_best_simpler_plan():
    n = 6
    g = build("chain", fwd_s=[1.0] * n, src=list(range(n - 1)), dst=list(range(1, n)),
              edge_bytes=[8] * (n - 1))
    r = partition(g, 4, strategy="subgraph")
    assert any("chain" in line for line in r.notes)
    one = emulate(g, np.zeros(n, np.int64))
    assert r.makespan_s <= one.makespan_s * (1 + 1e-12)
    assert r.devices_used == 1  # one micro-batch: stages only add transfers


def test_never_slower_than_one_device_when_transfers_dominate():
    g = fork_join([1e-6] * 4, edge_bytes=10**11)
    r = partition(g, 4, strategy="subgraph")
    assert r.devices_used == 1
    assert r.notes[-1] == "chose 1 device"


def test_memory_limit_is_met_by_spreading_the_branches():
    # each branch holds 2 x 0.5 GiB of parameters: 4 GiB with Adam; one device would need 16
    g = fork_join([1.0] * 4, param_bytes=GiB // 2)
    limit = 5 * GiB
    cl = flat_cluster(4, memory_bytes=limit)
    r = partition(g, 4, strategy="subgraph", memory_bytes=limit, cluster=cl)
    assert (r.peak_bytes <= limit).all() and r.devices_used == 4
    assert len({d[0] for d in branch_devices(g, r.assignment)}) == 4
    with pytest.raises(InfeasibleError) as e:
        partition(g, 2, strategy="subgraph", memory_bytes=limit, cluster=cl)
    assert e.value.min_devices == 4


def test_memory_repair_when_the_trunk_alone_is_too_big_for_one_device():
    # a heavy trunk tail (3 GiB of parameters = 12 GiB with Adam) plus branches of 4 GiB each
    g = fork_join([1.0] * 2, param_bytes=GiB // 2)
    params = g.param_bytes.copy()
    params[-1] = 3 * GiB
    g = g.replace(param_bytes=params)
    limit = 13 * GiB
    r = partition(g, 4, strategy="subgraph", memory_bytes=limit,
                  cluster=flat_cluster(4, memory_bytes=limit))
    assert (r.peak_bytes <= limit).all()
    assert r.assignment[-1] not in {r.assignment[i] for b in find_branches(g).regions[0].branches
                                    for i in b.tolist()}


def test_synthetic_transformer_one_head_per_device():
    g = make_transformer(400, seed=1)  # 8, 12 or 16 heads per layer
    heads = g.meta["heads"]
    r = partition(g, heads, strategy="subgraph",
                  cluster=flat_cluster(heads, memory_bytes=1e12, bandwidth=300e9,
                                       latency_s=5e-6))
    for region in find_branches(g).regions:
        devs = [set(r.assignment[b].tolist()) for b in region.branches]
        assert all(len(d) == 1 for d in devs) and len(set.union(*devs)) == heads
    one = emulate(g, np.zeros(g.num_nodes, np.int64))
    assert r.makespan_s < one.makespan_s


@pytest.fixture(scope="module")
def zoo_transformer():
    pytest.importorskip("torch")
    from outcore.cost.analytical import estimate
    from outcore.graph.capture import capture
    from outcore.zoo import resolve_model

    s = resolve_model("outcore:transformer:layers=2,heads=4", batch_size=2)
    return estimate(capture(s.build(), s.example_inputs), "a100")


def test_zoo_transformer_heads_on_four_devices(zoo_transformer):
    g = zoo_transformer
    r = partition(g, 4, strategy="subgraph")
    regions = find_branches(g).regions
    assert len(regions) == 2
    for region in regions:
        devs = [set(r.assignment[np.concatenate((b, f))].tolist())
                for b, f in zip(region.branches, region.feeders)]
        assert all(len(d) == 1 for d in devs) and len(set.union(*devs)) == 4
    one = emulate(g, np.zeros(g.num_nodes, np.int64))
    assert r.makespan_s < 0.8 * one.makespan_s
    assert r.makespan_s <= partition(g, 4, strategy="pardnn").makespan_s


# ------------------------------------------------------------------ properties
@st.composite
def dags(draw):
    n = draw(st.integers(1, 14))
    fwd = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0]), min_size=n, max_size=n))
    pairs = [(i, j) for j in range(n) for i in range(j)]
    chosen = sorted(draw(st.lists(st.sampled_from(pairs), unique=True,
                                  max_size=min(20, len(pairs)))) if pairs else [])
    eb = draw(st.lists(st.sampled_from([0, 10**3, 10**6, 10**8]), min_size=len(chosen),
                       max_size=len(chosen)))
    params = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    saved = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    return build("h", fwd_s=fwd, src=[p[0] for p in chosen], dst=[p[1] for p in chosen],
                 edge_bytes=eb, param_bytes=params, saved_bytes=saved)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=dags(), k=st.integers(1, 4), frac=st.sampled_from([None, 0.3, 0.6, 1.5]),
       mbs=st.sampled_from([1, 2]))
def test_every_node_placed_memory_respected_deterministic_never_slower(g, k, frac, mbs):
    cl = flat_cluster(k, memory_bytes=1e12, bandwidth=1e9, latency_s=1e-5)
    one = emulate(g, np.zeros(g.num_nodes, np.int64), cl, devices=k, microbatches=mbs)
    mem = None if frac is None else float(one.peak_bytes[0]) * frac
    try:
        r = partition(g, k, memory_bytes=mem, cluster=cl, strategy="subgraph", microbatches=mbs)
    except InfeasibleError as e:
        assert mem is not None and mem < one.peak_bytes[0]
        if e.min_devices is not None and e.min_devices <= 16:
            cl2 = flat_cluster(e.min_devices, memory_bytes=1e12, bandwidth=1e9, latency_s=1e-5)
            r2 = partition(g, e.min_devices, memory_bytes=mem, cluster=cl2,
                           strategy="subgraph", microbatches=mbs)
            assert (r2.peak_bytes <= mem).all()
        return
    a = r.assignment
    assert a.shape == (g.num_nodes,) and a.min() >= 0 and a.max() < r.devices_used <= k
    assert set(a.tolist()) == set(range(r.devices_used))
    if mem is not None:
        assert (r.peak_bytes <= mem).all()
    em = emulate(g, a, cl, devices=r.devices_used, microbatches=mbs)
    assert r.makespan_s == pytest.approx(em.makespan_s)
    if mem is None or one.peak_bytes[0] <= mem:
        assert r.makespan_s <= one.makespan_s * (1 + 1e-9)
    again = partition(g, k, memory_bytes=mem, cluster=cl, strategy="subgraph", microbatches=mbs)
    assert again.assignment.tolist() == a.tolist() and again.makespan_s == r.makespan_s


def test_data_parallel_ranking_spreads_the_trunks_parameters():
    # a trunk of four 1 GiB-parameter layers, then a two-way fork-join
    g = build("trunk", fwd_s=[1.0] * 8, src=[0, 1, 2, 3, 3, 4, 5, 6],
              dst=[1, 2, 3, 4, 5, 6, 6, 7], edge_bytes=[1000] * 8,
              param_bytes=[GiB] * 4 + [0] * 4)
    ctx = make_context(g, 4, cluster=flat_cluster(4, memory_bytes=1e12))
    alone, _, _ = subgraph.plan(ctx)
    assert np.bincount(alone.assignment[:4]).max() == 4  # the trunk stays together
    dp = subgraph.DataParallel(replicas=64, link=LinkSpec(1e9, 1e-6))
    best, notes, _ = subgraph.plan(ctx, dp=dp)
    own = np.bincount(best.assignment, weights=g.param_bytes.astype(float))
    assert own.max() <= 2 * GiB  # the trunk's layers spread over the group
    assert subgraph.allreduce_s(g, best.assignment, dp) + best.makespan_s < \
        subgraph.allreduce_s(g, alone.assignment, dp) + alone.makespan_s
    assert "ranked by makespan + all-reduce over 64 replicas" in notes


@pytest.mark.parametrize("family,cap", [("rnn", 0.5), ("nas", 0.3), ("transformer", 0.3)])
def test_memory_repair_order_needs_only_the_emulations_it_reads(family, cap, monkeypatch):
    """Step 5 repairs the placements over the limit fastest first while one could still win;
    it emulates one only when its floor (busiest device, critical path) says the order needs
    it, and repairs exactly the placements the eager rule (emulate all, sort) repairs."""
    from outcore.graph.generators import make
    from outcore.placers.emulate import run
    from outcore.placers.pardnn.memory import repair_memory

    g = make(family, 2500)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    ctx = make_context(g, 4, memory_bytes=cap * one)
    calls: list[list] = []
    real = subgraph._fit_lazily

    def spy(placed, known, dp, notes):
        out = real(placed, known, dp, notes)
        calls.append([placed, known, out])
        return out

    monkeypatch.setattr(subgraph, "_fit_lazily", spy)
    subgraph.plan(ctx)
    assert calls
    placed, known, out = calls[0]
    untimed = sum(not c.fits and not c.emulated for _, c in placed)
    assert untimed > 0 or family != "rnn"  # an RNN's layer stacks on one device: floors suffice
    # the eager rule: every placement over the limit timed, repaired fastest first while faster
    best = min([c.makespan_s for c in known + [c for _, c in placed] if c.fits], default=np.inf)
    repaired = []
    for sub, c in sorted((p for p in placed if not p[1].fits), key=lambda p: p[1].makespan_s):
        if c.makespan_s >= best:
            continue
        fixed, _ = repair_memory(sub, c.assignment)
        repaired.append(c.label)
        if sub.fits(sub.memory(fixed)):
            best = min(best, run(sub, fixed).makespan_s)
    lazy = [r.label.removesuffix(", memory repaired") for r in out
            if r.label.endswith("memory repaired")]
    assert repaired and sorted(lazy) == sorted(repaired)


def test_device_counts_that_cannot_hold_the_graph_are_not_placed():
    """SUPER, like ParDNN and the contiguous splits, skips a device count whose devices
    cannot hold the graph's memory floor: none of its placements could fit, even repaired."""
    from outcore.graph.generators import make
    from outcore.placers.feasibility import holds_floor

    g = make("nas", 2500)
    one = float(make_context(g, 1).memory(np.zeros(g.num_nodes, dtype=np.int64)).max())
    ctx = make_context(g, 4, memory_bytes=0.3 * one)
    assert holds_floor(ctx, 4) and not holds_floor(ctx, 2)
    best, notes, cands = subgraph.plan(ctx)
    assert "K=2: not tried, 2 devices cannot hold the graph's memory floor" in notes
    assert not any("K=2" in c.label for c in cands)
    assert any("K=4" in c.label for c in cands)
