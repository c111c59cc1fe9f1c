"""Run a function on K local worker processes joined by torch.distributed, or inside the job
this process is already part of (torchrun, mpirun, srun).

Local workers are forked from a fork server that imported torch and outcore's runtime once
(``spawn`` where there is none, or with ``OUTCORE_START=spawn``): one import of torch per launch
instead of one per worker (4 workers on 2 cores start in 3.0 s instead of 6.6 s), and none for
further launches while :data:`KEEP_FORK_SERVER` keeps the server (0.1 s; the server otherwise
ends with each launch, so nothing outlives a run). They run with the launching process's
environment and standard streams as they are at the launch, meet through a ``FileStore`` in a
private temporary directory (mode 0700: no rendezvous port on the network), talk over the
loopback interface only (gloo and NCCL sockets bound to ``lo``), use gloo on CPU and NCCL on
GPUs (one GPU per worker), run with one thread each unless told otherwise, and are torn down
whatever happens: when a worker fails, the others are stopped within ``grace_s`` seconds and
the error names the rank and what it was doing (workers that could not connect while joining
the process group, before any of the function ran, are started once more:
:data:`JOIN_RETRIES`); when the main process is stopped (SIGINT,
SIGTERM, SIGHUP) or killed, every worker ends too (:mod:`outcore.runtime.lifetime`).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import outcore.errors as errors_mod
from outcore.core.env import JobEnv, detect
from outcore.errors import Interrupted, LaunchError, OutcoreError, UsageError
from outcore.hardware.allocator import keep_heap
from outcore.runtime import lifetime
from outcore.runtime.failures import (
    JOINING,
    RUNNING,
    failure,
    join_failed,
    silent_death,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    launcher: str


def _backend() -> str:
    import torch
    return "nccl" if torch.cuda.is_available() and torch.distributed.is_nccl_available() \
        else "gloo"


def check_gpus(workers: int) -> None:
    """Refuse ``workers`` local workers on a machine with fewer GPUs, before any starts: NCCL
    gives each worker a GPU of its own (two on one fail with "invalid usage")."""
    import torch
    if _backend() != "nccl":
        return
    have = torch.cuda.device_count()
    if workers > have:
        raise UsageError(f"{workers} workers need {workers} GPUs, one each, and this machine has "
                         f"{have}: pass --devices {have} (or fewer), or run the workers on the "
                         "CPU with CUDA_VISIBLE_DEVICES=\"\"")


def init_distributed(env: JobEnv, timeout_s: float, threads: int | None,
                     init_method: str | None = None) -> WorkerContext:
    """Join the process group described by ``env`` (sets the device and thread count);
    ``init_method`` overrides the rendezvous (default ``tcp://MASTER_ADDR:MASTER_PORT``)."""
    import torch
    import torch.distributed as dist

    backend = _backend()
    keep_heap()  # as the profiler measured the costs (outcore.hardware.allocator)
    if threads:
        torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    if init_method is None:
        os.environ.setdefault("MASTER_ADDR", env.master_addr)
        os.environ.setdefault("MASTER_PORT", str(env.master_port))
        init_method = f"tcp://{env.master_addr}:{env.master_port}"
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                                init_method=init_method, timeout=timedelta(seconds=timeout_s))
    return WorkerContext(env.rank, env.world_size, env.local_rank, backend, env.launcher)


def loopback_interface() -> str:
    """Name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS/BSD)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):
        names = []
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return "lo0" if sys.platform == "darwin" else "lo"


# what every worker imports, imported once by the fork server (none of it touches CUDA: a
# process that initialised CUDA cannot fork workers that use it)
PRELOAD = ["torch", "torch.distributed", "outcore.runtime.worker"]
START_ENV = "OUTCORE_START"


# keep the fork server between launches (the test suite does: each launch then forks at once);
# by default it ends with the launch, so no process of outcore's outlives a run
KEEP_FORK_SERVER = False
_active = 0  # launches under way in this process (threads may launch side by side)
_active_lock = threading.Lock()


def _start_context() -> Any:
    """The multiprocessing context a launch starts its workers in, the launch counted (end
    it with :func:`_launch_ended`): a fork server with :data:`PRELOAD` imported where the
    platform has one and it starts, else (or with ``OUTCORE_START=spawn``) spawn."""
    global _active
    method = os.environ.get(START_ENV, "").lower() or "forkserver"
    if method not in ("forkserver", "spawn"):
        raise errors_mod.UsageError(f"{START_ENV}={method!r}: use forkserver or spawn")
    with _active_lock:  # counted before another launch's end could stop the server
        _active += 1
        if method == "forkserver" and "forkserver" in mp.get_all_start_methods():
            from multiprocessing import forkserver
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)  # read when the server starts (once)
            try:
                forkserver.ensure_running()  # the server starts now, or says why it cannot
                return ctx
            except OSError as e:  # e.g. a temporary folder whose socket path is too long
                log.warning("cannot start a fork server (%s); spawning the workers", e)
        return mp.get_context("spawn")


def _launch_ended(ctx: Any) -> None:
    """Count a launch of :func:`_start_context` ended; the last to end stops the fork server
    unless :data:`KEEP_FORK_SERVER`."""
    global _active
    with _active_lock:
        _active -= 1
        if not KEEP_FORK_SERVER and ctx.get_start_method() == "forkserver":
            _stop_server()


def stop_fork_server() -> None:
    """Stop this process's fork server, if it runs and no launch is under way."""
    with _active_lock:
        _stop_server()


def _stop_server() -> None:
    if _active:
        return
    from multiprocessing import forkserver
    stop = getattr(forkserver._forkserver, "_stop", None)  # CPython 3.8-3.14
    if stop is not None:
        try:
            stop()
        except OSError as e:  # already gone: nothing to stop
            log.debug("stopping the fork server: %s", e)


class _StdStreams:
    """The launcher's standard output and error as they are at the launch, handed to a worker
    (pickled with its arguments, the descriptors sent along): a fork server's workers would
    otherwise write where the launcher's streams pointed when the server started (a test
    capturing them, a file since closed)."""

    def __reduce__(self) -> tuple:
        from multiprocessing.reduction import DupFd
        return _StdStreams._received, tuple(DupFd(fd) if _is_open(fd) else None
                                            for fd in (1, 2))

    @staticmethod
    def _received(*dups: Any) -> tuple[int | None, ...]:
        return tuple(d.detach() if d is not None else None for d in dups)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _std_streams(ctx: Any) -> _StdStreams | None:
    return _StdStreams() if ctx.get_start_method() == "forkserver" else None


def _use_streams(fds: tuple[int | None, ...] | None) -> None:
    """Point this worker's standard output and error where the launcher's point."""
    for mine, theirs in zip((1, 2), fds or ()):
        if theirs is not None and theirs != mine:
            (sys.stdout if mine == 1 else sys.stderr).flush()
            os.dup2(theirs, mine)
            os.close(theirs)


def _worker(rank: int, world: int, store: str, parent_pid: int, fn: Callable[..., Any],
            args: tuple, results: Any, timeout_s: float, threads: int | None,
            log_level: int = logging.WARNING, environ: dict[str, str] | None = None,
            streams: tuple[int | None, ...] | None = None) -> None:
    lifetime.die_with_parent(parent_pid)
    _use_streams(streams)
    if environ is not None:  # a fork server's workers: the launcher's environment of now
        os.environ.clear()
        os.environ.update(environ)
    import torch.distributed as dist

    _worker_logging(rank, log_level)
    _thread_lock_for_progress_bars()
    lo = loopback_interface()  # local workers' sockets listen on loopback only
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world),
                       "GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo,
                       "OUTCORE_LOCAL_WORKER": "1"})
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)
    stage = JOINING
    try:
        env = JobEnv("local", rank, world, rank, "127.0.0.1", 0)
        ctx = init_distributed(env, timeout_s, threads, init_method=f"file://{store}")
        stage = RUNNING
        out = fn(ctx, *args)
        results.put((rank, "ok", _pack(out)))
    except BaseException as e:  # report everything to the launcher, then exit non-zero
        # first line: the error; then the worker's traceback (shown by ``--debug``)
        msg = f"{e}\n{traceback.format_exc()}" if isinstance(e, OutcoreError) else \
            f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        try:
            results.put((rank, "error", (msg, type(e).__name__, stage)))
            results.close()
            results.join_thread()  # flush the message before dying
        finally:
            os._exit(1)
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # best effort on the way out
                pass


def _thread_lock_for_progress_bars() -> None:
    """Give tqdm a thread lock before torch.fx's interpreter makes its progress bar: tqdm's own
    default holds a multiprocessing semaphore, which a worker that stops on an error (its
    ``os._exit``) or is stopped (SIGTERM) leaves registered, and Python's resource tracker then
    warns about a "leaked semaphore" after the run's error line."""
    try:
        from tqdm import tqdm
    except ImportError:  # torch.fx then draws no progress bar
        return
    if "_lock" not in vars(tqdm):
        tqdm.set_lock(threading.RLock())


def _worker_logging(rank: int, level: int) -> None:
    """Worker log lines go to stderr, prefixed with the rank, at the launcher's level."""
    logger = logging.getLogger("outcore")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"rank {rank}: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def run_local(fn: Callable[..., Any], world_size: int, args: tuple = (), *,
              timeout_s: float = 60.0, threads: int | None = 1, grace_s: float = 5.0,
              poll: Callable[[], None] | None = None, overall_timeout_s: float | None = None
              ) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``world_size`` spawned local workers; return their results.

    Args:
        fn: a picklable module-level function; ``ctx`` is a :class:`WorkerContext`.
        world_size: number of workers.
        timeout_s: timeout of the process group (every collective and receive).
        threads: torch threads per worker (None: torch's default).
        grace_s: time the other workers get to stop after one failed.
        poll: called about 5 times a second while waiting (progress display).
        overall_timeout_s: stop everything if the run takes longer than this.

    Raises :class:`RuntimeFailure` naming the first rank that failed and its error.
    """
    if world_size < 1:
        raise LaunchError(f"need at least one worker, got {world_size}")
    check_gpus(world_size)
    _check_main_guard()
    ctx = _start_context()  # counts this launch: the fork server stays while it runs
    try:
        return _run_workers(ctx, fn, world_size, args, timeout_s, threads, grace_s, poll,
                            overall_timeout_s)
    finally:
        _launch_ended(ctx)


# a launch whose workers all failed to join the process group over a dropped connection
# starts them again this many times (fresh rendezvous): gloo's full-mesh connect between local
# processes fails now and then ("Connection closed by peer", once in about five test-suite
# runs here, with two launches side by side); nothing of the user's function has run yet
JOIN_RETRIES = 1


def _run_workers(ctx: Any, fn: Callable[..., Any], world_size: int, args: tuple,
                 timeout_s: float, threads: int | None, grace_s: float,
                 poll: Callable[[], None] | None, overall_timeout_s: float | None
                 ) -> list[Any]:
    """:func:`run_local`'s workers, started in ``ctx``, waited for and torn down; started
    again when they could not join (:data:`JOIN_RETRIES`)."""
    run = (ctx, fn, world_size, args, timeout_s, threads, grace_s, poll, overall_timeout_s)
    for _ in range(JOIN_RETRIES):
        try:
            return _attempt(*run, retry=True)
        except _JoinFailed as e:
            log.warning("%s; starting the %d workers again", e, world_size)
    return _attempt(*run, retry=False)  # the last start raises the run's own error


# a local run's rendezvous directory (its FileStore) in the temporary directory, named by the
# launching process: "outcore-rdzv-<pid>-<random>"
RENDEZVOUS_PREFIX = "outcore-rdzv-"


def sweep_rendezvous(tmp: str | None = None) -> list[str]:
    """Remove the rendezvous directories of local runs whose launcher is gone, and return
    them. A launcher removes its own when the run ends, but one the OOM killer or ``kill -9``
    ended cannot (its workers die with it: :func:`lifetime.die_with_parent`); the next local
    run removes what it left. Only this user's directories, named by a process id that no
    longer exists (one whose id was reused stays until that process ends)."""
    tmp = tmp or tempfile.gettempdir()
    uid = os.getuid() if hasattr(os, "getuid") else None
    gone = []
    try:
        entries = os.scandir(tmp)
    except OSError:
        return gone
    with entries:
        for e in entries:
            pid = e.name[len(RENDEZVOUS_PREFIX):].split("-")[0]
            if not (e.name.startswith(RENDEZVOUS_PREFIX) and pid.isdigit()):
                continue
            try:
                if not e.is_dir(follow_symlinks=False) or \
                        (uid is not None and e.stat().st_uid != uid):
                    continue
            except OSError:
                continue
            if not lifetime.process_exists(int(pid)):
                shutil.rmtree(e.path, ignore_errors=True)
                gone.append(e.path)
    return gone


class _JoinFailed(Exception):
    """Every worker that failed did so joining the process group, over a connection."""


def _attempt(ctx: Any, fn: Callable[..., Any], world_size: int, args: tuple,
             timeout_s: float, threads: int | None, grace_s: float,
             poll: Callable[[], None] | None, overall_timeout_s: float | None, *,
             retry: bool) -> list[Any]:
    """One start of the workers; with ``retry``, raises :class:`_JoinFailed` instead of the
    run's error when they could not join (:func:`_join_failed`)."""
    results = ctx.Queue()
    sweep_rendezvous()
    # mode 0700: only this user; named by this process, which removes it when the run ends
    private = tempfile.mkdtemp(prefix=f"{RENDEZVOUS_PREFIX}{os.getpid()}-")
    level = logging.getLogger("outcore").getEffectiveLevel()
    procs = [ctx.Process(target=_worker, args=(r, world_size, os.path.join(private, "store"),
                                                os.getpid(), fn, args, results, timeout_s,
                                                threads, level, dict(os.environ),
                                                _std_streams(ctx)),
                         daemon=True)
             for r in range(world_size)]
    outputs: dict[int, Any] = {}
    errors: list[tuple[int, Any]] = []
    try:
        with lifetime.stop_signals_raise():
            for p in procs:
                p.start()
            _wait(procs, results, outputs, errors, poll, overall_timeout_s)
            if errors:
                deadline = time.monotonic() + grace_s
                while time.monotonic() < deadline and any(p.is_alive() for p in procs):
                    _drain(results, outputs, errors)
                    time.sleep(0.1)
                _drain(results, outputs, errors)
                joining = join_failed(outputs, errors) if retry else None
                if joining:
                    raise _JoinFailed(joining)
                error, cause = failure(procs, outputs, errors)
                raise error from cause
            # let finished workers exit on their own (up to ``grace_s``): a terminated worker
            # skips its exit handlers
            deadline = time.monotonic() + grace_s
            for p in procs:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        return [outputs[r] for r in range(world_size)]
    except KeyboardInterrupt as e:
        signum = lifetime.signal_number(e)
        name = signal.Signals(signum).name
        raise Interrupted(f"stopped by {name}; all {world_size} workers stopped",
                          signum) from None
    finally:
        _stop(procs)
        shutil.rmtree(private, ignore_errors=True)


def _check_main_guard() -> None:
    """Refuse to start workers from a script without a main guard. Spawned workers import the
    script that started the run (as ``__mp_main__``); one that starts the run at its top level
    would start it again in every worker, and each would die with Python's bootstrapping
    error while this process saw only "exited with code 1"."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or mp.parent_process() is not None or not str(path).endswith(".py"):
        return  # interactive, python -c, a notebook, or a worker itself
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            source = f.read()
    except OSError:
        return
    if "__main__" not in source:
        raise errors_mod.UsageError(
            f"{path} starts a run at its top level: local workers are started as new "
            "processes that import this script, so each would start the run again. Put the "
            "call under `if __name__ == \"__main__\":` (see the README's Python API)")


def _wait(procs: list[Any], results: Any, outputs: dict[int, Any],
          errors: list[tuple[int, Any]], poll: Callable[[], None] | None,
          overall_timeout_s: float | None) -> None:
    """Collect results until every worker answered or one failed."""
    started = time.monotonic()
    while len(outputs) < len(procs) and not errors:
        try:
            rank, status, value = results.get(timeout=0.2)
            if status == "ok":
                outputs[rank] = _unpack(value)
            else:
                errors.append((rank, value))
        except queue_mod.Empty:
            pass
        if poll is not None:
            poll()
        dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                and r not in outputs]
        if dead and not errors:
            _drain(results, outputs, errors)
            if not errors:
                r = dead[0]
                errors.append((r, silent_death(r, procs[r].exitcode)))
        if overall_timeout_s and time.monotonic() - started > overall_timeout_s:
            errors.append((-1, f"the run took longer than {overall_timeout_s:.0f} s"))


def _drain(results: Any, outputs: dict[int, Any], errors: list[tuple[int, str]]) -> None:
    while True:
        try:
            rank, status, value = results.get_nowait()
        except (queue_mod.Empty, OSError, ValueError):
            return
        if status == "ok":
            outputs[rank] = _unpack(value)
        else:
            errors.append((rank, value))


def _pack(value: Any) -> bytes:
    """Serialise a worker's result (tensors by value: shared-memory handles die with it)."""
    import io

    import torch
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _unpack(data: bytes) -> Any:
    import io

    import torch
    return torch.load(io.BytesIO(data), weights_only=False)


def _stop(procs: list[Any]) -> None:
    # a worker that never started (start() failed: e.g. spawned from a script without an
    # ``if __name__ == "__main__":`` guard) has nothing to stop, and joining it would raise
    # over the error that stopped the launch
    procs = [p for p in procs if p.pid is not None]
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join(timeout=5)


def run_in_job(fn: Callable[..., Any], args: tuple = (), *, timeout_s: float = 60.0,
               threads: int | None = None) -> Any:
    """Run ``fn(ctx, *args)`` in the job this process belongs to (torchrun/mpirun/srun)."""
    env = detect()
    if env.launcher == "none":
        raise LaunchError("not started by torchrun, mpirun or srun: use run_local")
    ctx = init_distributed(env, timeout_s, threads)
    import torch.distributed as dist
    try:
        out = fn(ctx, *args)
        _barrier_before_teardown(dist)
        return out
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _barrier_before_teardown(dist: Any) -> None:
    """Every rank reaches the end before any tears its process group down (a rank that destroys
    its group while a peer is still inside a collective with it can abort at exit)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        try:
            dist.barrier()
        except RuntimeError as e:  # the work is done; say why the ending was not clean
            log.warning("ranks did not meet before ending: %s", str(e).splitlines()[0])
