"""The node-level emulator against timelines worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.errors import UsageError
from outcore.graph.ir import build
from outcore.hardware.spec import flat_cluster
from outcore.placers.context import make_context
from outcore.placers.emulate import emulate

# a link of 100 B/s and 0.5 s latency: a 100-byte tensor takes 0.5 + 1 = 1.5 s
SLOW = flat_cluster(2, memory_bytes=1e9, bandwidth=100.0, latency_s=0.5)


def diamond():
    """a -> b, a -> c, b -> d, c -> d; 100 bytes per edge."""
    return build("diamond", fwd_s=[1, 2, 3, 1], bwd_s=[2, 4, 6, 2], src=[0, 0, 1, 2],
                 dst=[1, 2, 3, 3], edge_bytes=[100] * 4, saved_bytes=[10, 20, 30, 40],
                 param_bytes=[1, 1, 1, 1])


def test_one_device_runs_everything_in_sequence():
    em = emulate(diamond(), np.zeros(4, np.int64), SLOW, devices=2)
    # forward a 0-1, b 1-3, c 3-6, d 6-7; backward from 7: d 7-9, then b and c are ready
    # together (the forward's order reversed, as the schedule builder runs backwards: c
    # first) c 9-15, b 15-19, a 19-21
    assert em.fwd_start_s[0].tolist() == [0, 1, 3, 6]
    assert em.fwd_end_s[0].tolist() == [1, 3, 6, 7]
    assert em.bwd_start_s[0].tolist() == [19, 15, 9, 7]
    assert em.bwd_end_s[0].tolist() == [21, 19, 15, 9]
    assert em.forward_s == 7 and em.makespan_s == 21
    assert em.busy_s.tolist() == [21, 0]


def test_cross_device_branch_pays_transfers_both_ways():
    em = emulate(diamond(), np.array([0, 0, 1, 0]), SLOW, devices=2)
    # forward: a 0-1 | b 1-3 | c on device 1 gets a's output at 1 + 1.5 = 2.5, runs 2.5-5.5
    #          d needs c's output at 5.5 + 1.5 = 7: 7-8
    # backward from 8: d 8-10 | b 10-14 | c gets d's gradient at 10 + 1.5 = 11.5: 11.5-17.5
    #          a needs b (14) and c's gradient at 17.5 + 1.5 = 19: 19-21
    assert em.fwd_start_s[0].tolist() == [0, 1, 2.5, 7]
    assert em.fwd_end_s[0].tolist() == [1, 3, 5.5, 8]
    assert em.bwd_start_s[0].tolist() == [19, 10, 11.5, 8]
    assert em.bwd_end_s[0].tolist() == [21, 14, 17.5, 10]
    assert em.makespan_s == 21
    assert em.busy_s.tolist() == [12, 9]
    # the chain that set the makespan: a, c, d forward, then d, c, a backward
    assert em.critical_path.tolist() == [[0, 0, 0], [0, 0, 2], [0, 0, 3],
                                         [1, 0, 3], [1, 0, 2], [1, 0, 0]]


def test_memory_peaks_at_end_of_forward_and_matches_model():
    em = emulate(diamond(), np.array([0, 0, 1, 0]), SLOW, devices=2, timeline=True)
    # device 0: 4 x (1 + 1 + 1) params + saved 10 + 20 + 40 + c's output 100
    #           + transient (largest output on it: 100)
    # device 1: 4 x 1 + saved 30 + a's output 100 + transient 100
    assert em.peak_bytes.tolist() == [12 + 70 + 100 + 100, 4 + 30 + 100 + 100]
    for dev, (t, y) in enumerate(em.memory):
        assert y.max() == em.peak_bytes[dev]
        assert y[-1] == y[0]  # everything allocated during the iteration is freed
    t0, y0 = em.memory[0]
    assert y0[np.searchsorted(t0, em.forward_s, side="right") - 1] == em.peak_bytes[0]


def test_two_microbatches_pipeline_through_a_cut():
    g = build("chain", fwd_s=[1, 2], bwd_s=[2, 4], src=[0], dst=[1], edge_bytes=[100],
              param_bytes=[10, 20], saved_bytes=[5, 7])
    em = emulate(g, np.array([0, 1]), SLOW, devices=2, microbatches=2, timeline=True)
    # forward: a0 0-1, a1 1-2 | b0 gets a0 at 2.5: 2.5-4.5 | b1 arrives 3.5, waits: 4.5-6.5
    # backward from 6.5: b0 6.5-10.5, b1 10.5-14.5 | a0 gradient at 12: 12-14 | a1 at 16: 16-18
    assert em.fwd_start_s.tolist() == [[0, 2.5], [1, 4.5]]
    assert em.bwd_end_s.tolist() == [[14, 10.5], [18, 14.5]]
    assert em.makespan_s == 18
    assert em.critical_path.tolist() == [[0, 0, 0], [0, 0, 1], [0, 1, 1],
                                         [1, 0, 1], [1, 1, 1], [1, 1, 0]]
    # device 1 holds both micro-batches' saved bytes and received tensors at once
    assert em.peak_bytes.tolist() == [40 + 2 * 5 + 100, 80 + 2 * (7 + 100) + 0]
    assert max(y.max() for _, y in em.memory[1:]) == em.peak_bytes[1]


def test_zero_durations_and_zero_byte_edges_cost_nothing():
    g = build("z", fwd_s=[0, 0, 0], bwd_s=[0, 0, 0], src=[0, 1], dst=[1, 2], edge_bytes=[0, 0])
    em = emulate(g, np.array([0, 1, 0]), SLOW, devices=2)
    assert em.makespan_s == 0.0
    g2 = g.replace(edge_bytes=np.array([100, 0]))
    em2 = emulate(g2, np.array([0, 1, 0]), SLOW, devices=2)
    assert em2.makespan_s == 3.0  # 1.5 s forward + 1.5 s gradient on the one paid edge


def test_single_node_and_empty_assignment_errors():
    g = build("one", fwd_s=[2.0], bwd_s=[3.0])
    em = emulate(g, np.zeros(1, np.int64))
    assert em.makespan_s == 5.0 and em.critical_path.tolist() == [[0, 0, 0], [1, 0, 0]]
    with pytest.raises(UsageError):
        emulate(g, np.zeros(2, np.int64))
    with pytest.raises(UsageError):
        emulate(g, np.array([-1]))


def test_slow_link_uses_fractional_bandwidth():
    link = flat_cluster(2, memory_bytes=1e9, bandwidth=0.3e9, latency_s=1e-5)
    g = build("c", fwd_s=[1e-3, 1e-3], bwd_s=[1e-3, 1e-3], src=[0], dst=[1], edge_bytes=[3e8])
    em = emulate(g, np.array([0, 1]), link, devices=2)
    comm = 1e-5 + 3e8 / 0.3e9  # 1.00001 s, not truncated to whole GB/s
    assert em.makespan_s == pytest.approx(4e-3 + 2 * comm)


def test_lower_bound_is_critical_path_or_average_work():
    g = diamond()
    ctx = make_context(g, 2)
    assert ctx.critical_path_s == 1 + 2 + 3 + 6 + 1 + 2  # a, c, d with backward
    assert ctx.lower_bound_s() == max(15, 21 / 2)
    ctx4 = make_context(g, 1, microbatches=4)
    assert ctx4.lower_bound_s() == 4 * 21


def test_port_contention_serialises_a_devices_sends():
    """``contend=True``: one outgoing and one incoming port per device, as the simulator has."""
    from outcore.placers.emulate import run
    # u (device 0) feeds v and x on device 1 and w on device 2; 100 bytes an edge: 1 s on the
    # port + 0.5 s latency
    g = build("fan", fwd_s=[1, 1, 1, 1], bwd_s=[1, 1, 1, 1], src=[0, 0, 0], dst=[1, 2, 3],
              edge_bytes=[100] * 3)
    a = np.array([0, 1, 2, 1])
    ctx = make_context(g, 3, cluster=flat_cluster(3, memory_bytes=1e9, bandwidth=100.0,
                                                  latency_s=0.5))
    free = run(ctx, a)
    # without contention every consumer has u's output at 1 + 1.5 = 2.5
    assert free.fwd_start_s[0].tolist() == [0, 2.5, 2.5, 3.5]
    busy = run(ctx, a, contend=True)
    # u's port sends to device 1 from 1 to 2 (v and x share it), then to device 2 from 2 to 3
    assert busy.fwd_start_s[0].tolist() == [0, 2.5, 3.5, 3.5]
    # backward from 4.5: x 4.5-5.5 and v 5.5-6.5 on device 1 (the later node first), w
    # 4.5-5.5 on device 2. w's gradient takes u's incoming port 5.5-6.5; v's and x's are
    # summed on device 1 and sent once, when v ends: 6.5-7.5, arriving 8 (a tensor crosses
    # once each way): u 8-9
    assert busy.bwd_start_s[0].tolist() == [8, 5.5, 4.5, 4.5]
    assert busy.makespan_s == 9 and free.makespan_s == 9


def test_contended_gradients_of_a_shared_tensor_cross_once_as_the_simulator_sends_them():
    """A weight on device 0 used at every step of a chain on device 1 (an RNN's cell weight):
    the contended emulation sends it over once and its summed gradient back once, as the
    simulator does; it charged one gradient per use (40 x here: an RNN grid's contended
    estimate was 10-40x its simulated time, and the search pruned such placements unseen)."""
    from outcore.placers.emulate import run
    from outcore.plan import make_plan
    from outcore.sim.simulate import simulate
    steps, wbytes = 40, 4_000_000
    src = [0] * steps + list(range(1, steps))
    dst = list(range(1, steps + 1)) + list(range(2, steps + 1))
    eb = [wbytes] * steps + [1000] * (steps - 1)
    g = build("shared", fwd_s=[0.0] + [1e-3] * steps, bwd_s=[0.0] + [2e-3] * steps, src=src,
              dst=dst, edge_bytes=eb, param_bytes=[wbytes] + [0] * steps)
    cluster = flat_cluster(2, memory_bytes=1e12, bandwidth=1e9, latency_s=1e-5)
    a = np.array([0] + [1] * steps)
    ctx = make_context(g, 2, cluster=cluster)
    contended = run(ctx, a, contend=True).makespan_s
    # forward 40 ms after the weight's 4 ms crossing, backward 80 ms, one 4 ms gradient back
    assert contended == pytest.approx(0.004 + 0.04 + 0.08 + 0.004, rel=0.01)
    sim = simulate(make_plan(g, a, strategy="test", devices=2, memory_bytes=None,
                             cluster=cluster), g, cluster=cluster)
    assert contended == pytest.approx(sim.iteration_s, rel=0.1)


def test_devices_run_ready_nodes_in_the_schedule_builders_order():
    """Among ready nodes a device runs the one with the fewest device boundaries upstream (then
    the earliest in topological order), as the schedule builder orders pieces, not the one
    ready first. Device 0 is busy with L until 3; q (behind p's message) was ready at 2.5, r2
    (after L) at 3: r2 runs first and its message to z leaves 2 s earlier."""
    from outcore.hardware.spec import flat_cluster as cluster
    from outcore.plan import make_plan
    from outcore.sim.simulate import simulate
    # 0 L -> 1 r2 -> 4 z (device 1); 2 p (device 1) -> 3 q (device 0); 100 bytes an edge
    g = build("order", fwd_s=[3, 1, 1, 2, 1], bwd_s=[1] * 5, src=[0, 1, 2], dst=[1, 4, 3],
              edge_bytes=[100] * 3)
    a = np.array([0, 0, 1, 0, 1])
    em = emulate(g, a, SLOW, devices=2)
    assert em.fwd_start_s[0].tolist() == [0, 3, 0, 4, 5.5]  # FIFO: q 3-5, r2 5-6, z 7.5
    slow = cluster(2, memory_bytes=1e9, bandwidth=100.0, latency_s=0.5)
    sim = simulate(make_plan(g, a, strategy="x", devices=2, memory_bytes=None, cluster=slow), g,
                   checked=False)
    pieces = sim.schedule.pieces
    ran = [pieces.pieces[x.piece].nodes for x in sim.schedule.actions[0] if x.op == "F"]
    assert ran == [(0, 1), (3,)]  # the simulator runs r2's piece before q's


def test_contended_emulation_charges_each_piece_its_runtime_cost_on_the_device():
    """The simulator costs a piece's forward ``fwd_overhead_s`` and backward ``bwd_overhead_s``
    more than its nodes, on its device; the planners' plain emulation sees that cost as half
    each way on the link instead. Chain a (device 0) -> b (device 1), 1 s a node each way,
    overheads 1 and 2 s, 100 bytes over 100 B/s and 0.5 s latency."""
    from dataclasses import replace

    from outcore.hardware.spec import flat_cluster as cluster
    from outcore.placers.emulate import run
    g = build("chain", fwd_s=[1, 1], bwd_s=[1, 1], src=[0], dst=[1], edge_bytes=[100])
    slow = cluster(2, memory_bytes=1e9, bandwidth=100.0, latency_s=0.5)
    slow = replace(slow, device=replace(slow.device, fwd_overhead_s=1.0, bwd_overhead_s=2.0,
                                        host_overlap=False))
    ctx = make_context(g, 2, cluster=slow)
    a = np.array([0, 1])
    # plain: a crossing costs 0.5 + 1.5 (half the overheads) + 1 s: a 0-1, b 4-5; b 5-6, a 9-10
    assert run(ctx, a).makespan_s == 10
    # contended: a 0-2 (with its overhead), message 2-3.5, b 3.5-5.5; backward b 5.5-8.5,
    # gradient 8.5-10, a 10-13
    em = run(ctx, a, contend=True)
    assert em.fwd_start_s[0].tolist() == [0, 3.5] and em.bwd_start_s[0].tolist() == [10, 5.5]
    assert em.makespan_s == 13


def _groups_by_definition(g, a, devices, edge_bytes):
    """The backward's gradient groups by their definition, with numpy: one group per (producer,
    consuming device) of a remote edge with bytes, numbered in that order."""
    rows = np.repeat(np.arange(g.num_nodes, dtype=np.int64), np.diff(g.pred_ptr))
    u = np.asarray(g.pred_idx, np.int64)
    eb = np.asarray(edge_bytes, np.int64)[np.asarray(g.pred_edge, np.int64)]
    remote = np.flatnonzero((a[rows] != a[u]) & (eb > 0))
    grp = np.full(u.size, -1, np.int64)
    keys, inverse = np.unique(u[remote] * devices + a[rows[remote]], return_inverse=True)
    grp[remote] = inverse
    nbytes = np.zeros(keys.size, np.int64)
    np.maximum.at(nbytes, inverse, eb[remote])
    return grp, np.bincount(inverse, minlength=keys.size), nbytes


@pytest.mark.parametrize("family", ["nas", "rnn", "unet", "transformer"])
def test_gradient_groups_follow_their_definition(family):
    from outcore.graph.generators import make
    from outcore.placers.emulate import _gradient_groups

    g = make(family, 1500)
    rng = np.random.default_rng(3)
    for devices in (2, 4):
        ctx = make_context(g, devices)
        for a in (rng.integers(0, devices, g.num_nodes),
                  np.arange(g.num_nodes) * devices // g.num_nodes,
                  np.zeros(g.num_nodes, np.int64)):
            # the context's bytes, and bytes that differ edge by edge (zeros among them)
            for eb in (ctx.edge_bytes, rng.integers(0, 4, g.num_edges) * 100):
                got = _gradient_groups(g, a, devices, eb)
                want = _groups_by_definition(g, a, devices, eb)
                for x, y in zip(got, want):
                    assert x.dtype == np.int64
                    np.testing.assert_array_equal(x, y)
            if not a.any():  # one device: nothing crosses
                assert got[1].size == 0 and (got[0] == -1).all()
