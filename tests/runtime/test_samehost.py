"""The same-host transport (outcore.core.samehost) carries what gloo carries, and reports a
dead or silent peer instead of hanging.

Training: the same plan runs with messages on same-host sockets (the default for CPU workers on
one host) and with ``OUTCORE_P2P=gloo``; both must equal the plain single-process loop
(``helpers.reference``: losses and every parameter within 1e-5) and each must have used the
transport it names. Failures: two real processes connected by :func:`connect_same_host`; one
closes its end (what the kernel does when a process dies) or stays silent, and the other's
receive must fail with a message naming the peer, within its timeout.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from outcore.config import TrainConfig
from outcore.core.samehost import P2P_ENV, connect_same_host
from outcore.errors import RuntimeFailure
from outcore.runtime.launch import run_local
from outcore.runtime.worker import build_trainer
from tests.runtime.helpers import assert_matches, docs_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]


def _train(ctx, cfg, graph_doc, plan_doc):
    trainer, data = build_trainer(cfg, graph_doc, plan_doc, torch.device("cpu"))
    losses = []
    for step in range(cfg.run.steps):
        inputs, targets = data.batch(step)
        report = trainer.step(inputs, targets, track_memory=False)
        loss = torch.tensor([-1e30 if report.loss is None else report.loss],
                            dtype=torch.float64)
        dist.all_reduce(loss, op=dist.ReduceOp.MAX)  # the ranks that hold the loss agree
        losses.append(loss.item())
    links = trainer.messenger.links
    return {"rank": ctx.rank, "losses": losses, "links": sorted(links.socks) if links else [],
            "sum_on_links": trainer.messenger.sum_on_links,
            "state": {k: v.detach().clone() for k, v in trainer.named_params.items()}}


def _pingpong(g):
    """Five runs of nodes alternating between 2 ranks: many messages both ways, some packed."""
    return (np.arange(g.num_nodes) * 5 // g.num_nodes) % 2


@pytest.mark.parametrize("transport", ["samehost", "gloo"])
def test_transport_equals_single_process(transport, monkeypatch):
    monkeypatch.setenv(P2P_ENV, "gloo" if transport == "gloo" else "auto")
    cfg = TrainConfig.make(model="outcore:diamond", batch_size=8, microbatches=4, steps=3,
                           schedule="gpipe", optimizer="adam", lr=1e-3, track_memory=False)
    graph_doc, plan_doc, _ = docs_for(cfg, _pingpong, 2)
    results = run_local(_train, 2, (cfg, graph_doc, plan_doc), timeout_s=60)
    assert [r["links"] for r in results] == ([[1], [0]] if transport == "samehost" else [[], []])
    assert [r["sum_on_links"] for r in results] == [transport == "samehost"] * 2
    assert_matches(results, *reference(cfg), rtol=1e-5)


def _peer(ctx, mode: str):
    links = connect_same_host([1 - ctx.rank], timeout_s=2.0)
    assert links is not None and links.has(1 - ctx.rank)
    if ctx.rank == 1:
        links.send(0, [torch.arange(4.0)], tag=7)  # one good message first
        links.flush()
        if mode == "silent":
            time.sleep(6.0)  # alive, never sends the second message
        links.close()  # as the kernel does for a process that dies
        return None
    buf = torch.empty(4)
    links.recv_into(1, [buf], 7, "receiving the first message")
    assert buf.tolist() == [0.0, 1.0, 2.0, 3.0]
    t0 = time.monotonic()
    try:
        links.recv_into(1, [torch.empty(4)], 8, "receiving the second message")
    except RuntimeFailure as e:
        return {"error": str(e), "waited_s": time.monotonic() - t0}
    return {"error": None, "waited_s": time.monotonic() - t0}


@pytest.mark.parametrize("mode", ["closed", "silent"])
def test_dead_or_silent_peer_is_reported_not_hung(mode, monkeypatch):
    monkeypatch.delenv(P2P_ENV, raising=False)
    out = run_local(_peer, 2, (mode,), timeout_s=30)[0]
    assert out["error"] is not None, "the receive returned without the message"
    if mode == "closed":
        assert "rank 1 closed its same-host link" in out["error"]
        assert out["waited_s"] < 1.5
    else:
        assert "timed out after 2 s" in out["error"]
        assert 1.9 <= out["waited_s"] < 4.0


def test_receives_spin_only_when_every_worker_has_a_core(monkeypatch):
    """A receive polls before it blocks when the job's local workers each have a core of their
    own (the other processes' load counted), never on busy cores; the variable overrides."""
    from outcore.core.env import local_cores
    from outcore.core.samehost import SPIN_AUTO_US, SPIN_ENV, spin_s
    monkeypatch.delenv(SPIN_ENV, raising=False)
    monkeypatch.setenv("OUTCORE_HOST_LOAD", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_cores()))
    assert spin_s() == SPIN_AUTO_US * 1e-6
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_cores() + 1))
    assert spin_s() == 0.0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("OUTCORE_HOST_LOAD", str(local_cores()))
    assert spin_s() == 0.0
    monkeypatch.setenv(SPIN_ENV, "50")
    assert spin_s() == pytest.approx(50e-6)


def test_sends_the_kernel_cannot_take_at_once_arrive_whole_and_in_order():
    """Messages larger than the socket's buffer are queued and pushed in pieces (a send never
    blocks); the reader gets every byte, in the sender's order, with the right tags."""
    import socket
    import threading
    import time

    from outcore.core.samehost import SameHostLinks
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    tx, rx = SameHostLinks(0, {1: a}, 10.0), SameHostLinks(1, {0: b}, 10.0)
    try:
        msgs = [torch.arange(n, dtype=torch.float32) for n in (3, 3_000_000, 5, 2_000_000)]
        for k, m in enumerate(msgs):
            tx.send(1, [m, m[:2].clone()], k)
        assert tx.out[1] and tx.queued[1] > 0  # the kernel did not take it all
        got: list = []

        def read():
            for k, m in enumerate(msgs):
                bufs = [torch.empty_like(m), torch.empty(2)]
                rx.recv_into(0, bufs, k, lambda: "test message")
                got.append(bufs)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        t0 = time.monotonic()
        tx.flush()
        # a flush returns once the kernel has the last byte: before, when its last push
        # emptied the queue it slept in a select on no socket until the 10 s timeout
        assert time.monotonic() - t0 < 5.0
        reader.join(20)
        assert not reader.is_alive()
        assert tx.queued[1] == 0 and not tx.out[1]
        assert len(got) == len(msgs)
        for m, (whole, head) in zip(msgs, got):
            assert torch.equal(whole, m) and torch.equal(head, m[:2])
    finally:
        a.close()
        b.close()


def _chain3(g):
    """Three stages in order: the first and the last exchange no message."""
    return np.arange(g.num_nodes) * 3 // g.num_nodes


def test_every_rank_is_linked_for_the_step_sums(monkeypatch):
    """On one host each worker links to every other (not only its message peers), so that the
    per-step sum (the non-finite check with the loss) travels over the links; training still
    equals the single-process loop."""
    monkeypatch.delenv(P2P_ENV, raising=False)
    cfg = TrainConfig.make(model="outcore:mlp", batch_size=8, microbatches=2, steps=2,
                           schedule="1f1b", optimizer="sgd", lr=1e-2, track_memory=False)
    graph_doc, plan_doc, _ = docs_for(cfg, _chain3, 3)
    results = run_local(_train, 3, (cfg, graph_doc, plan_doc), timeout_s=90)
    assert [r["links"] for r in results] == [[1, 2], [0, 2], [0, 1]]
    assert all(r["sum_on_links"] for r in results)
    assert_matches(results, *reference(cfg), rtol=1e-5)


def _sums(ctx):
    from outcore.core.comm import _SUM_TAG
    links = connect_same_host(range(ctx.world_size), timeout_s=10.0)
    assert links is not None and sorted(links.socks) == [r for r in range(ctx.world_size)
                                                          if r != ctx.rank]
    mine = torch.tensor([0.1 * (ctx.rank + 1), float(ctx.rank == 2), 1e-17 * ctx.rank],
                        dtype=torch.float64)
    links.send((ctx.rank + 1) % ctx.world_size, [torch.arange(3.0)], 5)  # a data message first
    got = torch.empty(3)
    links.recv_into((ctx.rank - 1) % ctx.world_size, [got], 5, "the data message")
    out = links.sum_all(mine, _SUM_TAG, "the sum")
    ref = mine.clone()
    dist.all_reduce(ref)
    links.close()
    return {"sum": out.tolist(), "gloo": ref.tolist(), "data": got.tolist()}


def test_same_host_sum_equals_the_all_reduce_on_every_rank(monkeypatch):
    """The links' sum, after a data message on the same links, is the all-reduce's, and every
    rank gets the same bits (added in rank order)."""
    monkeypatch.delenv(P2P_ENV, raising=False)
    out = run_local(_sums, 3, (), timeout_s=60)
    for r in out:
        assert r["data"] == [0.0, 1.0, 2.0]
        assert r["sum"] == pytest.approx(r["gloo"], rel=1e-12, abs=1e-30)
        assert r["sum"] == out[0]["sum"]  # bit for bit
    assert out[0]["sum"][1] == 1.0
