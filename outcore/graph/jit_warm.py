"""Compile kernels into numba's cache in the background (started by :mod:`outcore.graph.jit`).

``python -m outcore.graph.jit_warm LIST`` reads a pickled list of ``(module, kernel name,
argument types)``, compiles each kernel for those types (numba writes the cache) and removes
the list. It runs at low priority, and only one runs at a time: a second one finds the lock
held and leaves the list to the next run's warm-up.
"""

from __future__ import annotations

import fcntl
import importlib
import os
import pickle
import sys
import tempfile


def warm(path: str) -> int:
    """Compile what ``path`` lists; the number of kernels compiled."""
    try:
        with open(path, "rb") as f:
            wanted = pickle.load(f)
    finally:
        os.unlink(path)
    lock = os.path.join(tempfile.gettempdir(), f"outcore-jit-warm-{os.getuid()}.lock")
    with open(lock, "w") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0
        done = 0
        for module, name, sig in wanted:
            kernel = getattr(importlib.import_module(module), name)
            kernel.compile(tuple(sig))
            done += 1
        return done


def running(cache_dir: str) -> list:
    """The background compiles now running into numba cache ``cache_dir`` (their
    ``NUMBA_CACHE_DIR``), as ``psutil`` processes: for tests and benchmarks that wait for one
    (psutil comes with the ``[test]`` extra)."""
    import psutil
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if __spec__.name in " ".join(proc.info["cmdline"] or []) and \
                    proc.environ().get("NUMBA_CACHE_DIR") == str(cache_dir):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


if __name__ == "__main__":
    try:
        os.nice(10)
    except OSError:
        pass
    warm(sys.argv[1])
