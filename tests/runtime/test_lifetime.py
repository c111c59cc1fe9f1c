"""Nothing left behind, nobody let in: workers end with the main process whatever signal ends
it, SIGTERM/SIGHUP stop a run like Ctrl-C, local workers open no socket off loopback, and a
checkpoint folder has one writer at a time."""

from __future__ import annotations

import glob
import ipaddress
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from outcore.config import TrainConfig
from outcore.errors import CheckpointError, RuntimeFailure
from outcore.runtime import ckpt_trust, launch
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import chunks, docs_for

pytestmark = [pytest.mark.dist, pytest.mark.timeout(180)]


def sleeper(ctx, piddir: str) -> None:
    """Worker: say who it is, then wait (the main process gets signalled meanwhile)."""
    Path(piddir, f"rank{ctx.rank}").write_text(str(os.getpid()))
    time.sleep(120)


def listeners(ctx) -> list[tuple[str, int, str]]:
    """Worker: talk to every other rank (collective and point-to-point), then list this
    process's listening TCP sockets and bound UDP sockets."""
    import torch
    import torch.distributed as dist
    x = torch.ones(4)
    dist.all_reduce(x)
    peer = (ctx.rank + 1) % ctx.world_size
    send = dist.isend(torch.full((3,), float(ctx.rank)), peer)
    got = torch.zeros(3)
    dist.recv(got, (ctx.rank - 1) % ctx.world_size)
    send.wait()
    group = dist.new_group([0, 1])
    # both ranks finish the group's connections before either exits (a rank that returned
    # first closed its end while the other was still connecting: "Connection closed by peer")
    dist.barrier(group=group)
    out = []
    for c in psutil.Process().net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN or (c.type == 2 and c.laddr):  # 2: SOCK_DGRAM
            out.append((c.laddr.ip, c.laddr.port, c.status))
    dist.barrier()  # listed while every socket of the peer is still open
    return out


DRIVER = """
import signal
import sys
# a shell starts a job with Ctrl-C's default handling; the test runner's process may pass on
# a blocked or ignored SIGINT (seen only in the full suite: SIGTERM and SIGHUP stopped the run,
# SIGINT did not)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
signal.signal(signal.SIGINT, signal.default_int_handler)
from outcore.errors import OutcoreError
from outcore.runtime import launch
from outcore.runtime.launch import run_local
from tests.runtime.test_lifetime import sleeper
try:
    run_local(sleeper, 2, (sys.argv[1],), timeout_s=30)
except OutcoreError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(e.exit_code)
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL",
                                 pytest.param("SIGHUP", marks=pytest.mark.slow),
                                 pytest.param("SIGINT", marks=pytest.mark.slow)])
def test_workers_end_with_the_main_process(tmp_path, sig):
    """A batch scheduler (SIGTERM), a closed terminal (SIGHUP), Ctrl-C (SIGINT) or the OOM
    killer (SIGKILL) ends the main process: every worker ends within seconds too."""
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH",
                                                                                 ""))
    main = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)], env=env,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("rank*"))) < 2:
            assert main.poll() is None, main.stderr.read()
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.2)
        time.sleep(0.5)
        pids = [int(p.read_text()) for p in sorted(tmp_path.glob("rank*"))]
        os.kill(main.pid, getattr(signal, sig))
        try:
            code = main.wait(timeout=60)  # 30 s was once exceeded on a loaded machine
        except subprocess.TimeoutExpired:
            masks = [line for line in Path(f"/proc/{main.pid}/status").read_text().splitlines()
                     if line.startswith(("SigBlk", "SigIgn", "SigCgt", "State"))]
            raise AssertionError(f"the main process outlived {sig} by 60 s: {masks}") from None
        signum = int(getattr(signal, sig))
        if sig == "SIGKILL":
            assert code == -signum
        else:  # a clean stop: one line naming the signal, the shell's exit code for it
            err = main.stderr.read()
            assert code == 128 + signum, err
            assert f"stopped by {sig}" in err and "Traceback" not in err, err
        deadline = time.monotonic() + 15
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(_gone(p) for p in pids), f"orphan workers after {sig}: {pids}"
        left = glob.glob(os.path.join(tempfile.gettempdir(),
                                      f"{launch.RENDEZVOUS_PREFIX}{main.pid}-*"))
        if sig == "SIGKILL":  # the launcher could not clean up; the next run's sweep does
            assert left, "no rendezvous directory of the killed launcher: nothing tested"
            assert set(left) <= set(launch.sweep_rendezvous())
        assert not glob.glob(os.path.join(tempfile.gettempdir(),
                                          f"{launch.RENDEZVOUS_PREFIX}{main.pid}-*")), \
            f"rendezvous directory left after {sig}"
    finally:
        if main.poll() is None:
            main.kill()
            main.wait(timeout=10)


def test_local_workers_listen_on_loopback_only():
    """No rendezvous port on the network (FileStore), gloo's own sockets on loopback only."""
    found = run_local(listeners, 2, timeout_s=60)
    for rank, socks in enumerate(found):
        assert socks, "gloo opened no listening socket: this test would not see one"
        off = [s for s in socks if not ipaddress.ip_address(s[0].split("%")[0]).is_loopback]
        assert not off, f"rank {rank} listens off loopback: {off}"
    mine = [c for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN]
    assert not mine, f"the launching process listens: {mine}"


def _cfg(**kw) -> TrainConfig:
    return TrainConfig.make(model="outcore:mlp", batch_size=4, microbatches=2, steps=2,
                            track_memory=False, **kw)


def test_a_second_writer_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    held = ckpt_trust.acquire(ckpt)  # this test process plays the job already writing it
    try:
        cfg = _cfg(checkpoint_dir=str(ckpt), checkpoint_every=1)
        graph_doc, plan_doc, _ = docs_for(cfg, lambda g: chunks(g, 2), 2)
        with pytest.raises(CheckpointError) as err:
            run_local(train_worker, 2, (cfg, graph_doc, plan_doc), timeout_s=30)
        msg = str(err.value)
        assert f"pid {os.getpid()}" in msg and "being written by another job" in msg, msg
        assert not list(ckpt.glob("step_*")), "the refused job wrote a checkpoint"
    finally:
        held.release()
    assert not (ckpt / "LOCK").exists()


def test_a_stale_lock_is_taken_over(tmp_path, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    folder = tmp_path / "ckpt"
    folder.mkdir(mode=0o700)
    (folder / "LOCK").write_text(json.dumps({"host": os.uname().nodename, "pid": dead.pid}))
    with caplog.at_level("WARNING"):
        lock = ckpt_trust.acquire(folder)
    assert "stale lock" in caplog.text and str(dead.pid) in caplog.text
    assert json.loads((folder / "LOCK").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (folder / "LOCK").exists()


def test_a_lock_of_another_host_is_respected(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir(mode=0o700)
    (folder / "LOCK").write_text(json.dumps({"host": "elsewhere", "pid": 1}))
    with pytest.raises(CheckpointError, match="pid 1 on elsewhere"):
        ckpt_trust.acquire(folder)


def test_a_run_without_conflicts_releases_its_lock(tmp_path):
    ckpt = tmp_path / "ckpt"
    cfg = _cfg(checkpoint_dir=str(ckpt), checkpoint_every=2)
    graph_doc, plan_doc, _ = docs_for(cfg, lambda g: chunks(g, 2), 2)
    run_local(train_worker, 2, (cfg, graph_doc, plan_doc), timeout_s=30)
    assert (ckpt / "step_2" / "COMPLETE").exists() and not (ckpt / "LOCK").exists()
    assert isinstance(CheckpointError("x"), RuntimeFailure)


def who(ctx, name: str) -> tuple[int, str | None]:
    """Worker: its parent process and the value of environment variable ``name``."""
    return os.getppid(), os.environ.get(name)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork server: Linux here")
def test_workers_come_from_the_fork_server_with_the_launch_time_environment(monkeypatch):
    """Workers are forked by the fork server (not spawned by this process), and see the
    launcher's environment as it is at each launch, not as it was when the server started."""
    monkeypatch.delenv("OUTCORE_START", raising=False)
    run_local(who, 2, ("OUTCORE_TEST_MARK",), timeout_s=60)  # the server is up after this
    monkeypatch.setenv("OUTCORE_TEST_MARK", "second launch")
    found = run_local(who, 2, ("OUTCORE_TEST_MARK",), timeout_s=60)
    assert [value for _, value in found] == ["second launch"] * 2
    assert all(parent != os.getpid() for parent, _ in found), found
    monkeypatch.setenv("OUTCORE_START", "spawn")
    assert [parent for parent, _ in run_local(who, 2, ("X",), timeout_s=60)] == [os.getpid()] * 2


def shout(ctx) -> None:
    """Worker: one line on its standard error."""
    print(f"rank {ctx.rank} was here", file=sys.stderr, flush=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork server: Linux here")
def test_workers_write_where_the_launchers_streams_point_at_the_launch(tmp_path):
    """A fork server started while standard error went elsewhere: its workers still write to
    the launcher's standard error of the launch (a log file, a test's capture)."""
    run_local(who, 2, ("X",), timeout_s=60)  # the server is up, started with the old stream
    saved = os.dup(2)
    log = open(tmp_path / "stderr.log", "w")
    try:
        os.dup2(log.fileno(), 2)
        run_local(shout, 2, timeout_s=60)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        log.close()
    text = (tmp_path / "stderr.log").read_text()
    assert "rank 0 was here" in text and "rank 1 was here" in text, text


@pytest.fixture
def server_per_launch(monkeypatch):
    """The fork server as a user's process has it (ended by each launch); afterwards the
    suite's kept server is up again, so later tests find it among the children they had."""
    from outcore.runtime import launch
    monkeypatch.setattr(launch, "KEEP_FORK_SERVER", False)
    monkeypatch.delenv("OUTCORE_START", raising=False)
    yield launch
    monkeypatch.undo()
    launch._launch_ended(launch._start_context())


def test_no_process_outlives_a_launch(server_per_launch):
    """Outside the test suite (which keeps it between launches) the fork server ends with the
    launch: afterwards this process has no child but multiprocessing's resource tracker."""
    assert run_local(who, 2, ("X",), timeout_s=60)
    left = []
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() != psutil.STATUS_ZOMBIE and \
                    "resource_tracker" not in " ".join(c.cmdline()):
                left.append((c.pid, " ".join(c.cmdline())[:80]))
        except psutil.NoSuchProcess:
            pass
    assert not left, left


def test_workers_are_spawned_when_no_fork_server_can_start(server_per_launch, monkeypatch,
                                                          caplog):
    """A fork server that cannot start (its socket's path too long for a deep temporary
    folder, say) is said once, and the workers are spawned instead."""
    from multiprocessing import forkserver

    server_per_launch.stop_fork_server()

    def refuse() -> None:
        raise OSError("AF_UNIX path too long")
    monkeypatch.setattr(forkserver, "ensure_running", refuse)
    with caplog.at_level("WARNING", logger="outcore.runtime.launch"):
        found = run_local(who, 2, ("X",), timeout_s=60)
    assert [parent for parent, _ in found] == [os.getpid()] * 2  # spawned by this process
    assert "cannot start a fork server" in caplog.text


def test_launches_side_by_side_share_the_fork_server(server_per_launch):
    """Two threads launch at once: the first to end does not stop the server under the other
    (each launch is counted from before the server is asked for), and the last one stops it."""
    import threading
    from multiprocessing import forkserver

    launch = server_per_launch
    found: dict[int, object] = {}

    def one(k: int) -> None:
        try:
            found[k] = run_local(who, 2, ("X",), timeout_s=60)
        except Exception as e:  # reported below
            found[k] = e
    threads = [threading.Thread(target=one, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(isinstance(found.get(k), list) and len(found[k]) == 2 for k in range(2)), found
    assert launch._active == 0 and forkserver._forkserver._forkserver_pid is None
