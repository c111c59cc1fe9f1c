"""The simulator against timelines computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.graph import build as gbuild
from outcore.hardware.cluster import from_dict as _cluster_from_dict
from outcore.hardware.spec import LinkSpec
from outcore.plan import make_plan
from outcore.sim import ring_allreduce_s, simulate
from outcore.sim.simulate import step_host_s


def two_stage(kind: str, **kw):
    # two nodes; the graph is one micro-batch: fwd 1 s, bwd 2 s, 1 B sent over a 2 B/s link
    # (0.5 s), 50 B of saved activations per node
    g = gbuild("two", fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0], src=[0], dst=[1], edge_bytes=[1],
               out_bytes=[0, 0], saved_bytes=[50, 50], batch_size=2)
    p = make_plan(g, np.array([0, 1]), strategy="manual", devices=2, memory_bytes=None,
                  microbatches=2, schedule=kind, cluster=flat_cluster_doc(
                      {"bandwidth": 2.0, "latency_s": 0.0}, 2))
    return simulate(p, g, **kw)


def spans(r, rank):
    return [(e.label, e.start_s, e.end_s) for e in r.timeline.events
            if e.rank == rank and e.kind in ("F", "B")]


def test_gpipe_by_hand():
    r = two_stage("gpipe")
    assert spans(r, 0) == [("0F0", 0, 1), ("0F1", 1, 2), ("0B0", 6, 8), ("0B1", 8, 10)]
    assert spans(r, 1) == [("1F0", 1.5, 2.5), ("1F1", 2.5, 3.5), ("1B0", 3.5, 5.5),
                           ("1B1", 5.5, 7.5)]
    assert r.iteration_s == 10
    # rank 1 holds both micro-batches' activations (50 B each) and received tensors (1 B each),
    # and during a backward the gradient it makes for its received input (1 B)
    assert r.peak_bytes[1] == pytest.approx(103)
    np.testing.assert_allclose(r.busy_s, [6, 6])
    np.testing.assert_allclose(r.comm_bytes, [2, 2])  # activations out, gradients back
    assert r.samples_per_s == pytest.approx(4 / 10)  # 2 micro-batches of 2 samples
    # the simulator shows the waits for messages as receive events on the comm lane
    waits = [(e.label, e.start_s, e.end_s) for e in r.timeline.events if e.kind == "recv"]
    assert ("t0RF0", 0.0, 1.5) in waits and ("t0RB0", 2.0, 6.0) in waits


def test_1f1b_by_hand():
    r = two_stage("1f1b")
    assert spans(r, 0) == [("0F0", 0, 1), ("0F1", 1, 2), ("0B0", 5, 7), ("0B1", 8, 10)]
    assert spans(r, 1) == [("1F0", 1.5, 2.5), ("1B0", 2.5, 4.5), ("1F1", 4.5, 5.5),
                           ("1B1", 5.5, 7.5)]
    assert r.iteration_s == 10
    # one micro-batch in flight on the last stage, and its input's gradient in the backward
    assert r.peak_bytes[1] == pytest.approx(53)
    # bubbles: rank 0 idles from 2 to 5 and from 7 to 8
    assert r.bubble_s[0] == pytest.approx(4)


def test_link_contention_serialises_messages():
    # one producer sends two 1-byte tensors to two consumers on the same rank: one port
    g = gbuild("fan", fwd_s=[1, 1, 1], bwd_s=[0, 0, 0], src=[0, 0], dst=[1, 2],
               edge_bytes=[1, 1], out_bytes=[0, 0, 0], saved_bytes=[0, 0, 0])
    p = make_plan(g, np.array([0, 1, 1]), strategy="manual", devices=2, memory_bytes=None,
                  cluster=flat_cluster_doc(
                      {"bandwidth": 1.0, "latency_s": 0.0}, 2))
    r = simulate(p, g, schedule="gpipe")
    f = {e.label: (e.start_s, e.end_s) for e in r.timeline.events if e.kind == "F"}
    # the two branches were cut into two pieces; the second message waits for the first
    starts = sorted(v[0] for k, v in f.items() if not k.startswith("0F"))
    assert starts == [2.0, 3.0]


def test_ring_allreduce_formula():
    link = LinkSpec(bandwidth=1e9, latency_s=1e-5)
    assert ring_allreduce_s(0, 8, link) == 0
    assert ring_allreduce_s(8e9, 1, link) == 0
    assert ring_allreduce_s(8e9, 8, link) == pytest.approx(14 * (1e-5 + 1.0))


def test_data_parallel_allreduce_overlaps_and_delays_the_step():
    g = gbuild("one", fwd_s=[1.0], bwd_s=[2.0], param_bytes=[4e9], out_bytes=[0],
               saved_bytes=[0], batch_size=1)
    p = make_plan(g, np.array([0]), strategy="manual", devices=1, memory_bytes=None,
                  cluster=flat_cluster_doc(
                      {"bandwidth": 1e9, "latency_s": 0.0, "mem_bandwidth": 1e20}, 1))
    one = simulate(p, g, dp=1)
    four = simulate(p, g, dp=4)
    assert one.iteration_s == pytest.approx(3.0)
    # ring over 4 replicas: 2 * 3 steps of 1e9 bytes at 1 GB/s after the backward
    assert four.iteration_s == pytest.approx(3.0 + 6.0)
    assert four.samples_per_s == pytest.approx(4 / 9.0)


def test_ranks_sharing_host_cores_slow_each_other_down():
    """Two independent 1-second computes on two ranks that share one core: both end at 2 s;
    with two cores, at 1 s (processor sharing, as local CPU workers on too few cores)."""
    from dataclasses import replace

    g = gbuild("two", fwd_s=[1.0, 1.0], bwd_s=[0.0, 0.0], out_bytes=[0, 0], saved_bytes=[0, 0],
               batch_size=1)
    p = make_plan(g, np.array([0, 1]), strategy="manual", devices=2, memory_bytes=None,
                  cluster=flat_cluster_doc(
                      {"bandwidth": 1e9, "latency_s": 0.0, "mem_bandwidth": 1e20}, 2))
    base = p.cluster_or_default()
    for cores, end in ((1, 2.0), (2, 1.0), (None, 1.0)):
        r = simulate(p, g, cluster=replace(base, host_cores=cores), schedule="gpipe")
        ends = sorted(e.end_s for e in r.timeline.events if e.kind == "F")
        assert ends == pytest.approx([end, end]), cores
    # unequal work: rank 0 has 1.5 s (two nodes, one piece), rank 1 has 1 s, one core shared
    g2 = gbuild("chain", fwd_s=[0.5, 1.0, 1.0], bwd_s=[0, 0, 0], src=[0], dst=[1],
                edge_bytes=[0], out_bytes=[0, 0, 0], saved_bytes=[0, 0, 0], batch_size=1)
    p2 = make_plan(g2, np.array([0, 0, 1]), strategy="manual", devices=2, memory_bytes=None,
                   cluster=flat_cluster_doc(
                      {"bandwidth": 1e9, "latency_s": 0.0, "mem_bandwidth": 1e20}, 2))
    r = simulate(p2, g2, cluster=replace(p2.cluster_or_default(), host_cores=1), schedule="gpipe")
    spans = {e.label: (e.start_s, e.end_s) for e in r.timeline.events if e.kind == "F"}
    # both run at half speed until rank 1 is done (1 s of work by t = 2); rank 0 has 0.5 s of
    # work left and finishes it alone at full speed
    assert spans["1F0"] == pytest.approx((0.0, 2.0))
    assert spans["0F0"] == pytest.approx((0.0, 2.5))


def test_a_cpu_worker_computes_cold_after_a_wait_and_warm_back_to_back():
    """On CPU workers (``DeviceSpec.cold_start_s``) a compute that starts after its rank waited
    (for a message, or for the step to begin) takes min(COLD_START_FRACTION x its time,
    cold_start_s) longer; one that follows another compute, or a message already there, does
    not. GPipe by hand with fwd 1 s, bwd 2 s, 0.5 s messages and 0.3 s to re-warm."""
    def run(host_is_device):
        g = gbuild("two", fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0], src=[0], dst=[1],
                   edge_bytes=[1], out_bytes=[0, 0], saved_bytes=[50, 50], batch_size=2)
        p = make_plan(g, np.array([0, 1]), strategy="manual", devices=2, memory_bytes=None,
                      microbatches=2, schedule="gpipe", cluster=flat_cluster_doc(
                          {"bandwidth": 2.0, "latency_s": 0.0, "cold_start_s": 0.3,
                           "host_is_device": host_is_device}, 2))
        return simulate(p, g)

    def close(got, want):
        assert [x[0] for x in got] == [x[0] for x in want]
        np.testing.assert_allclose([x[1:] for x in got], [x[1:] for x in want], atol=1e-9)

    r = run(True)
    h = step_host_s(flat_cluster_doc({"bandwidth": 2.0, "host_is_device": True}, 2), 2)
    assert h > 0  # a CPU rank's host work before its first action (the same on both)
    # rank 0 starts the step cold; its second forward follows its first
    close(spans(r, 0), [("0F0", h, h + 1.3), ("0F1", h + 1.3, h + 2.3),
                        ("0B0", h + 6.6, h + 8.9), ("0B1", h + 8.9, h + 10.9)])
    # rank 1 waits for its first message (arrives 1.8): cold; the second is there at 2.8
    close(spans(r, 1), [("1F0", h + 1.8, h + 3.1), ("1F1", h + 3.1, h + 4.1),
                        ("1B0", h + 4.1, h + 6.1), ("1B1", h + 6.1, h + 8.1)])
    assert r.iteration_s == pytest.approx(h + 10.9)
    # an accelerator's kernels do not run on the host core that waited: no re-warming, and
    # the host prepares the step while the device finishes the last
    assert run(False).iteration_s == pytest.approx(10)
    assert step_host_s(flat_cluster_doc({"bandwidth": 2.0}, 2), 2) == 0.0
    # more micro-batches to split, more host work
    cpu = flat_cluster_doc({"bandwidth": 2.0, "host_is_device": True}, 2)
    assert step_host_s(cpu, 8) > step_host_s(cpu, 1)


def flat_cluster_doc(doc, devices):
    """A flat cluster from a plan's (outcore-plan/1) cluster record."""
    return _cluster_from_dict(doc, devices=devices, memory_bytes=None)


def test_step_sync_waits_for_every_rank_then_one_collective():
    """The runtime's non-finite check is one all-reduce per step at OPT: no rank steps its
    optimizer before every rank has reached OPT, and the all-reduce costs 2 ceil(lg p)
    collective latencies (the link's collective latency, not its message latency)."""
    from outcore.hardware.cluster import make_cluster, to_dict
    g = gbuild("two", fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0], src=[0], dst=[1], edge_bytes=[1],
               out_bytes=[0, 0], saved_bytes=[50, 50], batch_size=2)

    def run(collective):
        cl = make_cluster(2, bandwidth=2.0, latency=0.0, collective_latency=collective)
        p = make_plan(g, np.array([0, 1]), strategy="manual", devices=2, memory_bytes=None,
                      microbatches=2, schedule="gpipe",
                      cluster=flat_cluster_doc(to_dict(cl), 2))
        r = simulate(p, g)
        opt = {e.rank: e.start_s for e in r.timeline.events if e.kind == "optim"}
        return r, opt

    plain, opt0 = run(None)       # latency 0: the sync is free; rank 1 steps at ~7.5 s
    assert opt0[1] == pytest.approx(7.5, abs=1e-2) and opt0[0] == pytest.approx(10, abs=1e-2)
    synced, opt1 = run(0.25)      # both wait for rank 0 (~10 s), then 2 x 0.25 s
    assert opt1[0] == opt1[1] == pytest.approx(opt0[0] + 0.5)
    assert synced.iteration_s == pytest.approx(plain.iteration_s + 0.5)
    # point-to-point messages keep the link's own latency (0): the compute spans are unchanged
    assert spans(synced, 0) == spans(plain, 0) and spans(synced, 1) == spans(plain, 1)


def test_collective_latency_round_trips_and_prices_data_parallel():
    from outcore.hardware.cluster import from_dict, make_cluster, to_dict
    from outcore.hardware.collectives import dp_allreduce
    cl = make_cluster(4, bandwidth="1GB/s", latency="20us", collective_latency="100us")
    back = from_dict(to_dict(cl), devices=4, memory_bytes=None)
    assert back.intra.collective_latency_s == pytest.approx(1e-4)
    assert back.intra.latency_s == pytest.approx(2e-5)
    plain = make_cluster(4, bandwidth="1GB/s", latency="20us")
    assert "collective_latency_s" not in to_dict(plain)["intra"]
    # a 4-copy ring all-reduce of 1 MB: 6 steps, each paying the collective latency
    slow = dp_allreduce(back, 1, 4, 0, 1e6, "ring").total_s
    fast = dp_allreduce(plain, 1, 4, 0, 1e6, "ring").total_s
    assert slow - fast == pytest.approx(6 * (1e-4 - 2e-5))
    # a link given explicitly (the simulator's dp_link) is priced as collectives see it too
    assert dp_allreduce(back, 1, 4, 0, 1e6, "ring", link=back.intra).total_s == \
        pytest.approx(slow)


def test_sent_gradients_are_held_only_where_the_transport_keeps_them():
    """gloo and NCCL sends complete at the step's end, so the runtime keeps every gradient a
    rank sent until then; same-host sockets copy a message out in the send call."""
    from outcore.hardware.cluster import make_cluster, to_dict
    g = gbuild("two", fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0], src=[0], dst=[1], edge_bytes=[40],
               out_bytes=[0, 0], saved_bytes=[50, 50], batch_size=2)

    def peaks(copy_on_send):
        cl = make_cluster(2, bandwidth=2.0, latency=0.0, copy_on_send=copy_on_send)
        p = make_plan(g, np.array([0, 1]), strategy="manual", devices=2, memory_bytes=None,
                      microbatches=4, schedule="1f1b", cluster=flat_cluster_doc(to_dict(cl), 2))
        return simulate(p, g).peak_bytes

    held, copied = peaks(False), peaks(True)
    # the last stage: one micro-batch in flight (50 saved + 40 received), the gradient its
    # backward makes for the received input (40) and the next one's receive buffer (posted
    # three actions ahead: RF F B SB RF); on gloo also the gradients it already sent back:
    # 2 x 40 while the third micro-batch runs, 3 x 40 during the last (which has no next buffer)
    assert copied[1] == pytest.approx(170)
    assert held[1] == pytest.approx(max(170 + 2 * 40, 130 + 3 * 40))
    assert copied[0] == held[0]


def testbackward_working_memory_counts_what_the_backward_has_not_freed_yet():
    from outcore.schedule.backward import backward_working
    g = gbuild("chain", fwd_s=[1.0] * 3, bwd_s=[1.0] * 3, src=[0, 1], dst=[1, 2],
               edge_bytes=[10, 20], out_bytes=[10, 20, 5], saved_bytes=[10, 20, 5])
    # from the last node: 2 makes its input's gradient (20; its own output's gradient is the
    # piece's, received); 1 holds its output's and input's gradients (20 + 10) with node 2's
    # 5 saved bytes freed; 0 has freed 25 and holds 10
    assert backward_working(g, np.zeros(3, dtype=np.int64), 1).tolist() == [25.0]
    # one piece per node: only the gradient each makes for its input from the piece before
    assert backward_working(g, np.arange(3), 3).tolist() == [0.0, 10.0, 20.0]


def test_an_output_with_two_consumers_holds_two_gradients_while_they_are_summed():
    from outcore.schedule.backward import backward_working
    # 0 -> 1, 0 -> 2, 1 -> 3, 2 -> 3 (a block whose input feeds two branches), nothing saved
    g = gbuild("fork", fwd_s=[1.0] * 4, bwd_s=[1.0] * 4, src=[0, 0, 1, 2], dst=[1, 2, 3, 3],
               edge_bytes=[100, 100, 10, 10], out_bytes=[100, 10, 10, 5],
               saved_bytes=[0, 0, 0, 0])
    # node 0: the gradient from 1 and the one from 2, added into it in place (2 x 100); no
    # input. Node 1, whose backward runs after 2's: 2's gradient for 0 waits while 1 holds
    # its output's gradient and makes its own for 0 (100 + 10 + 100)
    assert backward_working(g, np.zeros(4, dtype=np.int64), 1).tolist() == [210.0]
    # 2 in another piece: the gradient it returns is held as that piece's input gradient (the
    # simulator counts it there), so node 0 adds the one arriving from 1 (100), less than
    # node 1 holding its output's gradient while it makes its input's (10 + 100); node 2's
    # piece makes only its input's gradient, held as such
    assert backward_working(g, np.array([0, 0, 1, 0]), 2).tolist() == [110.0, 100.0]


def test_a_checkpointed_piece_keeps_each_input_once_and_not_what_its_producer_holds():
    from outcore.plan.pieces import cut
    from outcore.schedule.costs import piece_costs
    # 0 -> 1 -> 2 -> 3 and 1 -> 3; 0 saves its output (a ReLU), 1 and 2 save nothing of
    # their own; pieces {0}, {1}, {2, 3} (policy groups), the last two checkpointed
    g = gbuild("kept", fwd_s=[1.0] * 4, bwd_s=[1.0] * 4, src=[0, 1, 2, 1], dst=[1, 2, 3, 3],
               edge_bytes=[100, 30, 7, 30], out_bytes=[100, 30, 7, 5],
               saved_bytes=[100, 0, 0, 2])
    pieces = cut(g, np.zeros(4, dtype=np.int64), np.array([0, 1, 2, 2]))
    pol = ("none", "checkpoint", "checkpoint")
    c = piece_costs(g, pieces, 1, policies=pol)
    p1, p2 = int(pieces.piece_of[1]), int(pieces.piece_of[2])
    # {1} keeps 0's output, which 0 holds as its saved output: nothing more; {2, 3} keeps 1's
    # output (30), taken by its two nodes but one tensor
    assert c.saved_bytes[p1] == 0.0 and c.saved_bytes[p2] == 30.0
    # on a CPU device each also keeps the generator state torch.utils.checkpoint saves for
    # its recompute, in host memory, which is the device's
    import torch

    from outcore.schedule.costs import CPU_RNG_STATE_BYTES
    assert CPU_RNG_STATE_BYTES == torch.get_rng_state().numel()
    cpu = piece_costs(g, pieces, 1, policies=pol, host_is_device=True)
    assert cpu.saved_bytes[p1] == CPU_RNG_STATE_BYTES
    assert cpu.saved_bytes[p2] == 30.0 + CPU_RNG_STATE_BYTES
    # the recompute of {2, 3} brings back its 2 saved bytes (none of them an input it keeps),
    # then its backward works as the plain piece's would (and at least one working buffer:
    # its largest output, node 2's 7 B; the inputs it keeps are counted as saved)
    plain = piece_costs(g, pieces, 1)
    assert c.bwd_transient[p2] == pytest.approx(2.0 + max(7.0, plain.bwd_transient[p2]))
    # a plain piece's forward holds what its earlier layers saved beside a layer's inputs and
    # output: node 3 reads 1's 30 B and 2's 7 B and makes 5 B
    assert plain.transient_bytes[p2] == pytest.approx(30.0 + 7.0 + 5.0)


def test_gradients_exist_from_a_piece_s_first_backward_until_the_optimizer_has_stepped():
    """Adam keeps weights, two moments and (during the step) gradients: the gradients appear at
    each piece's first backward of the step and go when the optimizer has stepped (the runtime
    clears them); its multi-tensor step holds one temporary the size of the parameters."""
    from outcore.sim.simulate import ADAM_WORKING
    g = gbuild("p", fwd_s=[1.0, 1.0], bwd_s=[1.0, 1.0], src=[0], dst=[1], edge_bytes=[1],
               out_bytes=[0, 0], saved_bytes=[50, 50], param_bytes=[100, 0], batch_size=2)
    p = make_plan(g, np.array([0, 0]), strategy="manual", devices=1, memory_bytes=None,
                  microbatches=2, optimizer="adam",
                  cluster=flat_cluster_doc({"bandwidth": 2.0, "latency_s": 0.0}, 1))
    r = simulate(p, g)
    times, held = r.timeline.memory[0]
    assert held[0] == pytest.approx(300)  # weights and moments; no gradients yet
    (opt,) = [e for e in r.timeline.events if e.kind == "optim"]
    during = held[np.searchsorted(times, opt.start_s, side="right") - 1]
    assert during == pytest.approx(400 + ADAM_WORKING * 100)  # gradients and the temporary
    assert held[-1] == pytest.approx(300)  # cleared after the step
    # the first backward leaves the gradients; the second micro-batch's backward holds them,
    # its saved activations (the later node's 50 B freed once its backward has run) and, while
    # the weighted node's backward runs, its fresh 100 B weight gradient
    (b0,) = [e for e in r.timeline.events if e.label == "0B0"]
    (f1,) = [e for e in r.timeline.events if e.label == "0F1"]
    after = held[np.searchsorted(times, b0.end_s, side="right") - 1]
    # (the next forward starts as B0 ends: it holds node 0's saved 50 B and the 1 B it reads)
    assert after == pytest.approx(400 + (51 if f1.start_s == b0.end_s else 0))
    assert r.peak_bytes[0] == pytest.approx(400 + 2 * 50 - 50 + 100) == max(held)


def test_the_runtime_s_loss_keeps_a_tensor_the_size_of_the_output_until_its_backward():
    """Cross-entropy saves the log-probabilities, MSE the difference: the piece holding the
    model's output holds that many more bytes from its forward to its backward."""
    from outcore.schedule.lower import lower
    g = gbuild("head", fwd_s=[1.0, 1.0], bwd_s=[1.0, 1.0], src=[0], dst=[1],
               edge_bytes=[1000], out_bytes=[1000, 1000], saved_bytes=[10, 0],
               ops=["linear", "output"], batch_size=2)
    p = make_plan(g, np.array([0, 0]), strategy="manual", devices=1, memory_bytes=None,
                  cluster=flat_cluster_doc({"bandwidth": 2.0, "latency_s": 0.0}, 1))
    assert lower(g, p).costs.saved_bytes.tolist() == [10 + 1000]


def test_a_schedule_the_search_does_not_check_simulates_the_same():
    """The search skips the schedule check on the placements it only compares: that must
    change nothing the simulator predicts (the check only raises)."""
    from outcore.graph.generators import make
    from outcore.placers import partition

    g = make("nas", 200, seed=3)
    result = partition(g, 3, strategy="pardnn")
    p = make_plan(g, result.assignment, strategy="pardnn", devices=3, memory_bytes=None,
                  microbatches=2)
    a, b = simulate(p, g), simulate(p, g, checked=False)
    assert a.iteration_s == b.iteration_s and list(a.peak_bytes) == list(b.peak_bytes)
    assert a.iteration_s > 0


def test_a_weights_gradient_is_counted_once_through_its_views():
    """torch.export captures a parameter as a node of its own: its gradient is an edge into
    its consumer (counted there, not again as the layer's fresh gradient), and a view of it
    (the transposed weight) makes no second gradient (hf:mixtral's expert weights: 512 KiB
    counted three times put a backward 0.85 MiB over the measured peak)."""
    from outcore.plan.pieces import cut
    from outcore.schedule.backward import backward_working
    from outcore.schedule.costs import piece_costs
    # w (param, 400 B) -> transpose -> matmul <- x (40 B); the matmul's output 40 B
    g = gbuild("w", fwd_s=[0.0, 0.0, 1.0, 1.0], src=[0, 1, 3], dst=[1, 2, 2],
               edge_bytes=[400, 400, 40], out_bytes=[400, 400, 40, 40],
               saved_bytes=[0, 0, 0, 0], param_bytes=[400, 0, 0, 0],
               ops=["param", "transpose", "matmul", "input"])
    one = np.zeros(4, dtype=np.int64)
    # the matmul makes its inputs' gradients (the largest, 400; its output's is the loss's);
    # the transpose holds its output's gradient (400) and makes none: a view of it (800 before)
    assert backward_working(g, one, 1).tolist() == [400.0]
    costs = piece_costs(g, cut(g, one), 1)
    assert costs.bwd_transient.tolist() == [400.0]  # no second 400 for the fresh gradient


def test_a_pair_sum_reads_the_peers_bucket_while_the_step_waits():
    """Two data-parallel copies on one host sum their gradient bucket over their own link
    (runtime.comm.PairSum): the peer's half is read into a buffer of the bucket's size while
    the step waits; over gloo (no same-host link) it is not. The gradients went into the flat
    bucket at the all-reduce (its copy made then: the peak either way)."""
    from outcore.hardware.cluster import make_cluster, to_dict
    from outcore.plan.layout import Layout
    g = gbuild("one", fwd_s=[1.0], bwd_s=[2.0], param_bytes=[400], out_bytes=[0],
               saved_bytes=[0], batch_size=2, attrs=[{"params": ["w"]}])

    def peaks(copy_on_send):
        cl = make_cluster(2, bandwidth=2.0, latency=0.0, copy_on_send=copy_on_send)
        p = make_plan(g, np.array([0]), strategy="manual", devices=2, memory_bytes=None,
                      layout=Layout.replicate("mp", 1, 1, 2), optimizer="sgd",
                      cluster=flat_cluster_doc(to_dict(cl), 2))  # (SGD: no step temporary)
        r = simulate(p, g)
        times, held = r.timeline.memory[0]
        (opt,) = [e for e in r.timeline.events if e.kind == "optim" and e.rank == 0]
        at = held[(times >= opt.start_s - 1e-12) & (times <= opt.start_s + 1e-12)]
        before = held[np.searchsorted(times, opt.start_s - 1e-12) - 1]
        return r.peak_bytes, (at.max() if at.size else before) - before

    (gloo, gloo_wait), (pair, pair_wait) = peaks(False), peaks(True)
    assert pair_wait == pytest.approx(400) and gloo_wait == 0  # the peer's half, read
    np.testing.assert_allclose(pair, gloo)


def test_a_pair_sum_is_priced_as_one_message_each_way_at_any_worker_count():
    """A bucket two copies alone hold is summed over their same-host link (one message each
    way at once: the link's latency, a send's and a receive's host time, the bytes), on two
    workers or as one of the pairs of four (dp 2 x 2 stages); over gloo (no such link) it is
    the backend's ring all-reduce at the collective latency."""
    from outcore.hardware.cluster import make_cluster, to_dict
    from outcore.plan.layout import Layout
    g = gbuild("one", fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0], param_bytes=[400, 400],
               out_bytes=[8, 8], saved_bytes=[0, 0], src=[0], dst=[1], edge_bytes=[8],
               batch_size=2, attrs=[{"params": ["w0"]}, {"params": ["w1"]}])

    def sums(devices, stages, copy_on_send):
        cl = make_cluster(devices, bandwidth=100.0, latency=0.5, collective_latency=3.0,
                          copy_on_send=copy_on_send, message_overhead_s=(0.25, 0.125))
        a = np.array([0, 1 if stages == 2 else 0])
        p = make_plan(g, a, strategy="manual", devices=devices, memory_bytes=None,
                      layout=Layout.replicate("mp", stages, 1, 2),
                      cluster=flat_cluster_doc(to_dict(cl), devices))
        events = simulate(p, g).timeline.events
        return sorted({round(e.end_s - e.start_s, 9) for e in events if e.kind == "allreduce"})

    pair = 0.5 + 0.25 + 0.125 + 400 / 100.0  # a bucket of one layer's 400 bytes
    assert sums(2, 1, True) == [pytest.approx(0.5 + 0.375 + 800 / 100.0)]  # both layers' 800
    assert sums(4, 2, True) == [pytest.approx(pair)]
    ring = 2 * (3.0 + 400 / 2 / 100.0)
    assert sums(4, 2, False) == [pytest.approx(ring)]


def test_a_search_simulates_an_identical_plan_once():
    """Within ``remembered()``, the same placement of the same graph under another memory limit
    is the same simulation (its fit judged against the new limit); another placement, schedule
    or graph is simulated afresh."""
    from outcore.sim.simulate import remembered

    g = gbuild("two", fwd_s=[1.0, 1.0], bwd_s=[2.0, 2.0], src=[0], dst=[1], edge_bytes=[1],
               out_bytes=[0, 0], saved_bytes=[50, 50], batch_size=2)
    cl = flat_cluster_doc({"bandwidth": 2.0, "latency_s": 0.0}, 2)

    def plan(a, memory=None, schedule="1f1b", graph=g):
        return make_plan(graph, np.array(a), strategy="manual", devices=2, memory_bytes=memory,
                         microbatches=2, schedule=schedule, cluster=cl)

    with remembered() as memo:
        first = simulate(plan([0, 1]), g)
        tight = simulate(plan([0, 1], memory=60), g)
        assert memo.hits == 1 and tight.timeline is first.timeline
        assert first.fits and not tight.fits  # the peak is 102 B on rank 1
        simulate(plan([1, 0]), g)
        simulate(plan([0, 1], schedule="gpipe"), g)
        other = g.replace(fwd_s=np.array([2.0, 2.0]))
        assert simulate(plan([0, 1], graph=other), other).iteration_s > first.iteration_s
        assert memo.hits == 1
    assert simulate(plan([0, 1]), g).timeline is not first.timeline  # outside: none kept


def test_a_rank_s_next_compute_is_not_ended_by_a_stale_rate_change():
    """Shared cores: a compute rescheduled earlier (another rank finished) leaves its older
    end queued; the rank's next compute must not take that end for its own (it did: rank 2's
    last backward below ended at 10.2 s). Three ranks on one core, four independent nodes,
    worked by hand: rank 0 runs F 0.1 s then B 2.2 s, rank 1 F 0.6 s then B 2.7 s, rank 2
    two pieces, F 0.2 s and 1.6 s, then B 1.6 s and 1.8 s; each runs at 1/3 speed while three
    run, 1/2 while two do."""
    from dataclasses import replace

    g = gbuild("four", fwd_s=[0.6, 0.2, 0.1, 1.6], bwd_s=[2.7, 1.8, 2.2, 1.6],
               out_bytes=[0] * 4, saved_bytes=[0] * 4, batch_size=1)
    p = make_plan(g, np.array([1, 2, 0, 2]), strategy="manual", devices=3, memory_bytes=None,
                  cluster=flat_cluster_doc(
                      {"bandwidth": 1e9, "latency_s": 0.0, "mem_bandwidth": 1e20}, 3))
    r = simulate(p, g, cluster=replace(p.cluster_or_default(), host_cores=1), schedule="gpipe")
    spans = {e.label: (e.start_s, e.end_s) for e in r.timeline.events if e.kind in ("F", "B")}
    expected = {"2F0": (0.0, 0.3), "1F0": (0.0, 0.6), "0F0": (0.0, 1.8), "3F0": (0.6, 5.4),
                "2B0": (0.3, 6.9), "0B0": (1.8, 8.9), "3B0": (5.4, 9.0), "1B0": (9.0, 10.8)}
    for label, span in expected.items():
        assert spans[label] == pytest.approx(span), label
    assert r.iteration_s == pytest.approx(10.8)


def test_an_output_waiting_for_a_later_piece_of_its_rank_is_held_until_that_piece_runs():
    """A bias table gathered in a piece of its own (TinyViT's attention biases) is made before
    the piece that reads it and waits, whatever runs on the rank between: rank 1's first
    piece {1, 2} gathers 1000 B per micro-batch from a weight, which its second piece {3, 4}
    reads after its input from rank 0 arrives."""
    from outcore.plan.pieces import cut
    from outcore.schedule.costs import piece_costs
    from outcore.schedule.waiting import waiting_outputs
    # 0 (rank 0, 5 s) -> 3; 1 (a weight) -> 2 (the table) -> 3 (adds it, saves nothing) -> 4
    g = gbuild("wait", fwd_s=[5.0, 1.0, 1.0, 1.0, 1.0], bwd_s=[1.0] * 5, src=[0, 1, 2, 3],
               dst=[3, 2, 3, 4],
               edge_bytes=[10, 40, 1000, 10], out_bytes=[10, 40, 1000, 10, 10],
               saved_bytes=[0, 0, 0, 0, 10], ops=["linear", "param", "index", "add", "linear"])
    device = np.array([0, 1, 1, 1, 1])
    pieces = cut(g, device)
    p1, p2 = int(pieces.piece_of[2]), int(pieces.piece_of[3])
    assert p1 != p2 and pieces.device_of[p1] == pieces.device_of[p2] == 1
    held = waiting_outputs(g, pieces, g.out_bytes.astype(float))
    assert held[p1] == 1000.0 and held[p2] == -1000.0 and held.sum() == 0.0
    assert piece_costs(g, pieces, 2).fwd_held[p1] == 1000.0
    p = make_plan(g, device, strategy="manual", devices=2, memory_bytes=None, microbatches=2,
                  schedule="gpipe", cluster=flat_cluster_doc({"bandwidth": 1e9,
                                                              "latency_s": 0.0}, 2))
    r = simulate(p, g)
    times, level = r.timeline.memory[1]
    for mb in (0, 1):  # the table waits from its piece's forward to the reader's
        made = min(e.end_s for e in r.timeline.events if e.label == f"{p1}F{mb}")
        read = min(e.start_s for e in r.timeline.events if e.label == f"{p2}F{mb}")
        assert made < read
        # the level after everything at each moment between them (1000 B, plus the 10 B
        # received and the 10 B saved of the micro-batch before)
        moments = np.unique(np.r_[times[(times > made) & (times < read)], made])
        between = level[np.searchsorted(times, moments, side="right") - 1]
        assert between.min() >= 1000.0, (mb, between)


def test_a_received_tensor_handed_on_is_not_held_as_waiting():
    """A tensor from another rank crosses once, to its first reader there, which hands it on
    to the next: it is held as received (the simulator counts it so), not as an output of the
    rank that made it waiting for a piece of the other rank (the LM pipeline's rank 1 was
    predicted 32 KiB under what it measured when it was)."""
    from outcore.plan.pieces import cut
    from outcore.schedule.waiting import waiting_outputs
    # 0 (rank 0) -> 1, 2 (rank 1, pieces of their own) -> 3
    g = gbuild("relay", fwd_s=[1.0] * 4, bwd_s=[1.0] * 4, src=[0, 0, 1, 2], dst=[1, 2, 3, 3],
               edge_bytes=[100, 100, 10, 10], out_bytes=[100, 10, 10, 10],
               saved_bytes=[0, 0, 0, 10], ops=["linear", "relu", "relu", "add"])
    pieces = cut(g, np.array([0, 1, 1, 1]), np.array([0, 1, 2, 2]))
    assert [(t.src, t.dst, t.local) for t in pieces.transfers][:2] == [(0, 1, False),
                                                                         (1, 2, True)]
    held = waiting_outputs(g, pieces, g.out_bytes.astype(float))
    assert held.tolist() == [0.0, 10.0, 10.0, -20.0]


def test_a_tuple_crosses_to_another_piece_whole():
    """The executor sends a producer's value as it is: a split's three parts cross when a
    piece on another rank reads one of them (tinyvit's q, k and v: 0.72 MiB, counted 0.24)."""
    from outcore.plan.pieces import cut
    t = gbuild("split", fwd_s=[1.0] * 3, bwd_s=[1.0] * 3, src=[0, 1], dst=[1, 2],
               edge_bytes=[30, 10], out_bytes=[30, 30, 10], saved_bytes=[0, 0, 0],
               ops=["linear", "split", "getitem"])
    assert cut(t, np.array([0, 0, 1])).transfer_bytes.tolist() == [30]
    plain = gbuild("plain", fwd_s=[1.0] * 3, bwd_s=[1.0] * 3, src=[0, 1], dst=[1, 2],
                   edge_bytes=[30, 10], out_bytes=[30, 30, 10], saved_bytes=[0, 0, 0],
                   ops=["linear", "linear", "relu"])
    assert cut(plain, np.array([0, 0, 1])).transfer_bytes.tolist() == [10]
