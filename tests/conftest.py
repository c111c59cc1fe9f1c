"""Shared test set-up: one thread per process, no leftover process groups or environment."""

from __future__ import annotations

import os

import pytest

# one thread per process (torch reads this when it is first imported); pure-python suites
# never import torch at all
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# plans of local jobs do not depend on how busy the machine is while the suite runs (the
# local cluster otherwise counts other processes' load: outcore.core.env.background_load)
os.environ.setdefault("OUTCORE_HOST_LOAD", "0")
# the suite runs the numba kernels compiled, as a machine with a warm cache does: a test process
# lives long enough to pay for compiling (tests/graph/test_jit_tiers.py checks the default way:
# Python until compiling pays, and the background compile, which never starts here)
os.environ.setdefault("OUTCORE_JIT", "always")
os.environ.setdefault("OUTCORE_JIT_WARM", "0")


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests run only where CUDA is (torch is imported only then)."""
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_environment():
    """Tests may set environment variables (rank, world size); put them back afterwards."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(scope="session", autouse=True)
def _warm_fork_server():
    """Local workers fork from one fork server kept for the whole session (each launch then
    starts its workers at once, not after importing torch: the suite took 17.7 min without)."""
    from outcore.runtime import launch
    launch.KEEP_FORK_SERVER = True
    # started before any test: a test comparing this process's children before and after a
    # run sees the server among the "before" (its imports overlap the collection)
    launch._launch_ended(launch._start_context())
    yield
    launch.KEEP_FORK_SERVER = False
    launch.stop_fork_server()
