"""Process lifetime: workers die with the process that started them, and the main process turns
SIGTERM and SIGHUP into the same clean stop as Ctrl-C (SIGINT).

A batch scheduler ends a job with SIGTERM, a closed terminal sends SIGHUP, and the OOM killer
sends SIGKILL, which cannot be caught. So a worker does not rely on its parent to stop it:

* on Linux it asks the kernel to send it SIGKILL when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``, as torch.multiprocessing's and Chromium's launchers do), and
* on every platform a daemon thread checks once a second that its parent is still its parent
  (``os.getppid()`` changes when the parent dies and the worker is re-parented), and ends the
  worker when it is not.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
from typing import Iterator

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def die_with_parent(parent_pid: int, check_every_s: float = 1.0) -> None:
    """End this process (SIGKILL on Linux, ``os._exit`` elsewhere) when ``parent_pid`` (the
    process that launched it) dies, or the process that started it: a worker forked by a fork
    server is the server's child, and the server ends when the launcher does.

    Call first thing in a worker. If the launcher is already gone, exits at once."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
                log.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        except OSError as e:  # no libc to load: the watchdog below still works
            log.debug("cannot load libc for prctl: %s", e)
    starter = os.getppid()

    def orphaned() -> bool:
        return os.getppid() != starter or not process_exists(parent_pid)

    if orphaned():  # the launcher died before prctl took effect
        os._exit(1)

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(check_every_s):
            if orphaned():
                os._exit(1)

    threading.Thread(target=watch, name="outcore-parent-watch", daemon=True).start()


def process_exists(pid: int) -> bool:
    """Whether process ``pid`` exists, this user's or another's (a zombie does: its children
    were re-parented already)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Stop(KeyboardInterrupt):
    """Raised in the main thread when a stop signal arrives; carries the signal number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`KeyboardInterrupt` in the main
    thread like SIGINT does (subclass ``_Stop`` with the signal number), so one ``except
    KeyboardInterrupt`` stops the workers for all three. Outside the main thread: no change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise _Stop(signum)

    saved = {}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            saved[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def signal_number(exc: BaseException) -> int:
    """The signal a :class:`KeyboardInterrupt` stands for (SIGINT when not known)."""
    return getattr(exc, "signum", int(signal.SIGINT))
