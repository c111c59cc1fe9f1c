"""Shared test set-up: one thread per process, no leftover process groups or environment."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _restore_environment():
    """Tests may set environment variables (rank, world size); put them back afterwards."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    try:
        import torch
    except ImportError:  # pure-python parts need no torch
        yield
        return
    torch.set_num_threads(1)
    yield
