"""Failures stop every worker in bounded time with an error naming the rank and step;
checkpoints are atomic and resuming gives exactly the losses of an uninterrupted run."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import psutil
import pytest

from outcore.config import TrainConfig
from outcore.errors import RuntimeFailure
from outcore.runtime import checkpoint
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import chunks, docs_for

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]


def _children() -> set[int]:
    """Child processes, without multiprocessing's own resource tracker (lives with us) and
    the fork server the suite keeps between launches (``tests/conftest.py``; a user's ends with
    each launch: ``tests/runtime/test_lifetime.py``)."""
    from multiprocessing import forkserver
    server = getattr(forkserver._forkserver, "_forkserver_pid", None)  # its workers count
    out = set()
    for c in psutil.Process().children(recursive=True):
        try:
            if c.pid != server and "resource_tracker" not in " ".join(c.cmdline()):
                out.add(c.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _run(cfg: TrainConfig, ranks: int = 2, timeout_s: float = 60):
    graph_doc, plan_doc, _ = docs_for(cfg, lambda g: chunks(g, ranks), ranks)
    return run_local(train_worker, ranks, (cfg, graph_doc, plan_doc), timeout_s=timeout_s)


@pytest.mark.parametrize("mode", ["raise", "exit", "hang"])
def test_a_failing_worker_stops_everyone(mode):
    before = _children()
    cfg = TrainConfig.make(model="outcore:mlp", batch_size=4, microbatches=2, steps=5,
                           fail_at_step=2, fail_rank=1, fail_mode=mode, timeout=8,
                           track_memory=False)
    start = time.monotonic()
    with pytest.raises(RuntimeFailure) as err:
        _run(cfg, timeout_s=8)
    elapsed = time.monotonic() - start
    assert elapsed < 60, f"took {elapsed:.0f} s to stop"
    msg = str(err.value)
    if mode == "raise":
        assert "rank 1" in msg and "injected failure at step 2" in msg
    elif mode == "exit":
        assert "rank 1" in msg or "worker 1" in msg
    else:  # the hung rank is silent; the rank waiting for it times out and says where
        assert "rank 0" in msg and "step 2" in msg and re.search(r"ranks? 1\b", msg.lower())
    time.sleep(0.5)
    leftover = {p for p in _children() - before if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
    assert not leftover, f"orphan worker processes: {leftover}"


def test_plan_for_other_world_size_is_a_clear_error():
    cfg = TrainConfig.make(model="outcore:mlp", batch_size=4, steps=1, track_memory=False)
    graph_doc, plan_doc, _ = docs_for(cfg, lambda g: chunks(g, 3), 3)
    with pytest.raises(RuntimeFailure, match="plan is for 3 devices but 2 processes"):
        run_local(train_worker, 2, (cfg, graph_doc, plan_doc), timeout_s=20)


def test_resume_gives_the_same_losses(tmp_path):
    """A run that crashes at step 5 and is resumed logs exactly the uninterrupted run's losses."""
    base = dict(model="outcore:diamond", batch_size=8, microbatches=2, steps=6, lr=1e-2,
                lr_schedule="cosine", track_memory=False)
    full = _run(TrainConfig.make(**base))[0]["losses"]
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    with pytest.raises(RuntimeFailure, match="injected failure at step 5"):
        _run(TrainConfig.make(**base, checkpoint_dir=str(ckpt), checkpoint_every=2, fail_at_step=5,
                              fail_rank=0, metrics_out=str(metrics)))
    assert checkpoint.latest(ckpt)[0] == 4
    resumed = _run(TrainConfig.make(**base, checkpoint_dir=str(ckpt), resume=True,
                                    metrics_out=str(metrics)))[0]["losses"]
    assert len(resumed) == 2
    np.testing.assert_allclose(resumed, full[4:], rtol=1e-6)
    logged = [json.loads(x) for x in metrics.read_text().splitlines()]
    # the crashed run logged steps 0-4; the resumed one replays step 4 from the checkpoint
    # after step 4 and drops the crashed run's line for it: each step once
    assert [m["step"] for m in logged] == [0, 1, 2, 3, 4, 5]
    np.testing.assert_allclose([m["loss"] for m in logged], full, rtol=1e-6)


def test_partial_checkpoint_is_never_picked(tmp_path):
    (tmp_path / "step_2").mkdir()
    (tmp_path / "step_2" / "COMPLETE").write_text("2")
    (tmp_path / "step_4.partial").mkdir()  # a crash while writing step 4
    (tmp_path / "step_6").mkdir()  # renamed but never marked complete: not trusted
    assert checkpoint.latest(tmp_path) == (2, tmp_path / "step_2")
    assert checkpoint.latest(tmp_path / "missing") is None


def test_metrics_file_has_one_object_per_step(tmp_path):
    out = tmp_path / "m.jsonl"
    cfg = TrainConfig.make(model="outcore:mlp", batch_size=8, microbatches=2, steps=3,
                           metrics_out=str(out))
    res = _run(cfg)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in lines:
        assert {"step", "loss", "step_s", "samples_per_s", "peak_bytes"} <= set(m)
        assert len(m["peak_bytes"]) == 2 and all(b > 0 for b in m["peak_bytes"])
        # the whole process (interpreter, torch, its tensors) against the tensors alone
        assert len(m["host_peak_bytes"]) == 2
        assert all(h > max(b, 50 * 2**20) for h, b in zip(m["host_peak_bytes"], m["peak_bytes"]))
        assert m["samples_per_s"] == pytest.approx(8 / m["step_s"])
    assert [m["loss"] for m in lines] == pytest.approx(res[0]["losses"])
    # when each record was written: after its step, so at least a step apart
    stamps = [m["time"] for m in lines]
    assert all(b - a >= m["step_s"] for a, b, m in zip(stamps, stamps[1:], lines[1:]))
    assert abs(stamps[-1] - time.time()) < 600
